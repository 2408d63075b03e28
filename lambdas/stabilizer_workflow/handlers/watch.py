"""Watch Lambda: park an execution until its job ends, wake it when it does, clean up after
executions that end abnormally (docs/contracts.md, section 5).

Four kinds of event:
- `{"action": "await", "token", "state"}` from the state machine's `AwaitJobChange` task
  (`.waitForTaskToken`): keep the token beside the attempt, and send it back at once if the job
  has already ended (its end event may have come before the token was kept);
- `{"action": "stop_launch", "state"}` from `StopJobOfFailedLaunch`, when `LaunchTrainingJob`
  failed: stop the job its CreateTrainingJob may have created all the same;
- "SageMaker Training Job State Change" (EventBridge): send the kept token, so the execution
  checks the job now instead of at the next timeout;
- "Step Functions Execution Status Change" to FAILED, TIMED_OUT or ABORTED (EventBridge): stop
  the jobs that execution left running and publish what happened when nobody else did.

Thin: each event is parsed into its model at the edge (`stabilizer_workflow.monitoring.watch_events`; a
malformed one raises `StateCorrupted` naming the field), the decisions are in
`stabilizer_workflow.monitoring.watch`. Failures are raised with the names the state machine (or EventBridge's
retry) sees; nothing is returned as an error payload.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stabilizer_workflow.aws import invocation_deadline
from stabilizer_workflow.aws.s3 import TaskTokens, get_s3
from stabilizer_workflow.aws.sagemaker import TrainingJobs, get_sagemaker
from stabilizer_workflow.aws.sns import Notifier, get_sns
from stabilizer_workflow.aws.stepfunctions import Executions, get_stepfunctions
from stabilizer_workflow.errors import StateCorrupted, WorkflowError
from stabilizer_workflow.launch.requests import attempt_prefix, job_name
from stabilizer_workflow.monitoring import watch
from stabilizer_workflow.monitoring.watch_events import (
    AwaitJobChange,
    ExecutionStatusChange,
    StopFailedLaunch,
    TrainingJobStateChange,
    parse_watch_event,
)
from stabilizer_workflow.settings import WatchSettings
from stabilizer_workflow.telemetry import instrumented, logger


@lru_cache(maxsize=1)
def get_settings() -> WatchSettings:
    return WatchSettings.from_env(os.environ)


class Collaborators:
    def __init__(
        self,
        settings: WatchSettings | None = None,
        jobs: TrainingJobs | None = None,
        tokens: TaskTokens | None = None,
        executions: Executions | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.jobs = jobs or TrainingJobs(get_sagemaker())
        self.tokens = tokens or TaskTokens(get_s3())
        self.executions = executions or Executions(get_stepfunctions())
        self.notifier = notifier or Notifier(get_sns(), self.settings.topic_arn)


def park(event: AwaitJobChange, deps: Collaborators) -> dict[str, Any]:
    token = str(event.token)
    attempt = event.state.current
    if attempt is None:
        raise StateCorrupted("attempts: empty; there is no job to wait for")
    uri = watch.token_uri(attempt.checkpoint_s3_uri)
    deps.tokens.put(uri, token, attempt.job_name)
    status = deps.jobs.describe(attempt.job_name).get("TrainingJobStatus")
    if status in watch.TERMINAL_JOB_STATUSES:
        # Its end event may have come and gone before the token was kept: wake now.
        deps.tokens.forget(uri)
        woken = deps.executions.wake(token, {"job_name": attempt.job_name, "status": status})
        logger.info("job already ended; execution woken", job_name=attempt.job_name, status=status, woken=woken)
        return {"parked": False, "job_name": attempt.job_name, "status": status}
    logger.info("execution parked until the job ends", job_name=attempt.job_name, token_uri=uri)
    return {"parked": True, "job_name": attempt.job_name, "status": status}


def wake(detail: TrainingJobStateChange, deps: Collaborators) -> dict[str, Any]:
    ended = watch.job_ended(detail, deps.settings.bucket)
    if ended is None or not watch.in_bucket(ended.attempt_prefix, deps.settings.bucket):
        return {"woken": False, "reason": "not a job of this deployment that ended"}
    uri = watch.attempt_token_uri(ended.attempt_prefix or "")
    token = deps.tokens.read(uri)
    if token is None:
        # Nobody waits (the execution is checking, or ended): its next check will see the job.
        return {"woken": False, "reason": "no parked execution", "job_name": ended.job_name}
    woken = deps.executions.wake(token, {"job_name": ended.job_name, "status": ended.status})
    deps.tokens.forget(uri)
    logger.info("execution woken by the job's end", job_name=ended.job_name, status=ended.status, woken=woken)
    return {"woken": woken, "job_name": ended.job_name, "status": ended.status}


def clean_up(detail: ExecutionStatusChange, deps: Collaborators) -> dict[str, Any]:
    ended = watch.execution_ended(detail)
    running = deps.jobs.running(f"{deps.settings.job_name_prefix}-")
    left = watch.jobs_left_by(running, deps.settings.bucket, ended.name)
    stopped = [name for name in left if deps.jobs.stop(name)]
    error = cause = None
    try:
        described = deps.executions.describe(ended.arn)
        error, cause = described.get("error"), described.get("cause")
    except WorkflowError as problem:
        # Stopping the jobs was the part that costs money; the notification goes out without the cause.
        logger.warning("could not read why the execution ended", error=str(problem))
    note = watch.cleanup_notification(ended, stopped, error, cause)
    if note is not None:
        deps.notifier.publish(note)
    logger.info("cleaned up after an execution", execution=ended.name, status=ended.status, stopped=stopped,
                notified=note is not None)
    return {"stopped": stopped, "notified": note is not None}


def stop_unrecorded(event: StopFailedLaunch, deps: Collaborators) -> dict[str, Any]:
    """`LaunchTrainingJob` failed: stop the job its CreateTrainingJob may have created anyway.

    The launch's error reaches the Catch with the state from before the launch, which does not
    record the new attempt, so the abort would stop only the previous job. A job's name is known
    before it is created (`<prefix>-<execution short id>-<attempt>`, stabilizer_workflow.launch.requests.job_name), so
    whatever the timing (the call timed out, the function was cut off after it, the notification
    failed) a job of that name under this execution's prefix is stopped here.
    """
    state = event.state
    if state.next_action != "launch_new":
        return {"stopped": [], "job_name": None}
    number = len(state.attempts) + 1
    name = job_name(deps.settings.job_name_prefix, state.execution.short_id, number)
    described = deps.jobs.find(name)
    if described is None or not watch.launched_by(described, attempt_prefix(deps.settings.bucket,
                                                                             state.execution.name, number)):
        logger.info("no job was created by the failed launch", job_name=name)
        return {"stopped": [], "job_name": name}
    stopped = described.get("TrainingJobStatus") == "InProgress" and deps.jobs.stop(name)
    logger.warning("stopped the job of a failed launch" if stopped else "the failed launch's job already ended",
                   job_name=name, attempt=number)
    return {"stopped": [name] if stopped else [], "job_name": name}


def handle(event: Any, deps: Collaborators | None = None) -> dict[str, Any]:
    parsed = parse_watch_event(event)
    deps = deps or Collaborators()
    if isinstance(parsed, AwaitJobChange):
        return park(parsed, deps)
    if isinstance(parsed, StopFailedLaunch):
        return stop_unrecorded(parsed, deps)
    if isinstance(parsed, TrainingJobStateChange):
        return wake(parsed, deps)
    return clean_up(parsed, deps)


@instrumented
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation_deadline(context)
    return handle(event)
