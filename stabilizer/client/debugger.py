"""An estimator's SageMaker Debugger configuration, as it is, becomes the execution input's `monitoring`.

Debugger users configure a job with the SageMaker Python SDK's objects::

    PyTorch(..., rules=[Rule.sagemaker(rule_configs.class_imbalance(), rule_parameters={...},
                                       collections_to_save=[CollectionConfig(...)],
                                       actions=rule_configs.ActionList(rule_configs.StopTraining(),
                                                                       rule_configs.Email("me@example.com"))),
                        ProfilerRule.sagemaker(rule_configs.ProfilerReport()),
                        Rule.custom(name="CheckAccuracy", source="rules/check.py",
                                    rule_to_invoke="CheckAccuracy", ...)],
            debugger_hook_config=DebuggerHookConfig(hook_parameters={...}, collection_configs=[...]),
            profiler_config=ProfilerConfig(system_monitor_interval_millis=500))

`monitoring_from_estimator` reads those attributes (never calling AWS) and returns the rule list and
capture of docs/contracts.md (sections 3 and 7) with Debugger's semantics:

- a rule keeps its name and `rule_parameters` (strings, as Debugger passes them); its `actions`
  travel as Debugger's `action_json` parameter (StopTraining stops the job; Email and SMS notify
  through the stack's SNS topic and do not stop);
- `ProfilerRule.sagemaker(ProfilerReport(...))` becomes the profiler rules the engine runs, with
  the report's `<Rule>_<parameter>` values;
- collections (the hook's and each rule's `collections_to_save`, merged as the SDK merges them)
  become capture entries: a collection's own keys win over the hook's, a mode's (`train.`) over
  the general ones, and `save_interval` defaults to Debugger's 500; `losses` is always saved, as
  smdebug's PyTorch hook always includes it;
- `Rule.custom(source=<local file>, rule_to_invoke=<class>)`: the file goes into the job's source
  archive (`custom_rule_files`) and the rule names it there (`source_s3_uri`); the job runs it.

What the execution input can say is checked there (ValidateInput: rule names and parameters,
collection settings). What it cannot say is refused here with an error naming the SDK attribute:
TensorBoard output, framework profiling before PyTorch 2.0 (from 2.0 on SageMaker collects no
framework metrics, and neither does the job), a system-metrics interval other than 500 ms, a rule
renamed away from its built-in name, a rule file already in S3, modes other than TRAIN and EVAL,
capture on every worker.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Debugger's default save interval (smdebug.core.save_config.DEFAULT_SAVE_CONFIG_INTERVAL).
DEBUGGER_SAVE_INTERVAL = 500
# The profiler rules of ProfilerReport that the engine runs; the others are Debugger's alone.
ENGINE_PROFILER_RULES = ("LowGPUUtilization", "CPUBottleneck", "IOBottleneck", "OverallSystemUsage")
# Where a custom rule's file lies inside the job's source archive.
CUSTOM_RULE_DIR = "stabilizer_custom_rules"
_SCHEDULE_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
_MODE_PREFIXES = ("train.", "eval.", "predict.", "global.")
# Keys that change only how Debugger stores a tensor; the job saves tensors whole, and
# Trial.tensor(...).reduction_value computes reductions on read.
_STORAGE_ONLY = ("reductions", "abs_reductions", "norms", "abs_norms", "save_histogram")


class DebuggerConfigError(ValueError):
    """The estimator's Debugger configuration asks for something the job cannot do; names the attribute."""


@dataclass
class Translated:
    """The `monitoring` section and the custom rule files to pack beside the job's source."""

    rules: list[dict[str, Any]] = field(default_factory=list)
    capture: dict[str, dict[str, Any]] = field(default_factory=dict)
    custom_rule_files: dict[str, Path] = field(default_factory=dict)  # path in the archive -> local file

    def monitoring(self) -> dict[str, Any]:
        return {"rules": self.rules, "capture": self.capture}


def has_debugger_config(estimator: Any) -> bool:
    hook = getattr(estimator, "debugger_hook_config", None)
    return bool(getattr(estimator, "rules", None)) or (hook not in (None, False, {}))


def _int(value: Any, where: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise DebuggerConfigError(f"{where}: expected a whole number, got {value!r}") from None
    return number


def _split_modes(params: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Debugger's flat keys, `train.save_interval` and `save_interval`, by mode ("" = every mode)."""
    out: dict[str, dict[str, Any]] = {"": {}, "train.": {}, "eval.": {}}
    for key, value in params.items():
        prefix = next((p for p in _MODE_PREFIXES if key.startswith(p)), "")
        bare = key[len(prefix):]
        if bare not in _SCHEDULE_KEYS:
            continue
        if prefix in ("predict.", "global."):
            raise DebuggerConfigError(
                f"{where}.{key}: a job records TRAIN and EVAL steps only; give train. or eval. settings"
            )
        out[prefix][bare] = value
    return out


def _schedule(own: Mapping[str, Any], hook: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The TRAIN schedule of a collection, by smdebug's precedence (collection, then hook; mode, then general)."""
    mine, base = _split_modes(own, where), _split_modes(hook, "debugger_hook_config.hook_parameters")
    merged = {**base[""], **base["train."], **mine[""], **mine["train."]}
    spec: dict[str, Any] = {}
    if "save_steps" in merged:
        steps = merged["save_steps"]
        items = steps.split(",") if isinstance(steps, str) else list(steps)
        spec["save_steps"] = [_int(step, f"{where}.save_steps") for step in items if str(step).strip()]
    else:
        spec["save_interval"] = _int(merged.get("save_interval", DEBUGGER_SAVE_INTERVAL), f"{where}.save_interval")
    for key in ("start_step", "end_step"):
        if merged.get(key) not in (None, "", "None"):
            spec[key] = _int(merged[key], f"{where}.{key}")
    return spec


def _collection(name: str, params: Mapping[str, Any], hook: Mapping[str, Any], where: str) -> dict[str, Any]:
    spec = _schedule(params, hook, where)
    regex = params.get("include_regex")
    if regex:
        spec["include_regex"] = regex
    for key in params:
        bare = next((key[len(p):] for p in _MODE_PREFIXES if key.startswith(p)), key)
        if bare not in (*_SCHEDULE_KEYS, "include_regex", *_STORAGE_ONLY):
            raise DebuggerConfigError(f"{where}.{key}: not a Debugger collection parameter stabilizer knows")
    if name == "all" and not regex:
        spec["include_regex"] = ".*"
    return spec


def _hook_collections(hook: Any) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any], str]]]:
    if hook in (None, False, {}):
        return {}, []
    params = dict(getattr(hook, "hook_parameters", None) or {})
    where = "debugger_hook_config.hook_parameters"
    if str(params.get("include_workers", "one")).lower() != "one":
        raise DebuggerConfigError(f"{where}.include_workers: tensors are captured on the first worker only")
    for key in params:
        bare = next((key[len(p):] for p in _MODE_PREFIXES if key.startswith(p)), key)
        if key in ("export_tensorboard", "tensorboard_dir"):
            raise DebuggerConfigError(f"{where}.{key}: stabilizer writes no TensorBoard output; read tensors "
                                      "with the Trial API instead")
        if bare not in (*_SCHEDULE_KEYS, *_STORAGE_ONLY, "include_regex", "save_all", "include_workers"):
            raise DebuggerConfigError(f"{where}.{key}: not a Debugger hook parameter stabilizer knows")
    extra: list[tuple[str, dict[str, Any], str]] = []
    if params.get("include_regex"):
        extra.append(("default", {"include_regex": params["include_regex"]}, f"{where}.include_regex"))
    if str(params.get("save_all", "false")).lower() == "true":
        extra.append(("all", {"include_regex": ".*"}, f"{where}.save_all"))
    for i, config in enumerate(getattr(hook, "collection_configs", None) or []):
        extra.append((config.name, dict(config.parameters or {}),
                      f"debugger_hook_config.collection_configs[{i}] ({config.name})"))
    return params, extra


def _actions_json(actions: Any, where: str) -> str | None:
    """Debugger's `action_json` for an Action or ActionList, without the job-name prefix the SDK adds."""
    if actions is None:
        return None
    items = list(getattr(actions, "actions", None) or [actions])
    out = []
    for action in items:
        params = dict(getattr(action, "action_parameters", {}) or {})
        kind = str(params.get("name", "")).lower()
        if kind == "stoptraining":
            out.append({"name": "stoptraining"})
        elif kind in ("email", "sms"):
            out.append({"name": kind, "endpoint": params["endpoint"]})
        else:
            raise DebuggerConfigError(f"{where}.actions: unknown action {params!r}")
    return json.dumps(out, separators=(",", ":"))


def _is_profiler_rule(rule: Any) -> bool:
    return type(rule).__name__ == "ProfilerRule"


def _profiler_report(rule: Any, where: str) -> list[dict[str, Any]]:
    params = {k: v for k, v in (rule.rule_parameters or {}).items() if k != "rule_to_invoke"}
    per_rule: dict[str, dict[str, str]] = {name: {} for name in ENGINE_PROFILER_RULES}
    for key, value in params.items():
        owner, _, parameter = key.partition("_")
        if owner not in per_rule:
            raise DebuggerConfigError(
                f"{where}.rule_parameters.{key}: ProfilerReport here runs {', '.join(ENGINE_PROFILER_RULES)}; "
                f"{owner} is Debugger's alone"
            )
        per_rule[owner][parameter] = str(value)
    return [{"name": name, "parameters": parameters} for name, parameters in per_rule.items()]


def _custom(rule: Any, invoked: str, params: dict[str, str], where: str, source_dir: Path | None,
            files: dict[str, Path]) -> dict[str, Any]:
    source = params.pop("source_s3_uri")
    if str(source).startswith("s3://"):
        raise DebuggerConfigError(
            f"{where}.source: {source} is in S3; give the rule's file as a local path (stabilizer runs the rule "
            "in the job and ships the file inside the job's source)"
        )
    local = Path(source).expanduser().resolve()
    if not local.is_file():
        raise DebuggerConfigError(f"{where}.source: no such file {local}")
    if source_dir is not None and local.is_relative_to(source_dir):
        inside = local.relative_to(source_dir).as_posix()
    else:
        inside = f"{CUSTOM_RULE_DIR}/{local.name}"
        if files.get(inside, local) != local:
            raise DebuggerConfigError(f"{where}.source: two rule files are named {local.name}")
        files[inside] = local
    return {"name": rule.name, "parameters": {"source_s3_uri": inside, "rule_to_invoke": invoked, **params}}


def _framework_profiling(estimator: Any) -> None:
    """What SageMaker does with FrameworkProfile: for PyTorch 2.0 and later it collects no framework
    metrics (the SDK warns so, `fw_utils.profiler_config_deprecation_warning`); neither does the job."""
    version = str(getattr(estimator, "framework_version", None) or "")
    try:
        major = int(version.split(".", maxsplit=1)[0])
    except ValueError:
        major = None
    if major is None or major < 2:
        raise DebuggerConfigError(
            f"profiler_config.framework_profile_params: framework profiling is not supported for PyTorch "
            f"{version or '(no framework_version)'}; SageMaker collects no framework metrics from PyTorch 2.0 on, "
            "and neither does stabilizer: give framework_version 2.0 or later, or leave framework_profile_params out"
        )
    warnings.warn(f"profiler_config.framework_profile_params: as SageMaker does for PyTorch {version}, no "
                  "framework metrics are collected; system metrics are", stacklevel=4)


def _check_estimator(estimator: Any) -> None:
    if getattr(estimator, "tensorboard_output_config", None) is not None:
        raise DebuggerConfigError("tensorboard_output_config: stabilizer writes no TensorBoard output; read "
                                  "tensors with the Trial API (stabilizer_sentinel.create_trial) instead")
    profiler = getattr(estimator, "profiler_config", None)
    if profiler is not None and getattr(profiler, "framework_profile_params", None) is not None:
        _framework_profiling(estimator)
    if profiler is not None and getattr(profiler, "system_monitor_interval_millis", None) not in (None, 500):
        raise DebuggerConfigError(
            f"profiler_config.system_monitor_interval_millis: the job samples system metrics every 500 ms, "
            f"got {profiler.system_monitor_interval_millis}"
        )


def _rule_entry(rule: Any, where: str, root: Path | None, files: dict[str, Path]) -> list[dict[str, Any]]:
    params = {str(k): str(v) for k, v in (rule.rule_parameters or {}).items()}
    invoked = params.pop("rule_to_invoke", rule.name)
    if _is_profiler_rule(rule) and invoked == "ProfilerReport":
        return _profiler_report(rule, where)
    if "source_s3_uri" in params:
        entry = _custom(rule, invoked, params, where, root, files)
    elif invoked != rule.name:
        raise DebuggerConfigError(f"{where}.name: a built-in rule keeps its own name here ({invoked}); "
                                  f"each rule appears once in a job")
    else:
        entry = {"name": rule.name, "parameters": params}
    action = _actions_json(getattr(rule, "actions", None), where)
    if action is not None:
        entry["parameters"]["action_json"] = action
    return [entry]


def monitoring_from_estimator(estimator: Any, source_dir: str | Path | None = None) -> Translated:
    """The `monitoring` rules and capture of an estimator's Debugger configuration (module docstring)."""
    _check_estimator(estimator)
    root = Path(source_dir).resolve() if source_dir is not None else None
    out = Translated()
    hook_params, collections = _hook_collections(getattr(estimator, "debugger_hook_config", None))
    by_name: dict[str, dict[str, Any]] = {}
    for i, rule in enumerate(getattr(estimator, "rules", None) or []):
        where = f"rules[{i}] ({getattr(rule, 'name', '?')})"
        for entry in _rule_entry(rule, where, root, out.custom_rule_files):
            previous = by_name.get(entry["name"])
            if previous is None:
                by_name[entry["name"]] = entry
            elif entry["name"] in ENGINE_PROFILER_RULES:  # also run by ProfilerReport: one entry, merged
                previous["parameters"].update(entry["parameters"])
            else:
                raise DebuggerConfigError(f"{where}: {entry['name']} is given twice; each rule appears once in a job")
        for j, config in enumerate(getattr(rule, "collection_configs", None) or []):
            collections.append((config.name, dict(config.parameters or {}),
                                f"{where}.collections_to_save[{j}] ({config.name})"))
    out.rules = list(by_name.values())
    if (out.rules or collections) and "losses" not in {name for name, _, _ in collections}:
        collections.append(("losses", {}, "losses (always saved by smdebug's PyTorch hook)"))
    for name, params, where in collections:
        spec = _collection(name, params, hook_params, where)
        # The SDK de-duplicates equal CollectionConfigs; of two that differ, the hook's wins over a rule's.
        if name not in out.capture or where.startswith("debugger_hook_config"):
            out.capture[name] = spec
    return out
