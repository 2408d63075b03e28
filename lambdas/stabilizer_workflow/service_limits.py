"""The AWS limits an execution must fit, checked when the input is read, before anything launches.

Step Functions: an execution that outlives its `TimeoutSeconds`, or writes more than 25,000
history events, fails with no Catch and no notification (Step Functions developer guide, "Step
Functions service quotas": 25,000 events in an execution's history, a hard quota). The
workflow's own limits (`limits.max_monitor_transitions` checks at most `wait_seconds` apart,
relaunches) must therefore end every execution well inside both.

SageMaker: CreateTrainingJob rejects a hyperparameter value over 2,500 characters and a tag value
outside `[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*` or over 256 characters (botocore's SageMaker model,
HyperParameterValue and TagValue; tests/unit/lambdas compare these constants with it). Found at
input, such a request says which field to change instead of failing the first launch.

Pure: a state or a request in, a list of problems (each naming its field) out.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: stabilizer_workflow.job checks its hyperparameters here before any state exists
    from stabilizer_workflow.state import WorkflowState

# The definition's TimeoutSeconds (statemachine/stabilizer.asl.json; a test keeps them equal).
EXECUTION_TIMEOUT_SECONDS = 2_678_400  # 31 days: room for limits.max_total_training_seconds (30 days)
HISTORY_EVENT_QUOTA = 25_000

# History events each part of an execution writes, counted by event type in Step Functions'
# history (and measured in moto's interpreter by tests/asl/test_bounds.py, which must not exceed them):
# - start and end: ExecutionStarted, ValidateInput (TaskStateEntered, TaskScheduled, TaskStarted,
#   TaskSucceeded, TaskStateExited), the final state entered/exited and ExecutionSucceeded/Failed,
#   with a failure path (StopJobOfFailedLaunch, StopJobAndNotify, NotifyFailure) on top;
# - a launch: one Lambda task, 5 events;
# - a check: AwaitJobChange (entered, scheduled, started, submitted, succeeded or timed out,
#   exited: 6), or, when parking fails, its failure (5) plus WaitForProgress (2); then
#   CheckJobAndRules (5) and DecideNextStep (2).
EVENTS_START_AND_END = 25
EVENTS_PER_LAUNCH = 5
EVENTS_PER_CHECK = 14
# A retried Lambda step writes TaskFailed, TaskScheduled and TaskStarted again; kept in reserve.
EVENTS_RESERVED_FOR_RETRIES = 2_500

# Wall time each part may take beyond waiting: a check's Lambda with its retries (six tries
# 2..30 s apart plus the calls), and a launch with the capacity back-off (60+120+240+480+600 s).
CHECK_SECONDS_BEYOND_WAIT = 120
LAUNCH_SECONDS = 1_800

HYPERPARAMETER_VALUE_MAX = 2_500
TAG_VALUE_MAX = 256
_TAG_PUNCTUATION = frozenset("_.:/=+-@")


def history_events(state: WorkflowState) -> int:
    """The most history events an execution with these limits can write (retries aside)."""
    limits = state.limits
    launches = limits.max_num_retraining + 1
    return EVENTS_START_AND_END + launches * EVENTS_PER_LAUNCH + limits.max_monitor_transitions * EVENTS_PER_CHECK


def longest_execution_seconds(state: WorkflowState) -> int:
    """The longest an execution with these limits can run before its own limits end it.

    Each check comes at most `wait_seconds` after the previous step (the await times out), so
    `max_monitor_transitions` checks bound the watching; launches add their own time.
    """
    limits = state.limits
    launches = limits.max_num_retraining + limits.max_infrastructure_retries + 1
    return limits.max_monitor_transitions * (state.wait_seconds + CHECK_SECONDS_BEYOND_WAIT) + launches * LAUNCH_SECONDS


def execution_problems(state: WorkflowState) -> list[str]:
    """Input bounds that would let the execution outlive its timeout or its history quota."""
    problems = []
    limits = state.limits
    budget = HISTORY_EVENT_QUOTA - EVENTS_RESERVED_FOR_RETRIES
    events = history_events(state)
    if events > budget:
        most = (budget - EVENTS_START_AND_END - (limits.max_num_retraining + 1) * EVENTS_PER_LAUNCH) // EVENTS_PER_CHECK
        problems.append(
            f"limits.max_monitor_transitions: {limits.max_monitor_transitions} checks may write {events:,} "
            f"history events; Step Functions allows {HISTORY_EVENT_QUOTA:,} per execution "
            f"({EVENTS_RESERVED_FOR_RETRIES:,} kept for retries), so at most {max(most, 0)} checks fit"
        )
    seconds = longest_execution_seconds(state)
    if seconds > EXECUTION_TIMEOUT_SECONDS:
        problems.append(
            f"wait_seconds x limits.max_monitor_transitions: {state.wait_seconds} s x "
            f"{limits.max_monitor_transitions} checks (plus launches) may run {seconds:,} s, longer than "
            f"the execution's timeout of {EXECUTION_TIMEOUT_SECONDS:,} s; lower either"
        )
    too_large = state_size_problem(state)
    if too_large:
        problems.append(too_large)
    if limits.max_total_training_seconds > EXECUTION_TIMEOUT_SECONDS:
        problems.append(
            f"limits.max_total_training_seconds: {limits.max_total_training_seconds} s is longer than the "
            f"execution's timeout of {EXECUTION_TIMEOUT_SECONDS:,} s"
        )
    return problems


# Step Functions' quota on the data a state passes on: 256 KiB of UTF-8 (developer guide, "Step
# Functions service quotas", "Maximum input or output size for a task, state, or execution"); past
# it the execution fails with States.DataLimitExceeded, which no Catch handles. The state must
# leave room beside it for a caught $.error (its cause is a Lambda error message) and the abort's
# fields, so it is held to STATE_BUDGET_BYTES.
STATE_PAYLOAD_LIMIT_BYTES = 256 * 1024
STATE_BUDGET_BYTES = STATE_PAYLOAD_LIMIT_BYTES - 32 * 1024


def most_attempts(state: WorkflowState) -> int:
    limits = state.limits
    return limits.max_num_retraining + limits.max_infrastructure_retries + 1


def largest_state(state: WorkflowState) -> WorkflowState:
    """`state` as it could be at its end: the most attempts its limits allow, each with this run's
    recipe and every field that comes from outside as long as the state keeps it."""
    from datetime import UTC, datetime

    from stabilizer_workflow.state import Attempt, Decision, Finding, WorkflowState

    long = "x" * STATE_PAYLOAD_LIMIT_BYTES  # cut to each field's bound as it enters
    spec = dict(state.run_spec)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    finding = Finding(rule=long, step=2**31, epoch=2**31, phase="warmup", learning_rate=1e-300, tensor=long,
                      value=long, message=long, source="failure_reason", onset_step=2**31,
                      stable_learning_rate=1e-300)
    decision = Decision(action="relaunch", outcome="failed", remedy=long, changes={k: [v, v] for k, v in spec.items()},
                        resume_from=f"s3://{'b' * 63}/executions/{state.execution.name}/attempt-1/checkpoints/"
                                    "checkpoint-99999999.pt", reason=long)
    attempts = [
        Attempt(number=n, job_name=f"{'p' * 31}-{state.execution.short_id}-{n}", run_spec=spec,
                checkpoint_s3_uri=f"s3://{'b' * 63}/executions/{state.execution.name}/attempt-{n}/checkpoints",
                resumed_from=decision.resume_from, started_at=now, ended_at=now, status="Stopped",
                secondary_status=long, failure_reason=long, finding=finding, steps=2**31, seconds=2**31,
                decision=decision)
        for n in range(1, most_attempts(state) + 1)
    ]
    return WorkflowState.model_validate({
        **state.model_dump(), "attempts": [a.model_dump() for a in attempts], "reason": long, "rule_status": long,
        "resume_from": decision.resume_from, "outcome": "failed", "next_action": "end",
    })


def state_bytes(state: WorkflowState) -> int:
    """The state's size as the Lambda returns it (JSON, UTF-8)."""
    import json

    return len(json.dumps(state.model_dump(mode="json"), ensure_ascii=False).encode())


def state_size_problem(state: WorkflowState) -> str | None:
    """Why this execution's state could outgrow Step Functions' payload quota; None when it fits."""
    largest = state_bytes(largest_state(state))
    if largest <= STATE_BUDGET_BYTES:
        return None
    per_attempt = max(1, (largest - state_bytes(state)) // most_attempts(state))
    room = (STATE_BUDGET_BYTES - state_bytes(state)) // per_attempt
    fits = max(0, room - state.limits.max_infrastructure_retries - 1)
    return (
        f"limits.max_num_retraining: {state.limits.max_num_retraining} relaunches (plus "
        f"limits.max_infrastructure_retries {state.limits.max_infrastructure_retries}) of this job may grow the "
        f"state to {largest:,} bytes; Step Functions passes at most {STATE_PAYLOAD_LIMIT_BYTES:,} between states "
        f"({STATE_PAYLOAD_LIMIT_BYTES - STATE_BUDGET_BYTES:,} kept for errors), so at most {fits} relaunches fit "
        "(fewer or shorter job.hyperparameters fit more)"
    )


def hyperparameter_value_problem(field: str, name: str, value: str, holding: str = "") -> str | None:
    """Why `value` (JSON text, as every value travels) cannot be the training job's hyperparameter
    `name`, naming the input `field` behind it and, when given, what the value `holding`; None
    when it fits. The one check of SageMaker's limit on a hyperparameter value: a job's own
    hyperparameters, the sentinel configuration and the whole request all use it."""
    if len(value) <= HYPERPARAMETER_VALUE_MAX:
        return None
    what = f"{holding} take " if holding else ""
    return (
        f"{field}: {what}{len(value):,} characters as the training job's hyperparameter {name!r} "
        f"(JSON-encoded); SageMaker allows at most {HYPERPARAMETER_VALUE_MAX:,}"
    )


def _tag_value_ok(value: str) -> bool:
    # \p{L} letters, \p{Z} separators, \p{N} numbers, and _.:/=+-@
    return len(value) <= TAG_VALUE_MAX and all(
        ch in _TAG_PUNCTUATION or unicodedata.category(ch)[0] in ("L", "Z", "N") for ch in value
    )


# Which input field a tag value comes from (requests.py writes these tags).
_TAG_SOURCES = {
    "stabilizer:execution": "execution name (the name given when the execution was started)",
    "stabilizer:policy": "policy",
}


def request_problems(request: dict[str, Any], sources: dict[str, str] | None = None) -> list[str]:
    """CreateTrainingJob values SageMaker would reject. `sources` names the input field behind
    each hyperparameter (`sagemaker_stabilizer` -> `monitoring`); unnamed ones are named as such."""
    problems = []
    for name, value in (request.get("HyperParameters") or {}).items():
        problem = hyperparameter_value_problem((sources or {}).get(name, f"hyperparameter {name!r}"), name, value)
        if problem:
            problems.append(problem)
    for tag in request.get("Tags") or []:
        if not _tag_value_ok(tag["Value"]):
            where = _TAG_SOURCES.get(tag["Key"], f"tag {tag['Key']!r}")
            problems.append(
                f"{where}: {tag['Value']!r} cannot be a SageMaker tag value (letters, digits, spaces and "
                f"_ . : / = + - @ only, at most {TAG_VALUE_MAX} characters); start the execution with a name "
                f"made of those"
                if tag["Key"] == "stabilizer:execution"
                else f"{where}: {tag['Value']!r} cannot be a SageMaker tag value"
            )
    return problems


_QUOTA_NAME = re.compile(r"service limit '([^']+)'")


def quota_advice(message: str) -> str:
    """What to do about SageMaker's ResourceLimitExceeded `message`, naming the quota it names.

    SageMaker's message reads "The account-level service limit '<quota>' is N Instances, with
    current utilization of M Instances and a request delta of K Instances. Please use AWS Service
    Quotas to request an increase for this quota." Quotas are raised in the Service Quotas console
    (service "Amazon SageMaker"); they do not come back by waiting, so the launch is not retried.
    """
    found = _QUOTA_NAME.search(message or "")
    quota = f"the SageMaker quota {found.group(1)!r}" if found else "a SageMaker account quota"
    return (
        f"{quota} is used up: request an increase in Service Quotas (service Amazon SageMaker), "
        "stop the account's other jobs that use it, or start the execution with a job.instance_type "
        "you have quota for"
    )
