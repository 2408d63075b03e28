"""The bounds of a whole execution, checked when the input is read: its history, its timeout, its state.

An execution that outlives its `TimeoutSeconds`, writes more history events than Step Functions
allows, or whose state outgrows the payload quota fails with no Catch and no notification
(stabilizer_workflow.execution.service_limits holds the quotas and says where they come from). The
workflow's own limits must end every execution well inside all three: a problem names the input
field to change.

Pure: a state in, a list of problems out.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from stabilizer_contract.checkpoints import STEP_DIGITS as CHECKPOINT_STEP_DIGITS
from stabilizer_workflow.execution.service_limits import (
    CHECK_SECONDS_BEYOND_WAIT,
    EVENTS_PER_CHECK,
    EVENTS_PER_LAUNCH,
    EVENTS_RESERVED_FOR_RETRIES,
    EVENTS_START_AND_END,
    EXECUTION_TIMEOUT_SECONDS,
    HISTORY_EVENT_QUOTA,
    LAUNCH_SECONDS,
)
from stabilizer_workflow.execution.state import (
    INT_BOUND,
    MAX_BAD_BATCHES,
    MAX_NOTIFY,
    MAX_PROBED,
    MAX_ROLLBACKS,
    MAX_SKIPPED,
    MAX_STRAGGLERS,
    Attempt,
    Decision,
    Finding,
    InJob,
    Rollback,
    Straggler,
    Watched,
    WorkflowState,
)


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
# it the execution fails with States.DataLimitExceeded, which no Catch handles. SNS's limit on a
# message is the same 262,144 bytes (API Reference, Publish: Message), and the failure path's own
# notification (NotifyFailure) publishes the state with the caught error beside it. So the state
# leaves room for the largest error Step Functions records (an error name of at most 256 characters
# and a cause of at most 32,768: its API's SensitiveError and SensitiveCause), each character of it
# escaped once more in JSON, and for the notification's own fields.
STATE_PAYLOAD_LIMIT_BYTES = 256 * 1024
ERROR_NAME_MAX, ERROR_CAUSE_MAX = 256, 32_768
# {"error": {"Error": ..., "Cause": ...}} with every character escaped ('"' -> '\\"'): its worst size.
LARGEST_ERROR_BYTES = len(json.dumps({"error": {"Error": '"' * ERROR_NAME_MAX, "Cause": '"' * ERROR_CAUSE_MAX}}))
# NotifyFailure's {"event": "execution_failed", "execution": <an execution ARN, at most 256
# characters>, "data": {"state": ...}} around the state and the error, rounded up.
NOTIFICATION_FIELDS_BYTES = 512
STATE_BUDGET_BYTES = STATE_PAYLOAD_LIMIT_BYTES - LARGEST_ERROR_BYTES - NOTIFICATION_FIELDS_BYTES


def most_attempts(state: WorkflowState) -> int:
    limits = state.limits
    return limits.max_num_retraining + limits.max_infrastructure_retries + 1


WIDEST_FLOAT = -2.2250738585072014e-308  # a float as long as JSON writes one (24 characters)


def largest_state(state: WorkflowState) -> WorkflowState:
    """`state` as it could be at its end: the most attempts its limits allow, each with this run's
    recipe and every field that comes from outside as long as the state keeps it (the finding with
    its endpoints, the summary the job left, the stragglers it reported, the newest in-job decisions the
    execution keeps). Test: an attempt the monitor records from the longest outside text is no larger
    (tests/unit/workflow/execution/test_state_size.py)."""
    long = "x" * STATE_PAYLOAD_LIMIT_BYTES  # cut to each field's bound as it enters
    big, wide = -INT_BOUND, WIDEST_FLOAT  # integers clamped as they enter
    spec = _widest_spec(state)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    finding = Finding(rule=long, step=big, epoch=big, phase="warmup", learning_rate=wide, tensor=long,
                      value=long, message=long, source="failure_reason", onset_step=big,
                      stable_learning_rate=wide, action="notify", notify=[long] * MAX_NOTIFY)
    decision = Decision(action="relaunch", outcome="failed", remedy=long, changes={k: [v, v] for k, v in spec.items()},
                        resume_from=f"s3://{'b' * 63}/executions/{state.execution.name}/attempt-1/checkpoints/"
                                    f"checkpoint-{'9' * CHECKPOINT_STEP_DIGITS}.pt",
                        instance_count=INT_BOUND, reason=long)
    watched = Watched(integration=long, ended=long, steps_taken=big, steps_observed=big, steps_skipped=big,
                      first_loss=wide, last_loss=long, best_loss=wide, learned=False, best_evaluation=(big, wide),
                      started_from=long, restores=False, exception=long)
    stragglers = [Straggler(rank=INT_BOUND, host=long, step=big, factor=wide)] * MAX_STRAGGLERS
    # The execution keeps its newest MAX_ROLLBACKS in-job decisions, at most one job's: on the last attempt here.
    rollback = Rollback(rule=long, step=big, restored_step=big, steps_lost=INT_BOUND, probe_steps=INT_BOUND,
                        rate_before=wide,
                        rate_after=wide, factor=wide, transient=True, bad_batch=True,
                        bad_batches=["f" * 16] * MAX_BAD_BATCHES, corrupt_records=True, probed=[wide] * MAX_PROBED,
                        failed_probes=big, seconds=wide, reason=long)
    last = most_attempts(state)
    attempts = [
        Attempt(number=n, job_name=f"{'p' * 31}-{state.execution.short_id}-{n}", run_spec=spec,
                checkpoint_s3_uri=f"s3://{'b' * 63}/executions/{state.execution.name}/attempt-{n}/checkpoints",
                resumed_from=decision.resume_from, started_at=now, ended_at=now, status="Stopped",
                secondary_status=long, failure_reason=long, finding=finding, steps=big, seconds=big,
                billable_seconds=big, interruptions=big, watched=watched, decision=decision, stragglers=stragglers,
                rollbacks=[rollback] * MAX_ROLLBACKS if n == last else [], rollbacks_let_go=INT_BOUND)
        for n in range(1, last + 1)
    ]
    history = state.history.model_copy(update={"latest_job_name": attempts[-1].job_name})
    in_job = InJob(skip_batches=[f"{n:016x}" for n in range(MAX_SKIPPED)], corrupt_records=True, exploded=True)
    return WorkflowState.model_validate({
        **state.model_dump(), "attempts": [a.model_dump() for a in attempts], "reason": long, "rule_status": long,
        "resume_from": decision.resume_from, "outcome": "failed", "next_action": "end",
        "history": history.model_dump(), "in_job": in_job.model_dump(),
    })


def _widest_spec(state: WorkflowState) -> dict[str, Any]:
    """The run's hyperparameters with every declared knob at the longest value a remedy can set it to."""
    spec = dict(state.run_spec)
    for knob in state.job.knobs.declared().values():
        if knob.type == "float":
            spec[knob.hyperparameter] = WIDEST_FLOAT
        elif knob.type == "int":
            assert knob.min is not None and knob.max is not None
            spec[knob.hyperparameter] = max(int(knob.min), int(knob.max), key=lambda v: len(str(v)))
        elif knob.type == "choice":
            assert knob.values is not None
            spec[knob.hyperparameter] = max(knob.values, key=lambda v: len(json.dumps(v, ensure_ascii=False).encode()))
        else:
            spec[knob.hyperparameter] = False
    return spec


def state_bytes(state: WorkflowState) -> int:
    """The state's size as the Lambda returns it (JSON, UTF-8)."""
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
        f"and SNS publishes as much ({STATE_PAYLOAD_LIMIT_BYTES - STATE_BUDGET_BYTES:,} kept for an error and the "
        f"failure notification's fields), so at most {fits} relaunches fit "
        "(fewer or shorter job.hyperparameters fit more)"
    )
