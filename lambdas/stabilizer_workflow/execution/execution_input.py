"""The execution input: what a person (console, CLI, notebook) may pass when starting an execution.

The input is validated strictly: every field is optional (the defaults run the reference
problem), unknown keys and wrong types are rejected with a message that names the field.
It describes a training job (`job`, see stabilizer_workflow.execution.job) or, in the older form, the reference job's
recipe (`run_spec`); `stabilizer_workflow.launch.attempts.prepare` turns either into the state's `job`, `monitoring`
and first `run_spec` (the job's hyperparameters). The running state built from it is in
stabilizer_workflow.execution.state.

This module is pure data: no AWS calls, no clock, no environment.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from stabilizer_contract.catalogue import CATALOGUE
from stabilizer_contract.reference_recipe import RECIPE, depth_problem
from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.execution.job import KNOB_ROLES, Job, Strict
from stabilizer_workflow.execution.migration import from_sample_input
from stabilizer_workflow.execution.rule_checks import check_rule_config

PolicyName = Literal["original", "default"]

# Debugger built-in rule names (docs/contracts.md, section 3), from the rule engine's catalogue.
# The same names drive the in-job sentinel, the out-of-job evaluator and Debugger itself, so a
# typo is caught here, at input time.
KNOWN_RULES = tuple(CATALOGUE)

# Debugger's RuleParameters values are at most 256 characters; the same limit keeps rule lists
# usable everywhere.
RULE_PARAMETER_MAX = 256

_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")


_Strict = Strict


class RuleConfig(_Strict):
    """One rule of a rule list (docs/contracts.md, section 3); Debugger's own shape is accepted too."""

    name: str = Field(min_length=1)
    parameters: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _debugger_shape(cls, value: Any) -> Any:
        """``{"RuleConfigurationName", "RuleParameters": {"rule_to_invoke", ...}}``, as CreateTrainingJob takes it."""
        if isinstance(value, dict) and ("RuleConfigurationName" in value or "RuleParameters" in value):
            from stabilizer_contract.catalogue import split_entry

            unknown = set(value) - {"RuleConfigurationName", "RuleParameters", "RuleEvaluatorImage", "InstanceType",
                                    "VolumeSizeInGB", "LocalPath", "S3OutputPath"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)} in a DebugRuleConfiguration")
            name, parameters = split_entry(value, "rule")
            return {"name": name, "parameters": parameters}
        return value

    @field_validator("parameters")
    @classmethod
    def _short_values(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if len(text) > RULE_PARAMETER_MAX:
                raise ValueError(f"parameter {key!r} is {len(text)} characters; at most {RULE_PARAMETER_MAX} allowed")
        return value

    @model_validator(mode="after")
    def _runnable(self, info: ValidationInfo) -> RuleConfig:
        # The rule engine's own check (workflow/rule_checks.py). The validation context says
        # whether Debugger rules are enabled; without one (a stored state) that is not asked.
        context = info.context or {}
        check_rule_config(self.name, self.parameters, debugger_enabled=context.get("debugger_rules_enabled"))
        return self


class CaptureSpec(_Strict):
    """How often one tensor collection is saved: every `save_interval` steps, or at `save_steps`;
    from `start_step`, before `end_step`; `include_regex` selects a custom collection's tensors
    (searched anywhere in a name or in the name smdebug gives it; docs/contracts.md section 7)."""

    save_interval: Annotated[int, Field(ge=1)] | None = None
    save_steps: list[Annotated[int, Field(ge=0)]] | None = None
    start_step: Annotated[int, Field(ge=0)] | None = None
    end_step: Annotated[int, Field(ge=1)] | None = None
    include_regex: str | list[str] | None = None

    @field_validator("include_regex")
    @classmethod
    def _regexes(cls, value: str | list[str] | None) -> str | list[str] | None:
        for item in [part.strip() for part in value.split(",")] if isinstance(value, str) else value or []:
            try:
                re.compile(item)
            except re.error as error:
                raise ValueError(f"{item!r} is not a regular expression ({error})") from None
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> CaptureSpec:
        if (self.save_interval is None) == (self.save_steps is None):
            raise ValueError("give exactly one of save_interval or save_steps")
        return self


def _default_rules() -> list[RuleConfig]:
    return [
        RuleConfig(name="ExplodingTensor", parameters={"collection_names": "gradients", "only_nan": "False"}),
        RuleConfig(name="VanishingGradient", parameters={"threshold": "1e-07"}),
    ]


def _unique(rules: list[RuleConfig]) -> list[RuleConfig]:
    names = [rule.name for rule in rules]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"each rule may appear once; repeated: {', '.join(duplicates)}")
    return rules


def _default_capture() -> dict[str, CaptureSpec]:
    # Losses are tiny, so every 10 steps; full gradients are ~1 MB per save for ResNet-20, so
    # every 100 steps keeps a 3-epoch run's tensor store small. The sentinel's finite check runs
    # every step regardless of these intervals.
    return {"losses": CaptureSpec(save_interval=10), "gradients": CaptureSpec(save_interval=100)}


class Monitoring(_Strict):
    """What watches the job: the rule list, the tensors captured, and what a firing rule does."""

    rules: list[RuleConfig] = Field(default_factory=_default_rules, max_length=20)
    capture: dict[str, CaptureSpec] = Field(default_factory=_default_capture, max_length=20)
    sentinel_action: Literal["stop", "notify"] = "stop"

    @field_validator("rules")
    @classmethod
    def _unique_rules(cls, value: list[RuleConfig]) -> list[RuleConfig]:
        return _unique(value)


# The run_spec fields that are not hyperparameters of the reference script.
MONITORING_FIELDS = ("rules", "capture", "sentinel_action")


def _recipe(name: str) -> Any:
    """The field of the reference recipe's hyperparameter `name`: its default and bounds from the
    recipe's one home (stabilizer_contract.reference_recipe)."""
    hyperparameter = RECIPE[name]
    bounds: dict[str, float] = {}
    if hyperparameter.low is not None:
        bounds["gt" if hyperparameter.low_open else "ge"] = hyperparameter.low
    if hyperparameter.high is not None:
        bounds["le"] = hyperparameter.high
    return Field(hyperparameter.default, **bounds)


Activation = Literal[RECIPE["activation"].choices]  # type: ignore[valid-type]
RESOURCE_FIELDS = ("instance_type", "max_runtime_seconds")


class RunSpec(_Strict):
    """The `run_spec` input section: the reference job's recipe (docs/contracts.md, section 1).

    The older input form, kept: its hyperparameters become the reference job's, `rules`,
    `capture` and `sentinel_action` its monitoring, `instance_type` and `max_runtime_seconds`
    its resources. Defaults are the reference problem: ResNet-20, ELU, no batch norm, warm-up LR
    0.1 then 0.1.
    """

    # Defaults and bounds: the reference recipe's (stabilizer_contract.reference_recipe).
    warmup_learning_rate: float = _recipe("warmup_learning_rate")
    learning_rate: float = _recipe("learning_rate")
    warmup_epochs: int = _recipe("warmup_epochs")
    add_batch_norm: int = _recipe("add_batch_norm")
    num_epochs: int = _recipe("num_epochs")
    batch_size: int = _recipe("batch_size")
    depth: int = _recipe("depth")
    activation: Activation = _recipe("activation")
    grad_clip: float = _recipe("grad_clip")
    seed: int = _recipe("seed")
    checkpoint_every: int = _recipe("checkpoint_every")
    max_steps: int = _recipe("max_steps")
    rules: list[RuleConfig] = Field(default_factory=_default_rules, max_length=20)
    sentinel_action: Literal["stop", "notify"] = "stop"
    capture: dict[str, CaptureSpec] = Field(default_factory=_default_capture, max_length=20)
    # None means "the deployment's DEFAULT_INSTANCE_TYPE"; `prepare` fills it in.
    instance_type: str | None = None
    max_runtime_seconds: Annotated[int, Field(ge=60, le=432_000)] = 3600

    @field_validator("depth")
    @classmethod
    def _resnet_depth(cls, value: int) -> int:
        if (problem := depth_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str | None) -> str | None:
        if value is not None and not _INSTANCE_TYPE.match(value):
            raise ValueError(f"expected a SageMaker instance type such as 'ml.p3.2xlarge', got {value!r}")
        return value

    @field_validator("rules")
    @classmethod
    def _unique_rules(cls, value: list[RuleConfig]) -> list[RuleConfig]:
        return _unique(value)

    def hyperparameters(self) -> dict[str, Any]:
        """The reference script's hyperparameters (without monitoring and resources)."""
        return self.model_dump(exclude={*MONITORING_FIELDS, *RESOURCE_FIELDS})

    def monitoring(self) -> Monitoring:
        return Monitoring(rules=self.rules, capture=self.capture, sentinel_action=self.sentinel_action)


class Limits(_Strict):
    """Bounds of one execution. Hitting any of them ends it with a notification."""

    # The original sample's default.
    max_num_retraining: Annotated[int, Field(ge=0, le=100)] = 10
    # 300 checks at the default 300 s wait is a day of monitoring.
    max_monitor_transitions: Annotated[int, Field(ge=1, le=100_000)] = 300
    # Four hours of training across all attempts; the reference problem needs minutes per attempt.
    max_total_training_seconds: Annotated[int, Field(ge=60, le=30 * 86_400)] = 14_400
    # Relaunches of an unchanged recipe after SageMaker itself failed (not the training code).
    max_infrastructure_retries: Annotated[int, Field(ge=0, le=10)] = 2


class ExecutionInput(_Strict):
    """What a person (console, CLI, notebook) may pass when starting an execution. `{}` is valid.

    `job` describes the user's training job; without it the reference job runs, tuned by the
    older `run_spec` section. The two do not mix.
    """

    policy: PolicyName = "default"
    # Local mode passes a few seconds; in the cloud a training job needs minutes to start.
    wait_seconds: Annotated[int, Field(ge=1, le=3600)] = 300
    job: Job | None = Field(None, description="your training job; left out, the reference job runs")
    monitoring: Monitoring | None = Field(None, description="rules, capture and sentinel action; defaults apply")
    run_spec: RunSpec | None = Field(None, description="the reference job's recipe (the older input form)")
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _one_form(self) -> ExecutionInput:
        if self.run_spec is None:
            return self
        if self.job is not None:
            raise ValueError(
                "run_spec: tunes the reference job only; with a job, give its hyperparameters in "
                "job.hyperparameters and its rules in monitoring"
            )
        twice = [name for name in MONITORING_FIELDS if name in self.run_spec.model_fields_set]
        if self.monitoring is not None and twice:
            raise ValueError(f"run_spec.{twice[0]}: given twice; give it once, in monitoring.{twice[0]}")
        return self


# A validator's message may start with the field it is about ("knobs.learning_rate: ...").
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.DOTALL)


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(input)"
    if error["type"] == "extra_forbidden":
        if len(error["loc"]) >= 2 and error["loc"][-2] == "knobs":
            return f"{where}: unknown knob role; the roles are {', '.join(KNOB_ROLES)}"
        return f"{where}: unknown field; remove it (see schemas/execution-input.schema.json)"
    message = error["msg"]
    # Pydantic says "Input should be ..."; say what was expected and what came in.
    message = message.replace("Input should be", "expected").replace("Value error, ", "")
    named = _FIELD_PREFIX.match(message) if error["type"] == "value_error" else None
    if named:
        where = f"{where}.{named.group(1)}" if where != "(input)" else named.group(1)
        message = named.group(2)
    received = error.get("input")
    text = repr(received)
    if error["type"] != "missing" and not isinstance(received, dict | list) and text not in message:
        shown = text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"  # a long value: its start
        message += f" (got {shown} of type {type(received).__name__})"
    return f"{where}: {message}"


# The members of a hyperparameter value's union (job.HyperparameterValue), as pydantic tags each one's error.
_UNION_MEMBERS = {"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string",
                  "list[any]": "a list", "dict[str,any]": "an object"}


def format_validation_error(error: ValidationError) -> str:
    """One clause per field: a value none of a union's members took is one clause (what each would take), not
    one per member."""
    items = error.errors(include_url=False)
    clauses: list[str] = []
    said: set[tuple[Any, ...]] = set()
    for item in items:
        loc = tuple(item["loc"])
        members = [i for i in items if loc and loc[-1] in _UNION_MEMBERS and tuple(i["loc"])[:-1] == loc[:-1]
                   and i["loc"][-1] in _UNION_MEMBERS]
        if len(members) < 2:
            clauses.append(_describe(item))
        elif loc[:-1] not in said:
            said.add(loc[:-1])
            words = [_UNION_MEMBERS[i["loc"][-1]] for i in members]
            clauses.append(f"{'.'.join(str(part) for part in loc[:-1])}: expected {', '.join(words[:-1])} or "
                           f"{words[-1]}, got {_as_json(item.get('input'))}")
    return "; ".join(clauses)


def _as_json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _non_finite(value: Any, where: str = "") -> str | None:
    """The field of the first number that is not finite (NaN, Infinity: Python's json reads and writes them, no
    JSON number is one, and Step Functions refuses such an input), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(input)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def parse_execution_input(raw: Any, *, debugger_rules_enabled: bool | None = None) -> ExecutionInput:
    """Validate a raw execution input; `None` and `{}` give the reference problem.

    `debugger_rules_enabled` (the deployment's DEBUGGER_RULES_ENABLED): False refuses rules only
    SageMaker Debugger runs; None (the CLI, which does not know the deployment) does not ask.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"input: expected a JSON object, got {type(raw).__name__}")
    raw = from_sample_input(raw, default_collections=list(_default_capture()))  # the original sample's flat input
    where = _non_finite(raw)
    if where is not None:
        raise InvalidInput(f"{where}: expected a finite number; NaN and Infinity are not JSON numbers")
    try:
        # strict: "0.1" is not a learning rate and true is not an epoch count.
        return ExecutionInput.model_validate(
            raw, strict=True, context={"debugger_rules_enabled": debugger_rules_enabled}
        )
    except ValidationError as error:
        raise InvalidInput(format_validation_error(error)) from None
