"""The train Lambda's decisions: the initial state from the execution input, and the next attempt.

Pure: `prepare()` validates the raw input and returns the first state; `launch()` returns the
CreateTrainingJob request, the state with the new attempt recorded and the `launched`
notification. Calling SageMaker and SNS is the handler's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from workflow import notifications
from workflow.errors import InvalidInput, StateCorrupted
from workflow.notifications import Notification
from workflow.requests import build_create_training_job, checkpoint_uri
from workflow.service_limits import execution_problems, request_problems
from workflow.settings import TrainSettings
from workflow.state import Attempt, ExecutionRef, WorkflowState, parse_execution_input


def prepare(raw_input: Any, execution: Any, settings: TrainSettings) -> WorkflowState:
    """Validate the execution input (raises InvalidInput) and build the first state."""
    given = parse_execution_input(raw_input)
    if not isinstance(execution, dict) or not execution.get("id") or not execution.get("name"):
        raise StateCorrupted("execution: expected {'id': ..., 'name': ...} from the state machine's context")
    run_spec = given.run_spec
    if run_spec.instance_type is None:
        run_spec = run_spec.model_copy(update={"instance_type": settings.default_instance_type})
    state = WorkflowState(
        execution=ExecutionRef.create(
            str(execution["id"]), str(execution["name"]), execution.get("start_time")
        ),
        policy=given.policy,
        wait_seconds=given.wait_seconds,
        next_action="launch_new",
        run_spec=run_spec,
        limits=given.limits,
    )
    # AWS limits the execution and its first request must fit, found now rather than mid-run.
    problems = execution_problems(state) + request_problems(
        build_create_training_job(state, settings, 1), _HYPERPARAMETER_SOURCES
    )
    if problems:
        raise InvalidInput("; ".join(problems))
    return state


# The input field behind each JSON-valued hyperparameter, for messages (requests.hyperparameters).
_HYPERPARAMETER_SOURCES = {"sentinel_rules": "run_spec.rules", "capture": "run_spec.capture"}


@dataclass(frozen=True)
class LaunchPlan:
    state: WorkflowState
    request: dict[str, Any]
    attempt: Attempt
    notification: Notification


def launch(state: WorkflowState, settings: TrainSettings, now: datetime) -> LaunchPlan:
    """The next attempt: its request, and the state that records it."""
    if state.next_action != "launch_new" or state.outcome is not None:
        raise StateCorrupted(
            f"next_action: launch needs 'launch_new' and no outcome, got {state.next_action!r} "
            f"(outcome {state.outcome!r})"
        )
    number = len(state.attempts) + 1
    request = build_create_training_job(state, settings, number)
    s = state.model_copy(deep=True)
    attempt = Attempt(
        number=number,
        job_name=request["TrainingJobName"],
        run_spec=s.run_spec,
        checkpoint_s3_uri=checkpoint_uri(settings.bucket, s.execution.name, number),
        resumed_from=s.resume_from,
        started_at=now,
    )
    s.attempts.append(attempt)
    s.history.latest_job_name = attempt.job_name
    s.next_action = "monitor"
    s.job_status = "InProgress"
    s.rule_status = None
    s.resume_from = None
    return LaunchPlan(s, request, attempt, notifications.launched(s, attempt))
