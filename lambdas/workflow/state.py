"""The state payload that travels through the state machine, and the execution input.

The state is the only memory of an execution: Step Functions hands it from Lambda to Lambda, so
everything a later decision needs (the recipe tried, what fired, what was decided and why) is
kept here. It is versioned (`version`), exported as JSON Schema (`schemas/`), and must stay far
below the 256 KB Step Functions payload limit: bulky evidence (loss and gradient histories) goes
to the notification, never into the state.

The execution input is validated strictly: every field is optional (the defaults run the
reference problem), unknown keys and wrong types are rejected with a message that names the field.

This module is pure data: no AWS calls, no clock, no environment.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workflow.errors import InvalidInput, StateCorrupted
from workflow.migration import from_sample_input

STATE_VERSION = 1

NextAction = Literal["launch_new", "monitor", "end"]
Outcome = Literal["succeeded", "gave_up", "failed"]
PolicyName = Literal["original", "default"]
Phase = Literal["warmup", "main"]
TrainingJobStatus = Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"]

# Debugger built-in rule names (docs/contracts.md, section 3). The same names drive the in-job
# sentinel, the out-of-job evaluator and Debugger itself, so a typo is caught here, at input time.
KNOWN_RULES = (
    "ExplodingTensor",
    "VanishingGradient",
    "LossNotDecreasing",
    "Overfit",
    "Overtraining",
    "PoorWeightInitialization",
    "SaturatedActivation",
    "TensorVariance",
    "WeightUpdateRatio",
    "AllZero",
    "DeadRelu",
    "UnchangedTensor",
    "ClassImbalance",
    "CheckInputImages",
    "StalledTrainingRule",
)

# Debugger's RuleParameters values are at most 256 characters; the same limit keeps rule lists
# usable everywhere.
RULE_PARAMETER_MAX = 256

_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
_S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")


class _Strict(BaseModel):
    """Input-facing models: unknown keys are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleConfig(_Strict):
    """One rule of a rule list (docs/contracts.md, section 3)."""

    name: Literal[KNOWN_RULES]  # type: ignore[valid-type]
    parameters: dict[str, str] = Field(default_factory=dict)

    @field_validator("parameters")
    @classmethod
    def _short_values(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if len(text) > RULE_PARAMETER_MAX:
                raise ValueError(
                    f"parameter {key!r} is {len(text)} characters; at most {RULE_PARAMETER_MAX} allowed"
                )
        return value


class CaptureSpec(_Strict):
    """How often one tensor collection is saved: every `save_interval` steps, or at `save_steps`."""

    save_interval: Annotated[int, Field(ge=1)] | None = None
    save_steps: list[Annotated[int, Field(ge=0)]] | None = None

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


def _default_capture() -> dict[str, CaptureSpec]:
    # Losses are tiny, so every 10 steps; full gradients are ~1 MB per save for ResNet-20, so
    # every 100 steps keeps a 3-epoch run's tensor store small. The sentinel's finite check runs
    # every step regardless of these intervals.
    return {"losses": CaptureSpec(save_interval=10), "gradients": CaptureSpec(save_interval=100)}


class RunSpec(_Strict):
    """The recipe of one attempt: hyperparameters (docs/contracts.md, section 1) and resources.

    Defaults are the reference problem: ResNet-20, ELU, no batch norm, warm-up LR 0.1 then 0.1.
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
        names = [rule.name for rule in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"each rule may appear once; repeated: {', '.join(duplicates)}")
        return value

    def architecture(self) -> tuple[int, int, str]:
        """What decides whether a checkpoint's weights fit this recipe's network."""
        return (self.add_batch_norm, self.depth, self.activation)

    def recipe_key(self) -> str:
        """A stable identity of the recipe, used to never try the same recipe twice."""
        return self.model_dump_json()


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
    """What a person (console, CLI, notebook) may pass when starting an execution. `{}` is valid."""

    policy: PolicyName = "default"
    # Local mode passes a few seconds; in the cloud a training job needs minutes to start.
    wait_seconds: Annotated[int, Field(ge=1, le=3600)] = 300
    run_spec: RunSpec = Field(default_factory=RunSpec)
    limits: Limits = Field(default_factory=Limits)


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
    num_retraining: int = 0
    num_infrastructure_retries: int = 0
    num_monitor_transitions: int = 0
    # The current training job; the abort path stops this one ($.history.latest_job_name).
    latest_job_name: str | None = None


class Finding(BaseModel):
    """One rule firing, as kept in the state: enough to decide and to explain, no bulky evidence."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    step: int | None = None
    epoch: int | None = None
    phase: Phase | None = None
    learning_rate: float | None = None
    tensor: str | None = None
    value: str | None = None
    message: str = ""
    source: Literal["sentinel", "debugger", "failure_reason"] = "sentinel"


class Decision(BaseModel):
    """What the workflow decided after an attempt, with a one-line reason a person can read."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["relaunch", "end"]
    outcome: Outcome | None = None
    remedy: str | None = None
    changes: dict[str, list[Any]] = Field(default_factory=dict)  # field -> [old, new]
    resume_from: str | None = None
    reason: str


class Attempt(BaseModel):
    """One training job of the execution."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(ge=1)
    job_name: str
    run_spec: RunSpec
    checkpoint_s3_uri: str
    resumed_from: str | None = None
    started_at: datetime
    ended_at: datetime | None = None
    status: TrainingJobStatus = "InProgress"
    secondary_status: str | None = None
    failure_reason: str | None = None
    finding: Finding | None = None
    steps: int | None = None
    seconds: int | None = None
    decision: Decision | None = None


class WorkflowState(BaseModel):
    """The state payload. Stable paths the state machine reads are noted in docs/contracts.md."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = STATE_VERSION
    execution: ExecutionRef
    policy: PolicyName = "default"
    wait_seconds: int = Field(300, ge=1, le=3600)
    next_action: NextAction = "launch_new"
    job_status: TrainingJobStatus | None = None
    rule_status: str | None = None
    run_spec: RunSpec
    # S3 URI of the checkpoint the next launch starts from (the `resume` channel), if any.
    resume_from: str | None = None
    limits: Limits = Field(default_factory=Limits)
    history: History = Field(default_factory=History)
    attempts: list[Attempt] = Field(default_factory=list)
    outcome: Outcome | None = None
    reason: str | None = None

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def tried(self, spec: RunSpec) -> bool:
        key = spec.recipe_key()
        return any(attempt.run_spec.recipe_key() == key for attempt in self.attempts)

    def training_seconds(self) -> int:
        return sum(attempt.seconds or 0 for attempt in self.attempts)


def _describe(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "(input)"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field; remove it (see schemas/execution-input.schema.json)"
    message = error["msg"]
    # Pydantic says "Input should be ..."; say what was expected and what came in.
    message = message.replace("Input should be", "expected").replace("Value error, ", "")
    received = error.get("input")
    if error["type"] != "missing" and not isinstance(received, dict | list):
        message += f" (got {received!r}, a {type(received).__name__})"
    return f"{where}: {message}"


def format_validation_error(error: ValidationError) -> str:
    return "; ".join(_describe(item) for item in error.errors(include_url=False))


def parse_execution_input(raw: Any) -> ExecutionInput:
    """Validate a raw execution input; `None` and `{}` give the reference problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput(f"input: expected a JSON object, got {type(raw).__name__}")
    raw = from_sample_input(raw, default_collections=list(_default_capture()))  # the original sample's flat input
    try:
        # strict: "0.1" is not a learning rate and true is not an epoch count.
        return ExecutionInput.model_validate(raw, strict=True)
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
