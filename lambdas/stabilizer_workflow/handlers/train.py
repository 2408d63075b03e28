"""Train Lambda: `prepare` turns the execution input into the first state, `launch` starts the
next attempt's training job (docs/contracts.md, section 4).

Thin: parse the event, call one pure function from `workflow`, carry out its effects through
the adapters, return the state. Failures are raised with the names the state machine catches,
never returned as a payload.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stabilizer_workflow.aws import invocation_deadline
from stabilizer_workflow.aws.s3 import Artifacts, empty_channels, get_s3, missing_data_message
from stabilizer_workflow.aws.sagemaker import TrainingJobs, get_sagemaker
from stabilizer_workflow.aws.sns import Notifier, get_sns
from stabilizer_workflow.aws.stepfunctions import Executions, get_stepfunctions
from stabilizer_workflow.errors import AccessDenied, StateCorrupted, TrainingDataMissing
from stabilizer_workflow.execution.state import dump_state, load_state
from stabilizer_workflow.launch.attempts import ArchiveReader, launch, prepare
from stabilizer_workflow.launch.sources import SourceArchives
from stabilizer_workflow.settings import TrainSettings
from stabilizer_workflow.telemetry import MetricUnit, instrumented, logger, metrics


@lru_cache(maxsize=1)
def get_settings() -> TrainSettings:
    return TrainSettings.from_env(os.environ)


def handle(
    event: dict[str, Any],
    *,
    settings: TrainSettings | None = None,
    jobs: TrainingJobs | None = None,
    notifier: Notifier | None = None,
    sources: ArchiveReader | None = None,
    artifacts: Artifacts | None = None,
    executions: Executions | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The handler's work with its collaborators injectable; `lambda_handler` uses the defaults.

    With `executions`, a launch checks after CreateTrainingJob that its execution still runs
    (`lambda_handler` always passes it)."""
    if not isinstance(event, dict):
        raise StateCorrupted(f"event: expected a JSON object, got {type(event).__name__}")
    settings = settings or get_settings()
    action = event.get("action")
    if action == "prepare":
        state = prepare(event.get("input"), event.get("execution"), settings, sources or SourceArchives())
        logger.info("execution prepared", execution=state.execution.name, policy=state.policy)
        metrics.add_metric(name="ExecutionsPrepared", unit=MetricUnit.Count, value=1)
        return dump_state(state)
    if action == "launch":
        jobs = jobs or TrainingJobs(get_sagemaker())
        notifier = notifier or Notifier(get_sns(), settings.topic_arn)
        plan = launch(load_state(event.get("state")), settings, now or datetime.now(UTC))
        empty = empty_channels(plan.request, settings.bucket, artifacts or Artifacts(get_s3()))
        if empty:
            # Said now, before any job is created, instead of by a job failing minutes later.
            raise TrainingDataMissing(missing_data_message(empty))
        existing = jobs.create(plan.request)
        if executions is not None and _ended_meanwhile(plan.state, plan.attempt.job_name, jobs, executions):
            return dump_state(plan.state)
        logger.info(
            "training job started" if not existing else "training job already started by an earlier try",
            job_name=plan.attempt.job_name,
            attempt=plan.attempt.number,
            resumed_from=plan.attempt.resumed_from,
        )
        notifier.publish(plan.notification)
        metrics.add_metric(name="AttemptsLaunched", unit=MetricUnit.Count, value=1)
        return dump_state(plan.state)
    raise StateCorrupted(f"action: expected 'prepare' or 'launch', got {action!r}")


def _ended_meanwhile(state: Any, name: str, jobs: TrainingJobs, executions: Executions) -> bool:
    """Stop the new job when its execution ended (aborted, timed out) while this launch ran.

    Step Functions does not stop a running Lambda when its execution ends, and the clean-up on
    the execution's end (the watch function) lists the running jobs once, possibly before this
    call created one. Checked after the create, the two cannot both miss the job.
    """
    try:
        status = executions.status(state.execution.id)
    except AccessDenied as error:
        # A deployment whose role may not describe executions still launches; the watch function's
        # clean-up remains the guard.
        logger.warning("cannot check that the execution still runs", error=str(error), job_name=name)
        return False
    if status in ("RUNNING", ""):
        return False
    stopped = jobs.stop(name)
    logger.warning("the execution ended while its job was being created; job stopped",
                   job_name=name, execution_status=status, stopped=stopped)
    return True


@instrumented
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation_deadline(context)
    action = event.get("action") if isinstance(event, dict) else None
    return handle(event, executions=Executions(get_stepfunctions()) if action == "launch" else None)
