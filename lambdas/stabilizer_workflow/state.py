"""The state payload that travels through the state machine, and the execution input.

The state is the only memory of an execution: Step Functions hands it from Lambda to Lambda, so
everything a later decision needs (the recipe tried, what fired, what was decided and why) is
kept here. It is versioned (`version`), exported as JSON Schema (`schemas/`), and must stay far
below the 256 KB Step Functions payload limit: bulky evidence (loss and gradient histories) goes
to the notification, never into the state.

The execution input is validated strictly: every field is optional (the defaults run the
reference problem), unknown keys and wrong types are rejected with a message that names the field.
It describes a training job (`job`, see stabilizer_workflow.job) or, in the older form, the reference job's
recipe (`run_spec`); `stabilizer_workflow.launch.prepare` turns either into the state's `job`, `monitoring`
and first `run_spec` (the job's hyperparameters).

This module is pure data: no AWS calls, no clock, no environment.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from stabilizer_contract.catalogue import CATALOGUE
from stabilizer_workflow.errors import InvalidInput, StateCorrupted
from stabilizer_workflow.job import KNOB_ROLES, HyperparameterValue, Job, Strict
from stabilizer_workflow.migration import from_sample_input
from stabilizer_workflow.rule_checks import check_rule_config

# 2: the state carries the job, its monitoring and the job's hyperparameters as run_spec.
STATE_VERSION = 2

NextAction = Literal["launch_new", "monitor", "end"]
# What the evidence says of an execution (docs/contracts.md, "Outcomes"). succeeded: the last
# attempt was watched over every step it took, ended with a finite loss and learned (or, started
# from a trained state, did not degrade). stopped_early: a stop-early rule ended a run that had
# learned, keeping the best checkpoint by its validation metric (a success). unwatched: no summary,
# nothing watched the job. unverified: watched, but too little was seen to call it healthy.
# diverged: the loss blew up and no remedy is left. did_not_learn: the loss never fell. gave_up:
# remedies or limits used up. failed: a job or the workflow broke for a reason no remedy addresses.
Outcome = Literal[
    "succeeded", "stopped_early", "unwatched", "unverified", "diverged", "did_not_learn", "gave_up", "failed"
]
# The outcomes a person can use the model of: the state machine ends them in a Succeed state.
SUCCESS_OUTCOMES = ("succeeded", "stopped_early")
PolicyName = Literal["original", "default"]
Phase = Literal["warmup", "main"]
TrainingJobStatus = Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"]

# Debugger built-in rule names (docs/contracts.md, section 3), from the rule engine's catalogue.
# The same names drive the in-job sentinel, the out-of-job evaluator and Debugger itself, so a
# typo is caught here, at input time.
KNOWN_RULES = tuple(CATALOGUE)

# Debugger's RuleParameters values are at most 256 characters; the same limit keeps rule lists
# usable everywhere.
RULE_PARAMETER_MAX = 256

_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")


_Strict = Strict


# Text that comes from outside the workflow (SageMaker's failure reasons and statuses, the job's
# findings: rule and tensor names, values, messages, exception lines; reasons quoting them) is cut
# to a bound of UTF-8 bytes as it enters the state, so that a state with the most attempts the
# limits allow stays under Step Functions' 256 KB payload quota (stabilizer_workflow.service_limits checks
# the rest at input; tests/unit/lambdas/test_state_size.py builds the largest state).
def _clipped(max_bytes: int) -> BeforeValidator:
    def clip(value: Any) -> Any:
        if isinstance(value, str) and len(value.encode()) > max_bytes:
            return value.encode()[: max_bytes - 3].decode(errors="ignore") + "..."
        return value

    return BeforeValidator(clip)


NAME_MAX_BYTES, VALUE_MAX_BYTES, TEXT_MAX_BYTES = 128, 40, 240
ExternalName = Annotated[str, _clipped(NAME_MAX_BYTES)]  # a rule, tensor or status name
ExternalValue = Annotated[str, _clipped(VALUE_MAX_BYTES)]  # a tensor's value as text
ExternalText = Annotated[str, _clipped(TEXT_MAX_BYTES)]  # a message, failure reason or reason
ExecutionReason = Annotated[str, _clipped(4 * TEXT_MAX_BYTES)]  # the execution's one reason, quoting the above


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
RESOURCE_FIELDS = ("instance_type", "max_runtime_seconds")


class RunSpec(_Strict):
    """The `run_spec` input section: the reference job's recipe (docs/contracts.md, section 1).

    The older input form, kept: its hyperparameters become the reference job's, `rules`,
    `capture` and `sentinel_action` its monitoring, `instance_type` and `max_runtime_seconds`
    its resources. Defaults are the reference problem: ResNet-20, ELU, no batch norm, warm-up LR
    0.1 then 0.1.
    """

    warmup_learning_rate: Annotated[float, Field(gt=0, le=10)] = 0.1
    learning_rate: Annotated[float, Field(gt=0, le=10)] = 0.1
    warmup_epochs: Annotated[int, Field(ge=0, le=1000)] = 1
    add_batch_norm: Annotated[int, Field(ge=0, le=1)] = 0
    num_epochs: Annotated[int, Field(ge=1, le=1000)] = 3
    batch_size: Annotated[int, Field(ge=1, le=8192)] = 128
    depth: Annotated[int, Field(ge=8, le=1202)] = 20
    activation: Literal["elu", "relu"] = "elu"
    grad_clip: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    checkpoint_every: Annotated[int, Field(ge=1)] = 50
    max_steps: Annotated[int, Field(ge=0)] = 0
    rules: list[RuleConfig] = Field(default_factory=_default_rules, max_length=20)
    sentinel_action: Literal["stop", "notify"] = "stop"
    capture: dict[str, CaptureSpec] = Field(default_factory=_default_capture, max_length=20)
    # None means "the deployment's DEFAULT_INSTANCE_TYPE"; `prepare` fills it in.
    instance_type: str | None = None
    max_runtime_seconds: Annotated[int, Field(ge=60, le=432_000)] = 3600

    @field_validator("depth")
    @classmethod
    def _resnet_depth(cls, value: int) -> int:
        if (value - 2) % 6:
            raise ValueError(f"ResNet depth must be 6n+2 (20, 32, 44, 56, ...), got {value}")
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


class ExecutionRef(BaseModel):
    """Which Step Functions execution this state belongs to."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    name: str = Field(min_length=1, max_length=80)
    # Eight hex characters of a hash of the execution id and start time: short enough for job
    # names, and different for two executions that reuse a name after the 90 days Step Functions
    # keeps names unique.
    short_id: str = Field(pattern=r"^[0-9a-f]{8}$")

    @classmethod
    def create(cls, id: str, name: str, start_time: str | None = None) -> ExecutionRef:
        digest = hashlib.sha256(f"{id}|{start_time or ''}".encode()).hexdigest()[:8]
        return cls(id=id, name=name, short_id=digest)


class History(BaseModel):
    """The original sample's counters. Each moves exactly once per decision of its kind."""

    model_config = ConfigDict(extra="forbid")

    num_warmup_adjustments: int = 0
    num_batch_layer_adjustments: int = 0
    num_learning_rate_adjustments: int = 0
    num_grad_clip_adjustments: int = 0
    num_activation_adjustments: int = 0
    num_batch_size_adjustments: int = 0
    num_retraining: int = 0
    num_infrastructure_retries: int = 0
    num_monitor_transitions: int = 0
    # The current training job; the abort path stops this one ($.history.latest_job_name).
    latest_job_name: str | None = None


class Finding(BaseModel):
    """One rule firing, as kept in the state: enough to decide and to explain, no bulky evidence."""

    model_config = ConfigDict(extra="forbid")

    rule: ExternalName
    step: int | None = None
    epoch: int | None = None
    phase: Phase | None = None
    learning_rate: float | None = None
    tensor: ExternalName | None = None
    value: ExternalValue | None = None
    message: ExternalText = ""
    # summary: read from findings.json's summary (a failed job's losses); log: from the job's own
    # loss lines (the summary's log_loss, or the loss metric's final value in DescribeTrainingJob).
    source: Literal["sentinel", "debugger", "failure_reason", "summary", "log"] = "sentinel"
    # The sentinel's reading of the run-up (stabilizer_sentinel.health.run_up): checkpoints whose next step
    # is at most onset_step are from before it; stable_learning_rate is the highest rate the run
    # took healthy steps at. The default policy sizes and places its remedies with them.
    onset_step: int | None = None
    stable_learning_rate: float | None = None
    # The rule's Debugger actions (docs/rules.md): "notify" (Email/SMS only) does not stop the job;
    # notify lists their "email:<address>" / "sms:<number>".
    action: Literal["stop", "notify"] | None = None
    notify: list[ExternalName] = Field(default_factory=list, max_length=5)


class Decision(BaseModel):
    """What the workflow decided after an attempt, with a one-line reason a person can read."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["relaunch", "end"]
    outcome: Outcome | None = None
    remedy: ExternalName | None = None
    changes: dict[str, list[Any]] = Field(default_factory=dict)  # field -> [old, new]
    resume_from: str | None = None
    reason: ExecutionReason  # the policy's sentence, quoting a finding


class Watched(BaseModel):
    """What findings.json's summary said of one attempt: the evidence its verdict rests on.

    A few numbers only (the whole summary is in S3 beside the checkpoints); a non-finite loss is
    kept as its text ("nan", "inf").
    """

    model_config = ConfigDict(extra="forbid")

    integration: ExternalName | None = None
    ended: ExternalName | None = None
    steps_taken: int | None = None
    steps_observed: int | None = None
    steps_skipped: int | None = None
    first_loss: float | None = None
    last_loss: float | ExternalValue | None = None
    best_loss: float | None = None
    learned: bool | None = None
    # [step, value] of the lowest validation value the job reported (summary `evaluations`).
    best_evaluation: tuple[int, float] | None = None
    started_from: ExternalName | None = None
    restores: bool | None = None
    exception: ExternalText | None = None


class Attempt(BaseModel):
    """One training job of the execution."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(ge=1)
    job_name: str
    # The job's hyperparameters for this attempt, under the job's own names.
    run_spec: dict[str, HyperparameterValue]
    checkpoint_s3_uri: str
    resumed_from: str | None = None
    started_at: datetime
    ended_at: datetime | None = None
    status: TrainingJobStatus = "InProgress"
    secondary_status: ExternalName | None = None
    failure_reason: ExternalText | None = None
    finding: Finding | None = None
    steps: int | None = None
    seconds: int | None = None
    # The summary the job left (None: it left none, or has not ended yet).
    watched: Watched | None = None
    decision: Decision | None = None


class WorkflowState(BaseModel):
    """The state payload. Stable paths the state machine reads are noted in docs/contracts.md."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[2] = STATE_VERSION
    execution: ExecutionRef
    policy: PolicyName = "default"
    wait_seconds: int = Field(300, ge=1, le=3600)
    next_action: NextAction = "launch_new"
    job_status: TrainingJobStatus | None = None
    rule_status: ExternalName | None = None
    # The job as resolved at ValidateInput: source, image and instance are always set.
    job: Job
    monitoring: Monitoring = Field(default_factory=Monitoring)
    # The next (or current) attempt's hyperparameters; remedies change only declared knobs.
    run_spec: dict[str, HyperparameterValue]
    # S3 URI of the checkpoint the next launch starts from (the `resume` channel), if any.
    resume_from: str | None = None
    limits: Limits = Field(default_factory=Limits)
    history: History = Field(default_factory=History)
    attempts: list[Attempt] = Field(default_factory=list)
    outcome: Outcome | None = None
    reason: ExecutionReason | None = None

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def tried(self, spec: dict[str, Any]) -> bool:
        key = recipe_key(spec)
        return any(recipe_key(attempt.run_spec) == key for attempt in self.attempts)

    def training_seconds(self) -> int:
        return sum(attempt.seconds or 0 for attempt in self.attempts)


def recipe_key(spec: dict[str, Any]) -> str:
    """A stable identity of a recipe, used to never try the same recipe twice."""
    return json.dumps(spec, sort_keys=True)


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
    if error["type"] != "missing" and not isinstance(received, dict | list):
        message += f" (got {received!r}, a {type(received).__name__})"
    return f"{where}: {message}"


def format_validation_error(error: ValidationError) -> str:
    return "; ".join(_describe(item) for item in error.errors(include_url=False))


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
    try:
        # strict: "0.1" is not a learning rate and true is not an epoch count.
        return ExecutionInput.model_validate(
            raw, strict=True, context={"debugger_rules_enabled": debugger_rules_enabled}
        )
    except ValidationError as error:
        raise InvalidInput(format_validation_error(error)) from None


def load_state(raw: Any) -> WorkflowState:
    """Validate a state payload handed back by the state machine."""
    if not isinstance(raw, dict):
        raise StateCorrupted(f"state: expected a JSON object, got {type(raw).__name__}")
    try:
        return WorkflowState.model_validate(raw)
    except ValidationError as error:
        raise StateCorrupted(format_validation_error(error)) from None


def dump_state(state: WorkflowState) -> dict[str, Any]:
    return state.model_dump(mode="json")


def is_s3_uri(value: str) -> bool:
    return bool(_S3_URI.match(value))
