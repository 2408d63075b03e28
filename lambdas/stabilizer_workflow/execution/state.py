"""The state payload that travels through the state machine.

The state is the only memory of an execution: Step Functions hands it from Lambda to Lambda, so
everything a later decision needs (the recipe tried, what fired, what was decided and why) is
kept here. It is versioned (`version`), exported as JSON Schema (`schemas/`), and must stay far
below the 256 KB Step Functions payload limit: bulky evidence (loss and gradient histories) goes
to the notification, never into the state. The execution input it starts from is in
stabilizer_workflow.execution.execution_input.

This module is pure data: no AWS calls, no clock, no environment.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from stabilizer_contract.job import FINGERPRINT_PATTERN, IN_JOB_ROLLBACKS, IN_JOB_TRANSIENTS
from stabilizer_workflow.errors import StateCorrupted
from stabilizer_workflow.execution.execution_input import Limits, Monitoring, PolicyName, format_validation_error
from stabilizer_workflow.execution.job import HyperparameterValue, Job

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
Phase = Literal["warmup", "main"]
TrainingJobStatus = Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"]


# Text that comes from outside the workflow (SageMaker's failure reasons and statuses, the job's
# findings: rule and tensor names, values, messages, exception lines; reasons quoting them) is cut
# to a bound of UTF-8 bytes as it enters the state (assigned to a field, too: the models validate
# assignments), so that a state with the most attempts the
# limits allow stays under Step Functions' 256 KB payload quota (stabilizer_workflow.execution.service_limits checks
# the rest at input; tests/unit/workflow/execution/test_state_size.py builds the largest state).
def _clipped(max_bytes: int) -> BeforeValidator:
    def clip(value: Any) -> Any:
        if isinstance(value, str) and len(value.encode()) > max_bytes:
            return value.encode()[: max_bytes - 3].decode(errors="ignore") + "..."
        return value

    return BeforeValidator(clip)


# Numbers from outside enter bounded too: an integer past int64's range (Python reads JSON's integers of any
# length: a 4,000-digit step in findings.json would be 4,000 bytes) is clamped to it, and a non-finite float
# (which JSON cannot carry: json.dumps would write `Infinity`) is None, or its text where the field keeps one.
INT_BOUND = 2**63 - 1


def _bounded_int(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return max(-INT_BOUND, min(INT_BOUND, value))
    return value


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _finite_or_text(value: Any) -> Any:
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _finite_evaluation(value: Any) -> Any:
    if isinstance(value, list | tuple) and len(value) == 2 and isinstance(value[1], float) \
            and not math.isfinite(value[1]):
        return None
    return value


ExternalInt = Annotated[int, BeforeValidator(_bounded_int)]
ExternalFloat = Annotated[float | None, BeforeValidator(_finite_or_none)]


NAME_MAX_BYTES, VALUE_MAX_BYTES, TEXT_MAX_BYTES = 128, 40, 240
# The stragglers one attempt records (the state stays small; the job's stragglers.json has them all),
# and the Debugger endpoints one finding names.
MAX_STRAGGLERS, MAX_NOTIFY = 16, 5
# The in-job decisions one job writes at most, so the most an attempt records. The execution keeps the newest
# this many in all (Attempt.rollbacks): the oldest of earlier attempts are let go first (Attempt.rollbacks_let_go
# counts them; findings.json has them all), and what later jobs and the policy read of them is kept in InJob.
# Each attempt keeping its own (1.2 KiB a record at the longest) would bring the largest state of the default limits
# to 250 KiB with 8 an attempt, past the budget that leaves room for an error and the failure notification, and to
# 373 KiB with the 16 an attempt kept before, past Step Functions' 256 KiB (execution_bounds.largest_state).
MAX_ROLLBACKS = IN_JOB_ROLLBACKS + IN_JOB_TRANSIENTS
MAX_PROBED = 12  # the rates one rollback probed: two replays and two rounds of four
# A bad batch's fingerprints one rollback records (a step with accumulation takes several batches).
MAX_BAD_BATCHES = 4
# The bad batches a relaunch is told to skip, newest last: a few hundred characters of the configuration
# hyperparameter's 2,500 (stabilizer_workflow.launch.requests.sentinel_configuration).
MAX_SKIPPED = 16
Fingerprint = Annotated[str, Field(pattern=FINGERPRINT_PATTERN)]  # stabilizer_sentinel.recovery.batches.fingerprint
ExternalName = Annotated[str, _clipped(NAME_MAX_BYTES)]  # a rule, tensor or status name
ExternalValue = Annotated[str, _clipped(VALUE_MAX_BYTES)]  # a tensor's value as text
ExternalText = Annotated[str, _clipped(TEXT_MAX_BYTES)]  # a message, failure reason or reason
ExecutionReason = Annotated[str, _clipped(4 * TEXT_MAX_BYTES)]  # the execution's one reason, quoting the above


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

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rule: ExternalName
    step: ExternalInt | None = None
    epoch: ExternalInt | None = None
    phase: Phase | None = None
    learning_rate: ExternalFloat = None
    tensor: ExternalName | None = None
    value: ExternalValue | None = None
    message: ExternalText = ""
    # summary: read from findings.json's summary (a failed job's losses); log: from the job's own
    # loss lines (the summary's log_loss, or the loss metric's final value in DescribeTrainingJob).
    source: Literal["sentinel", "debugger", "failure_reason", "summary", "log"] = "sentinel"
    # The sentinel's reading of the run-up (stabilizer_sentinel.detection.health.run_up): checkpoints whose next step
    # is at most onset_step are from before it; stable_learning_rate is the highest rate the run
    # took healthy steps at. The default policy sizes and places its remedies with them.
    onset_step: ExternalInt | None = None
    stable_learning_rate: ExternalFloat = None
    # The rule's Debugger actions (docs/rules.md): "notify" (Email/SMS only) does not stop the job;
    # notify lists their "email:<address>" / "sms:<number>".
    action: Literal["stop", "notify"] | None = None
    notify: list[ExternalName] = Field(default_factory=list, max_length=MAX_NOTIFY)
    # Why the sentinel told it and did nothing: the script meant it (a rate range test's blow-up, a search's
    # trial). Not the run's failure: the run is judged on its evidence (stabilizer_workflow.evidence.verdicts).
    told: ExternalText | None = None


class Decision(BaseModel):
    """What the workflow decided after an attempt, with a one-line reason a person can read."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    action: Literal["relaunch", "end"]
    outcome: Outcome | None = None
    remedy: ExternalName | None = None
    changes: dict[str, list[Any]] = Field(default_factory=dict)  # field -> [old, new]
    resume_from: str | None = None
    # The hosts the next attempt runs on, when a relaunch after a hang changed their number.
    instance_count: int | None = Field(None, ge=1)
    reason: ExecutionReason  # the policy's sentence, quoting a finding


class Watched(BaseModel):
    """What findings.json's summary said of one attempt: the evidence its verdict rests on.

    A few numbers only (the whole summary is in S3 beside the checkpoints); a non-finite loss is
    kept as its text ("nan", "inf").
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    integration: ExternalName | None = None
    ended: ExternalName | None = None
    steps_taken: ExternalInt | None = None
    steps_observed: ExternalInt | None = None
    steps_skipped: ExternalInt | None = None
    first_loss: ExternalFloat = None
    last_loss: Annotated[float | ExternalValue | None, BeforeValidator(_finite_or_text)] = None
    best_loss: ExternalFloat = None
    learned: bool | None = None
    # [step, value] of the lowest validation value the job reported (summary `evaluations`).
    best_evaluation: Annotated[tuple[ExternalInt, float] | None, BeforeValidator(_finite_evaluation)] = None
    started_from: ExternalName | None = None
    restores: bool | None = None
    exception: ExternalText | None = None


class Straggler(BaseModel):
    """One rank the job's watchdog found persistently slower than the others (stragglers.json)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rank: ExternalInt = Field(ge=0)
    host: ExternalName | None = None
    step: ExternalInt | None = None
    factor: ExternalFloat = None  # its busy time over the median of the other ranks'


class Rollback(BaseModel):
    """An in-job decision (job.recovery in_job): the job went back to an earlier state of its own and
    trained on at a lower rate, chosen by probing from it; or found none and stopped (``rate_after`` None)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rule: ExternalName
    step: ExternalInt
    restored_step: ExternalInt
    steps_lost: ExternalInt = Field(ge=0)
    probe_steps: ExternalInt = Field(0, ge=0)
    rate_before: ExternalFloat = None
    rate_after: ExternalFloat = None
    factor: ExternalFloat = None  # the script's rates times this from then on (None: it stopped)
    # The same rate trained past a sudden explosion from the restored state: the batch's or a one-off,
    # not the rate's (factor: the one in force, unchanged).
    transient: bool = False
    # ... and the failing step's batches failed again from that state: a bad batch, skipped in the job
    # (``bad_batch``) and by a relaunch (``bad_batches``, their fingerprints:
    # stabilizer_sentinel.recovery.batches.fingerprint; none for a batch with no tensor values to read).
    bad_batch: bool = False
    bad_batches: list[Fingerprint] = Field(default_factory=list, max_length=MAX_BAD_BATCHES)
    # ... holding corrupt records (non-finite values the batches after it lacked): every later job passes
    # over each batch with non-finite values, wherever its shuffle puts them (``skip_nonfinite_batches``).
    corrupt_records: bool = False
    probed: list[ExternalFloat] = Field(default_factory=list, max_length=MAX_PROBED)  # the rates tried
    failed_probes: ExternalInt = 0
    seconds: ExternalFloat = None  # from the finding to training again
    reason: ExternalText


class InJob(BaseModel):
    """What the execution's in-job decisions leave for its later jobs and the policy, from every rollback
    recorded, kept when the rollbacks' own records are let go (MAX_ROLLBACKS)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # The bad batches found (each once, oldest first): the next job passes over them (``skip_batches``).
    skip_batches: list[Fingerprint] = Field(default_factory=list, max_length=MAX_SKIPPED)
    # A bad batch held corrupt records: the next job passes over any batch with non-finite values.
    corrupt_records: bool = False
    # A job answered an explosion of its rate (not a batch's or a one-off): a later sign of too small a step
    # is not answered by raising the rate again.
    exploded: bool = False


class Attempt(BaseModel):
    """One training job of the execution."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
    steps: ExternalInt | None = None
    seconds: int | None = None
    # What SageMaker bills (BillableTimeInSeconds; under `seconds` with spot) and how often spot
    # capacity was taken away meanwhile (SecondaryStatus Interrupted).
    billable_seconds: int | None = None
    interruptions: int | None = None
    # The summary the job left (None: it left none, or has not ended yet).
    watched: Watched | None = None
    decision: Decision | None = None
    # Ranks reported slower than the others during this attempt, each once (at most MAX_STRAGGLERS).
    stragglers: list[Straggler] = Field(default_factory=list, max_length=MAX_STRAGGLERS)
    # In-job rollbacks of this attempt, in order (at most MAX_ROLLBACKS in the execution; findings.json has
    # them all), and how many of its oldest were let go to keep the state small.
    rollbacks: list[Rollback] = Field(default_factory=list, max_length=MAX_ROLLBACKS)
    rollbacks_let_go: int = Field(0, ge=0)


class WorkflowState(BaseModel):
    """The state payload. Stable paths the state machine reads are noted in docs/contracts.md."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
    in_job: InJob = Field(default_factory=InJob)
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
