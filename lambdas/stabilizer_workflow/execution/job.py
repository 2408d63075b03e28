"""The user's training job as the execution input describes it, and its knobs.

A job is what SageMaker runs: a source archive, an entry point, an image, instances, free-form
hyperparameters under the user's own names, input channels and metric definitions. Its **knobs**
say which of those hyperparameters each remedy may change, with the user's name, type and
bounds; remedies act only through them (stabilizer_workflow.remedies.policy). The reference ResNet is one such job
with its knobs declared (stabilizer_workflow.launch.attempts.reference_job), so `{}` still runs it.

Everything here is input-facing data with its validation: no AWS calls, no environment. Checks
that need the deployment (default image and instance, the source archive's members) are made
by `stabilizer_workflow.launch.attempts.prepare`.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stabilizer_workflow.execution.distribution import Distribution
from stabilizer_workflow.execution.hang_settings import HangSettings
from stabilizer_workflow.execution.service_limits import hyperparameter_value_problem

KnobRole = Literal[
    "learning_rate",
    "warmup_learning_rate",
    "warmup_length",
    "normalization",
    "grad_clip",
    "batch_size",
    "activation",
]
KNOB_ROLES: tuple[str, ...] = get_args(KnobRole)
KnobType = Literal["float", "int", "bool", "choice"]

# Which knob types make sense for each role: a learning rate is a real number, a normalisation
# switch is on or off, an activation is one of named choices.
ROLE_TYPES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("float",),
    "warmup_learning_rate": ("float",),
    "warmup_length": ("int", "float"),
    "normalization": ("bool", "int"),
    "grad_clip": ("float",),
    "batch_size": ("int",),
    "activation": ("choice",),
}

# SageMaker's CreateTrainingJob allows 100 hyperparameters (botocore's HyperParameters shape;
# each value's length is checked by stabilizer_workflow.execution.service_limits); the workflow adds its own
# `sagemaker_*` and sentinel entries, so a job keeps 90 for itself.
MAX_HYPERPARAMETERS = 90
RESERVED_PREFIX = "sagemaker_"
# Channels the workflow adds to every job: the library and, when resuming, the checkpoint.
RESERVED_CHANNELS = ("stabilizer", "resume")
MAX_CHANNELS = 18  # InputDataConfig holds at most 20 channels
MAX_URI_CHARS = 1024  # a channel's S3Uri (botocore's model, sagemaker S3Uri max)
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
_INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
# A relative path inside the source archive: no absolute path, no `..`.
_ENTRY_POINT = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[^\s]+$")

Scalar = bool | int | float | str
# A choice knob's value (an activation's name, an optimizer's) as JSON text, as a remedy sends it (`json.dumps`,
# non-ASCII escaped; SageMaker takes 2,500 characters a value); the state keeps it for every attempt, in no more
# UTF-8 bytes than that (execution_bounds).
MAX_CHOICE_CHARS = 256
HyperparameterValue = bool | int | float | str | list[Any] | dict[str, Any]


class Strict(BaseModel):
    """Input-facing models: unknown keys are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Knob(Strict):
    """One hyperparameter of the job that a remedy may change, and how far."""

    hyperparameter: str = Field(min_length=1, max_length=256, description="the hyperparameter's name in the job")
    type: KnobType
    min: float | None = Field(None, description="lowest value a remedy may set (float and int knobs)")
    max: float | None = Field(None, description="highest value a remedy may set (float and int knobs)")
    values: list[Scalar] | None = Field(
        None,
        description="choice knobs: the allowed values in order of preference, best first; a remedy "
        "only ever moves toward the front",
    )

    @model_validator(mode="after")
    def _bounds_fit_the_type(self) -> Knob:
        if self.type in ("float", "int"):
            if self.min is None or self.max is None:
                raise ValueError(f"a {self.type} knob needs both min and max")
            if self.min > self.max:
                raise ValueError(f"min {self.min:g} is above max {self.max:g}")
            if self.type == "int" and not (float(self.min).is_integer() and float(self.max).is_integer()):
                raise ValueError("an int knob needs whole-number min and max")
            if self.values is not None:
                raise ValueError(f"values belong to choice knobs, not {self.type}")
        elif self.type == "choice":
            if not self.values or len(self.values) < 2:
                raise ValueError("a choice knob needs values: at least two, best first")
            if len({json.dumps(v) for v in self.values}) != len(self.values):
                raise ValueError("values must be distinct")
            if long := [v for v in self.values if len(json.dumps(v)) > MAX_CHOICE_CHARS]:
                raise ValueError(f"each value is at most {MAX_CHOICE_CHARS} characters as JSON (a remedy sends it "
                                 f"as the hyperparameter, and the state keeps it for every attempt); "
                                 f"{len(json.dumps(long[0])):,} given")
            if self.min is not None or self.max is not None:
                raise ValueError("min and max belong to float and int knobs, not choice")
        elif self.min is not None or self.max is not None or self.values is not None:
            raise ValueError("a bool knob takes no min, max or values")
        return self

    def admits(self, value: Any) -> str | None:
        """Why `value` is not a value of this knob, or None when it is."""
        if self.type == "bool":
            return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
        if self.type == "choice":
            assert self.values is not None
            if any(value == v and type(value) is type(v) for v in self.values):
                return None
            return f"{value!r} is not one of the knob's values {self.values}"
        if not _is_number(value) or (self.type == "int" and not isinstance(value, int)):
            return f"expected {'an integer' if self.type == 'int' else 'a number'}, got {value!r}"
        assert self.min is not None and self.max is not None
        if not self.min <= value <= self.max:
            return f"{value!r} is outside the knob's bounds [{self.min:g}, {self.max:g}]"
        return None

    def clamp(self, value: float) -> float:
        assert self.min is not None and self.max is not None
        return min(max(value, self.min), self.max)


# The least value a remedy could give a role: no rate, length or clipping threshold is negative (0 turns clipping
# off), and a batch holds one example at least.
LEAST_VALUES = {"learning_rate": 0.0, "warmup_learning_rate": 0.0, "warmup_length": 0.0, "grad_clip": 0.0,
                "batch_size": 1.0}


class Knobs(Strict):
    """The remedy vocabulary: one optional knob per role (docs/contracts.md, section 8)."""

    learning_rate: Knob | None = Field(None, description="the learning rate (after any warm-up)")
    warmup_learning_rate: Knob | None = Field(None, description="the learning rate during warm-up")
    warmup_length: Knob | None = Field(
        None, description="how long a warm-up ramps the learning rate up (steps or epochs)"
    )
    normalization: Knob | None = Field(None, description="a switch that adds normalisation layers (0/1 or bool)")
    grad_clip: Knob | None = Field(None, description="the gradient-norm clipping threshold; 0 turns clipping off")
    batch_size: Knob | None = Field(None, description="the mini-batch size")
    activation: Knob | None = Field(None, description="the activation function, a choice")

    @model_validator(mode="after")
    def _types_fit_the_roles(self) -> Knobs:
        for role, knob in self.declared().items():
            if knob.type not in ROLE_TYPES[role]:
                allowed = " or ".join(ROLE_TYPES[role])
                raise ValueError(f"{role}: a {role} knob is of type {allowed}, not {knob.type}")
            if role == "normalization" and knob.type == "int" and (knob.min, knob.max) != (0, 1):
                raise ValueError("normalization: an int switch has min 0 and max 1")
            least = LEAST_VALUES.get(role)
            if least is not None and knob.min is not None and knob.min < least:
                raise ValueError(f"{role}: min {knob.min:g} is below {least:g}, the least a {role.replace('_', ' ')} "
                                 f"can be")
        names = [knob.hyperparameter for knob in self.declared().values()]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"each hyperparameter may be one knob only; repeated: {', '.join(repeated)}")
        return self

    def declared(self) -> dict[str, Knob]:
        """Role -> knob, for the roles this job declares, in the vocabulary's order."""
        return {role: knob for role in KNOB_ROLES if (knob := getattr(self, role)) is not None}


class ImageSpec(Strict):
    """A training image named by framework and version, resolved at ValidateInput (stabilizer_workflow.launch)."""

    framework: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$")] = "pytorch"
    version: Annotated[str, Field(pattern=r"^\d+(\.\d+){0,2}$")]
    python_version: Annotated[str, Field(pattern=r"^py\d{2,3}$")] | None = None


class MetricDefinition(Strict):
    """A SageMaker metric definition: a name and a regex over the job's log lines."""

    Name: str = Field(min_length=1, max_length=255)  # SageMaker's own key
    Regex: str = Field(min_length=1, max_length=500)

    @field_validator("Regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            pattern = re.compile(value)
        except re.error as error:
            raise ValueError(f"not a regular expression: {error}") from None
        if pattern.groups < 1:
            raise ValueError("needs one capture group around the metric's value")
        return value


class Objective(Strict):
    """The metric that says whether the run learned (a reward, an accuracy), and which way is better: SageMaker's
    HyperParameterTuningJobObjective, whose shape it keeps."""

    MetricName: str = Field(min_length=1, max_length=255, description="the Name of a metric_definitions entry")
    Type: Literal["Maximize", "Minimize"] = Field(
        description="Maximize: it rises as the run learns (a reward, an accuracy); Minimize: it falls (an error)"
    )


class Job(Strict):
    """The training job an execution protects. The reference job is `stabilizer_workflow.execution.reference`."""

    source: str = Field(
        min_length=1,
        description="the source archive (sourcedir.tar.gz) as an s3:// URI; in local mode a directory or "
        "a .tar.gz file on this machine",
    )
    entry_point: str = Field(min_length=1, max_length=256, description="the script to run, relative to the source")
    integration: Literal["auto", "library", "launcher"] = Field(
        "auto",
        description="auto: the launcher stands by and takes over at the first optimizer step unless the "
        "script called watch() before it; library: the script calls stabilizer's watch(); launcher: the "
        "script runs unchanged under stabilizer's launcher, which finds the loss in torch.nn loss modules, "
        "else in the log line `loss_metric` matches",
    )
    recovery: Literal["in_job", "relaunch"] = Field(
        "in_job",
        description="in_job: an explosion or divergence is answered inside the running job (back to its last "
        "good state, on at a lower rate probed from there; docs/recovery.md), and a relaunch follows only when "
        "no lower rate trains or the remedy needs a new job; relaunch: every remedy is a new job. The original "
        "policy always relaunches",
    )
    image: str | ImageSpec | None = Field(
        None, description="an image URI, or {framework, version}; the deployment's training image when left out"
    )
    instance_type: str | None = Field(None, description="the deployment's DEFAULT_INSTANCE_TYPE when left out")
    instance_count: Annotated[int, Field(ge=1, le=100)] = 1
    min_instance_count: Annotated[int, Field(ge=1, le=100)] | None = Field(
        None,
        description="the fewest hosts a relaunch after a hang may run on: a hang whose finding names the hosts "
        "that held the job up relaunches without them, down to this many; default instance_count (a relaunch "
        "keeps the number of hosts)",
    )
    distribution: Distribution | None = Field(
        None, description="the SDK estimator's distribution: torch_distributed or pytorchddp"
    )
    hang: HangSettings | None = Field(None, description="when no progress is a hang, and how often it is relaunched")
    hyperparameters: dict[str, HyperparameterValue] = Field(default_factory=dict)
    channels: dict[str, str] = Field(
        default_factory=dict, description="channel name -> s3:// prefix (in local mode, a local path)"
    )
    metric_definitions: list[MetricDefinition] = Field(default_factory=list, max_length=40)
    loss_metric: str | None = Field(None, description="the Name of the metric definition that reads the loss")
    objective: Objective | None = Field(
        None,
        description="the metric that says whether the run learned, and which way is better: its readings in the "
        "job's log decide where the loss cannot (a policy gradient's surrogate, a script that prints none), and a "
        "run whose loss fell while they never improved did not learn (docs/rules.md, the objective)",
    )
    max_runtime_seconds: Annotated[int, Field(ge=60, le=2_419_200)] = 3600
    use_spot_instances: bool = Field(
        False, description="SageMaker managed spot training (the SDK's use_spot_instances): cheaper, and "
        "SageMaker restarts an interrupted job from its checkpoints; needs max_wait_seconds",
    )
    max_wait_seconds: Annotated[int, Field(ge=60, le=2_419_200)] | None = Field(
        None, description="the SDK's max_wait: how long a spot job may take, waiting for capacity included; at "
        "least max_runtime_seconds (StoppingCondition.MaxWaitTimeInSeconds)",
    )
    checkpoint_s3_uri: str | None = Field(
        None, description="the SDK's checkpoint_s3_uri, accepted as given; each attempt checkpoints under the "
        "execution's prefix instead (executions/<execution>/attempt-<n>/checkpoints), where the monitor reads "
        "its findings, a relaunch resumes and a spot job is restored after an interruption",
    )
    knobs: Knobs = Field(default_factory=Knobs)

    @field_validator("entry_point")
    @classmethod
    def _relative(cls, value: str) -> str:
        if not _ENTRY_POINT.match(value):
            raise ValueError(f"expected a path relative to the source, such as 'train.py', got {value!r}")
        return value

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str | None) -> str | None:
        if value is not None and not _INSTANCE_TYPE.match(value):
            raise ValueError(f"expected a SageMaker instance type such as 'ml.g5.xlarge', got {value!r}")
        return value

    @field_validator("hyperparameters")
    @classmethod
    def _hyperparameters_fit(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_HYPERPARAMETERS:
            raise ValueError(f"{len(value)} hyperparameters; at most {MAX_HYPERPARAMETERS}")
        for name, item in value.items():
            if not name or len(name) > 256:
                raise ValueError(f"{name!r}: a name of 1 to 256 characters")
            if name.startswith(RESERVED_PREFIX):
                raise ValueError(f"{name}: names starting with {RESERVED_PREFIX} belong to the training toolkit")
            problem = hyperparameter_value_problem(name, name, json.dumps(item))
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("channels")
    @classmethod
    def _channel_names(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_CHANNELS:
            raise ValueError(f"{len(value)} channels; at most {MAX_CHANNELS}")
        for name, uri in value.items():
            if not _CHANNEL_NAME.match(name):
                raise ValueError(f"{name!r}: a channel's name is 1 to 64 letters, digits, '.', '-' and '_'")
            if name in RESERVED_CHANNELS:
                raise ValueError(f"{name}: the workflow adds this channel itself; choose another name")
            if not uri:
                raise ValueError(f"{name}: empty location")
            if len(uri) > MAX_URI_CHARS:
                raise ValueError(f"{name}: a location of {len(uri):,} characters; SageMaker takes an S3 URI of at "
                                 f"most {MAX_URI_CHARS:,} (S3DataSource.S3Uri)")
        return value

    @model_validator(mode="after")
    def _knobs_name_its_hyperparameters(self) -> Job:
        for role, knob in self.knobs.declared().items():
            if knob.hyperparameter not in self.hyperparameters:
                have = ", ".join(sorted(self.hyperparameters)) or "none"
                raise ValueError(
                    f"knobs.{role}.hyperparameter: {knob.hyperparameter!r} is not one of the job's "
                    f"hyperparameters ({have})"
                )
            problem = knob.admits(self.hyperparameters[knob.hyperparameter])
            if problem:
                raise ValueError(f"knobs.{role}: hyperparameters.{knob.hyperparameter} {problem}")
        if self.min_instance_count is not None and self.min_instance_count > self.instance_count:
            raise ValueError(
                f"min_instance_count: {self.min_instance_count} is more than instance_count {self.instance_count}; "
                "give the fewest hosts a relaunch may use, at most the job's instance_count"
            )
        self._spot_limits()
        names = [definition.Name for definition in self.metric_definitions]
        if len(set(names)) != len(names):
            raise ValueError("metric_definitions: each Name may appear once")
        if self.loss_metric is not None and self.loss_metric not in names:
            raise ValueError(
                f"loss_metric: {self.loss_metric!r} is not the Name of any metric_definitions entry "
                f"({', '.join(names) or 'none given'})"
            )
        if self.objective is not None and self.objective.MetricName not in names:
            raise ValueError(
                f"objective.MetricName: {self.objective.MetricName!r} is not the Name of any metric_definitions "
                f"entry ({', '.join(names) or 'none given'})"
            )
        return self

    def _spot_limits(self) -> None:
        """StoppingCondition.MaxWaitTimeInSeconds: a spot job's wait and run, at least MaxRuntimeInSeconds."""
        if self.use_spot_instances and self.max_wait_seconds is None:
            raise ValueError("max_wait_seconds: a spot job needs one (the SDK's max_wait): how long it may take, "
                             "waiting for spot capacity included")
        if self.max_wait_seconds is not None and not self.use_spot_instances:
            raise ValueError("max_wait_seconds: SageMaker takes a wait only with use_spot_instances")
        if self.max_wait_seconds is not None and self.max_wait_seconds < self.max_runtime_seconds:
            raise ValueError(f"max_wait_seconds: {self.max_wait_seconds} s is less than job.max_runtime_seconds "
                             f"{self.max_runtime_seconds} s; SageMaker needs the wait to be at least the runtime")
        if self.checkpoint_s3_uri is not None and not self.checkpoint_s3_uri.startswith("s3://"):
            raise ValueError(f"checkpoint_s3_uri: expected an s3:// URI, got {self.checkpoint_s3_uri!r}")

    def objective_config(self) -> dict[str, str] | None:
        """The objective as the in-job library reads it: its name, its metric definition's regex, its type."""
        if self.objective is None:
            return None
        regex = self._regex(self.objective.MetricName)
        return {"name": self.objective.MetricName, "regex": regex, "type": self.objective.Type}

    def loss_regex(self) -> str | None:
        return self._regex(self.loss_metric)

    def _regex(self, name: str | None) -> str | None:
        """The Regex of the metric definition called ``name``; None when none is."""
        return next((d.Regex for d in self.metric_definitions if d.Name == name), None)
