"""The rule catalogue: every rule name a rule list may use, with its parameters, types, defaults and bounds.

One catalogue serves both sides of a rule list (docs/contracts.md section 3): the workflow checks
an execution input against it at ValidateInput, before anything is launched, and the rule engine in
the job converts the same list with the same function, so what the input accepts is exactly what
the engine runs. Names, parameters and defaults are those of SageMaker Debugger's "List of built-in
rules" and "List of built-in profiler rules" guides; where the guide gives valid values
("0.0 < float < 100", "0 <= float <= 1", "Integer >= 2") they are the bounds here. Where it gives
none, the bounds are the values that mean something (a percentage lies in [0, 100], a count is
at least 1, a threshold of a magnitude is not negative).

``NotLearning`` and ``Diverging`` (``SENTINEL_CHECKS``) are not Debugger's: an entry of either name
carries thresholds of the sentinel's own checks (docs/rules.md), and Debugger never receives it.

Each entry says where it runs: ``engine`` (the open rule engine: the in-job sentinel and the
out-of-job evaluator run it) or ``debugger`` (only SageMaker Debugger runs it; a rule list may name it
only where Debugger rules are enabled). ``family`` is ``tensor`` (Debugger's ``Rule``, reads captured
tensors) or ``profiler`` (Debugger's ``ProfilerRule``, reads system metrics).

This module is pure Python with no third-party import: it is part of ``stabilizer_contract``,
which the Lambda asset build copies into the asset and the job's library channel carries beside
``stabilizer_sentinel``. It must not import NumPy, torch or anything of the rule engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stabilizer_contract.parameters import (
    DEBUGGER,
    DIVERGING,
    ENGINE,
    MAX_RULES,
    NOT_LEARNING,
    PARAMETER_TEXT_MAX,
    PROFILER,
    SCAN,
    SELECTION,
    SENTINEL_CHECKS,
    TENSOR,
    Param,
    RuleConfigError,
    RuleEntry,
    percent,
    selection,
)

# Debugger's RuleParameters keys the catalogue reads itself: a rule's actions, a custom rule's file and class.
ACTION_KEY = "action_json"
SOURCE_KEY = "source_s3_uri"
INVOKE_KEY = "rule_to_invoke"

# What the catalogue's readers import from here (the vocabulary lives in `parameters`).
__all__ = [
    "ACTION_KEY",
    "CATALOGUE",
    "DEBUGGER",
    "DEBUGGER_ONLY_RULES",
    "DIVERGING",
    "ENGINE",
    "ENGINE_RULES",
    "INVOKE_KEY",
    "MAX_RULES",
    "NOT_LEARNING",
    "PARAMETER_TEXT_MAX",
    "PROFILER",
    "SENTINEL_CHECKS",
    "SOURCE_KEY",
    "TENSOR",
    "CheckedRule",
    "Param",
    "RuleConfigError",
    "RuleEntry",
    "check_parameters",
    "check_rule",
    "check_rule_list",
    "rule_items",
    "split_entry",
]

# The guide's defaults, parameter by parameter. Comments mark where the guide and Debugger's own
# code (smdebug's profiler rules, public until 2020) disagree; the guide wins.
_ENTRIES = (
    RuleEntry("ExplodingTensor", (*selection(), Param("only_nan", "bool", False)),
              summary="a tensor holds NaN (or infinity unless only_nan)"),
    RuleEntry("VanishingGradient", (Param("threshold", "float", 1e-7, low=0),),
              summary="the mean absolute value of a gradient falls below threshold"),
    RuleEntry("LossNotDecreasing", (
        *selection(),
        Param("use_losses_collection", "bool", True),
        Param("num_steps", "int", 10, low=1),
        # The guide says 0.0 < diff_percent < 100; 0 (any decrease will do) is accepted as well.
        Param("diff_percent", "float", 0.1, low=0, high=100, high_open=True),
        Param("increase_threshold_percent", "float", 5.0, low=0, high=100, low_open=True, high_open=True),
        Param("mode", "choice", None, optional=True, choices=("EVAL", "TRAIN", "GLOBAL")),
    ), summary="the loss did not fall by diff_percent over num_steps"),
    RuleEntry("Overfit", (
        Param("tensor_regex", "regex_list", None, optional=True),
        Param("start_step", "int", 0, low=0),
        Param("patience", "int", 1, low=1),
        Param("ratio_threshold", "float", 0.1, low=0),
    ), summary="validation loss exceeds training loss by ratio_threshold for patience evaluations"),
    RuleEntry("WeightUpdateRatio", (
        Param("num_steps", "int", None, optional=True, low=1),
        Param("large_threshold", "float", 10.0, low=0),
        Param("small_threshold", "float", 1e-8, low=0),
        Param("epsilon", "float", 1e-9, low=0),
    ), summary="update/weight ratio leaves [small_threshold, large_threshold]"),
    RuleEntry("AllZero", (*selection(), percent("threshold", 100.0)), one_of=(SELECTION,),
              summary="threshold percent of a tensor's values are zero"),
    RuleEntry("UnchangedTensor", (
        *selection(),
        Param("num_steps", "int", 3, low=2),
        Param("rtol", "float", 1e-5, low=0),
        Param("atol", "float", 1e-8, low=0),
        Param("equal_nan", "bool", False),
    ), one_of=(SELECTION,), summary="a tensor did not change over its last num_steps saved values"),
    RuleEntry("ClassImbalance", (
        Param("threshold_imbalance", "float", 10.0, low=1),
        Param("threshold_misprediction", "float", 0.7, low=0, high=1),
        Param("samples", "int", 500, low=1),
        Param("argmax", "bool", False),
        Param("labels_regex", "regex", ".*labels"),
        Param("predictions_regex", "regex", ".*predictions"),
    ), summary="class counts differ by threshold_imbalance or a class is mostly mispredicted"),
    RuleEntry("DeadRelu", (
        Param("tensor_regex", "regex_list", ".*relu_output", optional=True),
        percent("threshold_inactivity", 1.0),
        percent("threshold_layer", 50.0),
    ), summary="more than threshold_layer percent of a layer's units are inactive"),
    RuleEntry("PoorWeightInitialization", (
        Param("activation_inputs_regex", "regex_list", ".*relu_input", optional=True),
        Param("threshold", "float", 10.0, low=1),
        Param("distribution_range", "float", 0.001, low=0),
        Param("patience", "int", 5, low=1),
        # "Valid values: Float" in the guide; it counts steps, so a whole number is required.
        Param("steps", "int", 10, low=1),
    ), summary="activation-input variances differ across layers, gradients are narrow, or the loss is flat"),
    RuleEntry("SaturatedActivation", (
        *selection(".*tanh_input|.*sigmoid_input"),
        Param("threshold_tanh_min", "float", -9.4999),
        Param("threshold_tanh_max", "float", 9.4999),
        Param("threshold_sigmoid_min", "float", -23.0),
        Param("threshold_sigmoid_max", "float", 16.99999),
        percent("threshold_inactivity", 1.0),
        percent("threshold_layer", 50.0),
    ), summary="more than threshold_layer percent of a tanh/sigmoid layer's units are saturated"),
    RuleEntry("TensorVariance", (
        *selection(),
        Param("max_threshold", "float", None, optional=True, low=0),
        Param("min_threshold", "float", None, optional=True, low=0),
    ), one_of=(SELECTION, ("max_threshold", "min_threshold")),
        summary="a tensor's variance leaves [min_threshold, max_threshold]"),
    RuleEntry("CheckInputImages", (
        Param("threshold_mean", "float", 0.2, low=0),
        Param("threshold_samples", "int", 500, low=1),
        # Debugger's default names MXNet's HybridSequential input; see docs/rules.md.
        Param("regex", "regex", ".*hybridsequential0_input_0|inputs/inputs"),
        Param("channel", "int", 1),
    ), summary="the mean of the input images differs from 0 by more than threshold_mean"),
    RuleEntry("StalledTrainingRule", (
        Param("threshold", "int", 1800, low=1),
        Param("stop_training_on_fire", "bool", False),
        Param("training_job_name_prefix", "str", None, optional=True),
    ), summary="no new tensor for threshold seconds"),
    RuleEntry("Confusion", (
        Param("category_no", "int", None, optional=True, low=2),
        Param("labels", "str", "labels"),
        Param("predictions", "str", "predictions"),
        Param("labels_collection", "str", "labels"),
        Param("predictions_collection", "str", "predictions"),
        Param("min_diag", "float", 0.9, low=0, high=1),
        Param("max_off_diag", "float", 0.1, low=0, high=1),
    ), summary="the confusion matrix's diagonal or off-diagonal ratios are out of bounds"),
    # The sentinel's own checks (not Debugger's): an entry carries their thresholds (docs/rules.md).
    RuleEntry(NOT_LEARNING, (
        Param("window", "int", 5, low=1),
        Param("patience", "int", None, optional=True, low=1),
        Param("min_decrease", "float", 0.05, low=0, high=1, high_open=True),
        Param("confidence", "float", 3.0, low=0),
        Param("patience_windows", "int", 6, low=1),
        Param("min_patience", "int", 100, low=1),
        Param("warmup_multiple", "float", 1.0, low=0),
        Param("run_fraction", "float", 0.1, low=0, high=1),
        Param("run_steps", "int", None, optional=True, low=1),
        Param("infer_phase", "bool", True),
        Param("lr_rise", "float", 1e-3, low=0),
    ), summary="sentinel check: the loss never fell below where the run started within its patience"),
    RuleEntry(DIVERGING, (
        Param("spreads", "float", 9.0, low=0, low_open=True),
        Param("noise_spreads", "float", 3.0, low=0),
        Param("persistence", "int", 3, low=1),
        Param("jump_spreads", "float", 90.0, low=0, low_open=True),
        Param("thrown_spreads", "float", 3.0, low=0, low_open=True),
        Param("relapse_spreads", "float", 1.0, low=0, low_open=True),
        Param("rising", "float", 0.5, low=0, low_open=True),
        Param("baseline", "float", None, optional=True),
        Param("scale", "float", None, optional=True, low=0, low_open=True),
    ), summary="sentinel check: the loss stayed above baseline + spreads x scale for persistence steps"),
    # Profiler rules (Debugger's ProfilerRule), over the system metrics the profiler samples.
    RuleEntry("LowGPUUtilization", (
        percent("threshold_p95", 70), percent("threshold_p5", 10),
        Param("window", "int", 500, low=1), Param("patience", "int", 1000, low=0), SCAN,
    ), family=PROFILER, summary="a GPU's 95th-percentile utilisation is low, or it fluctuates"),
    RuleEntry("CPUBottleneck", (
        percent("threshold", 50), percent("gpu_threshold", 10), percent("cpu_threshold", 90),
        # The guide says 100; smdebug's code said 1000.
        Param("patience", "int", 100, low=0), SCAN,
    ), family=PROFILER, summary="GPU idle while a CPU core is busy for more than threshold percent of samples"),
    RuleEntry("IOBottleneck", (
        # gpu_threshold: the guide says 70; smdebug's code said 10.
        percent("threshold", 50), percent("gpu_threshold", 70), percent("io_threshold", 50),
        Param("patience", "int", 1000, low=0), SCAN,
    ), family=PROFILER, summary="GPU idle while IO wait is high for more than threshold percent of samples"),
    RuleEntry("OverallSystemUsage", (SCAN,), family=PROFILER,
              summary="summarises CPU, memory, IO wait and GPU usage; never fires"),
    RuleEntry("Overtraining", (
        Param("patience_train", "int", 5, low=1), Param("patience_validation", "int", 10, low=1),
        Param("delta", "float", 0.01, low=0),
    ), summary="the training or the validation loss did not improve by delta for its patience"),
    # Debugger only: the open engine does not run these.
    RuleEntry("SimilarAcrossRuns", (Param("other_trials", "str", required=True), *selection()),
              runs_in=DEBUGGER),
    RuleEntry("NLPSequenceRatio", (
        Param("tensor_regex", "regex_list", ".*embedding0_input_0", optional=True),
        Param("token_values", "float_list", "0"),
        Param("token_thresholds_percent", "float_list", "50", low=0, high=100),
    ), runs_in=DEBUGGER),
    RuleEntry("BatchSize", (
        percent("cpu_threshold_p95", 70), percent("gpu_threshold_p95", 70),
        percent("gpu_memory_threshold_p95", 70), Param("patience", "int", 100, low=0),
        Param("window", "int", 500, low=1), SCAN,
    ), runs_in=DEBUGGER, family=PROFILER),
    RuleEntry("GPUMemoryIncrease", (
        percent("increase", 10), Param("patience", "int", 100, low=0), Param("window", "int", 500, low=1), SCAN,
    ), runs_in=DEBUGGER, family=PROFILER),
    RuleEntry("LoadBalancing", (Param("threshold", "float", 0.5, low=0), Param("patience", "int", 10, low=0), SCAN),
              runs_in=DEBUGGER, family=PROFILER),
    RuleEntry("MaxInitializationTime", (Param("threshold", "float", 20, low=0), SCAN),
              runs_in=DEBUGGER, family=PROFILER),
    RuleEntry("OverallFrameworkMetrics", (SCAN,), runs_in=DEBUGGER, family=PROFILER),
    RuleEntry("StepOutlier", (
        Param("stddev", "float", 5, low=0), Param("mode", "choice", None, optional=True, choices=("TRAIN", "EVAL")),
        Param("n_outliers", "int", 10, low=0), SCAN,
    ), runs_in=DEBUGGER, family=PROFILER),
)

CATALOGUE: dict[str, RuleEntry] = {entry.name: entry for entry in _ENTRIES}
ENGINE_RULES = tuple(name for name, entry in CATALOGUE.items() if entry.runs_in == ENGINE)
DEBUGGER_ONLY_RULES = tuple(name for name, entry in CATALOGUE.items() if entry.runs_in == DEBUGGER)


@dataclass(frozen=True)
class CheckedRule:
    """One entry of a rule list, checked: its name and its parameters converted to the rule's types."""

    name: str
    parameters: dict[str, Any]
    entry: RuleEntry | None = None
    # Debugger's actions (``action_json``): None when the rule has none.
    actions: tuple[dict[str, str], ...] | None = None
    # A user's rule in Debugger's style (``Rule.custom``): its file and class are in ``parameters``.
    custom: bool = False


def split_entry(raw: Any, where: str) -> tuple[str, dict[str, Any]]:
    """Name and raw parameters of a rule-list entry: ``{"name", "parameters"}`` or Debugger's own shape."""
    if not isinstance(raw, Mapping):
        raise RuleConfigError(f'{where}: expected an object such as {{"name": "ExplodingTensor"}}, got {raw!r}')
    if "RuleParameters" in raw or "RuleConfigurationName" in raw:  # Debugger's DebugRuleConfiguration
        params = dict(raw.get("RuleParameters") or {})
        name = (raw.get("RuleConfigurationName") if SOURCE_KEY in params
                else params.pop(INVOKE_KEY, raw.get("RuleConfigurationName")))
    else:
        unknown_keys = set(raw) - {"name", "parameters"}
        if unknown_keys:
            raise RuleConfigError(f"{where}: unknown keys {sorted(unknown_keys)}; expected 'name' and 'parameters'")
        name = raw.get("name")
        params_raw = raw.get("parameters") or {}
        if not isinstance(params_raw, Mapping):
            raise RuleConfigError(f"{where}.parameters: expected an object of parameter -> value, got {params_raw!r}")
        params = dict(params_raw)
        if SOURCE_KEY not in params:
            params.pop(INVOKE_KEY, None)
    if not isinstance(name, str) or not name:
        raise RuleConfigError(f"{where}: expected a rule name, got {name!r}")
    return name, params


def check_parameters(entry: RuleEntry, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The given parameters converted and checked against ``entry`` (defaults are not filled in)."""
    unknown = sorted(set(params) - set(entry.param_index))
    if unknown:
        raise RuleConfigError(
            f"{where}: unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"{entry.name} takes {sorted(entry.param_index)}"
        )
    missing = [p.name for p in entry.params if p.required and p.name not in params]
    if missing:
        raise RuleConfigError(f"{where}: {entry.name} needs parameter {', '.join(map(repr, missing))}")
    converted = {name: entry.param_index[name].convert(value, f"{where}.{name}") for name, value in params.items()}
    for group in entry.one_of:
        if all(converted.get(name) is None for name in group):
            raise RuleConfigError(f"{where}: specify {' or '.join(group)}")
    return converted


def check_rule(
    raw: Any, where: str = "rule", *, debugger_enabled: bool | None = None, extra: Iterable[str] = ()
) -> CheckedRule:
    """Check one rule-list entry against the catalogue.

    ``debugger_enabled``: False refuses Debugger-only rules (nothing could run them), True accepts
    them, None skips that question. ``extra`` names rules registered beyond the catalogue (custom
    rules of the engine); they are returned unchecked, for the engine to check against their code.
    """
    name, params = split_entry(raw, where)
    actions = check_actions(params.pop(ACTION_KEY, None), f"{where} ({name}).{ACTION_KEY}")
    if SOURCE_KEY in params:
        return CheckedRule(name, check_custom(name, params, f"{where} ({name})"), None, actions, custom=True)
    entry = CATALOGUE.get(name)
    if entry is None:
        if name in set(extra):
            return CheckedRule(name, params)
        raise RuleConfigError(
            f"{where}: unknown rule {name!r}; rules: {', '.join(sorted({*CATALOGUE, *extra}))}"
        )
    place = f"{where} ({name})"
    if entry.runs_in == DEBUGGER and debugger_enabled is False:
        raise RuleConfigError(
            f"{place}: only SageMaker Debugger runs {name}, and Debugger rules are not enabled in this "
            f"deployment (DEBUGGER_RULES_ENABLED); rules the open engine runs: {', '.join(ENGINE_RULES)}"
        )
    return CheckedRule(name, check_parameters(entry, params, place), entry, actions)


def check_actions(raw: Any, where: str) -> tuple[dict[str, str], ...] | None:
    """Debugger's ``action_json`` (as the SDK's ``ActionList`` serializes it): stoptraining, email, sms."""
    if raw is None:
        return None
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise RuleConfigError(f"{where}: expected a JSON list of actions, got {raw!r}") from None
    items = [items] if isinstance(items, Mapping) else items
    out = []
    for item in items if isinstance(items, list) else [None]:
        kind = str(item.get("name", "")).lower() if isinstance(item, Mapping) else ""
        if kind == "stoptraining":
            out.append({"name": kind})
        elif kind in ("email", "sms") and isinstance(item.get("endpoint"), str) and item["endpoint"]:
            out.append({"name": kind, "endpoint": item["endpoint"]})
        else:
            raise RuleConfigError(
                f"{where}: expected StopTraining, Email(address) or SMS(number) actions, got {item!r}")
    return tuple(out)


def check_custom(name: str, params: Mapping[str, Any], where: str) -> dict[str, str]:
    """A ``Rule.custom`` entry: its file (relative to the job's source), class and own string parameters."""
    if name in CATALOGUE:
        raise RuleConfigError(f"{where}: a custom rule may not take the name of the built-in rule {name}")
    if not isinstance(params.get(INVOKE_KEY), str) or not params[INVOKE_KEY]:
        raise RuleConfigError(f"{where}.{INVOKE_KEY}: name the rule class the file {params[SOURCE_KEY]!r} defines")
    source = params[SOURCE_KEY]
    if not isinstance(source, str) or not source.endswith(".py") or source.startswith(("s3://", "/")) or ".." in source:
        raise RuleConfigError(f"{where}.{SOURCE_KEY}: expected the rule's .py file, relative to the job's source "
                              f"(the client ships a local file there), got {source!r}")
    for key, value in params.items():
        if not isinstance(value, str) or len(value) > PARAMETER_TEXT_MAX:
            raise RuleConfigError(f"{where}.{key}: expected a string of at most {PARAMETER_TEXT_MAX} characters")
    return dict(params)


def check_rule_list(
    raw: Any, *, debugger_enabled: bool | None = None, extra: Iterable[str] = (), where: str = "rules"
) -> list[CheckedRule]:
    """Check a whole rule list: a JSON text or the list itself (docs/contracts.md section 3)."""
    extra = tuple(extra)
    return [
        check_rule(item, f"{where}[{i}]", debugger_enabled=debugger_enabled, extra=extra)
        for i, item in enumerate(rule_items(raw, where))
    ]


def rule_items(raw: Any, where: str = "rules") -> list[Any]:
    """The entries of a rule list given as JSON text or as the list itself; None or "" is no rules.
    Each entry is still to be checked (``check_rule``)."""
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RuleConfigError(f"{where}: expected a JSON list of rules, got {raw!r} ({exc})") from None
    if isinstance(raw, Mapping | str | bytes) or not isinstance(raw, Iterable):
        raise RuleConfigError(f'{where}: expected a list of {{"name": ..., "parameters": {{...}}}}, got {raw!r}')
    return list(raw)
