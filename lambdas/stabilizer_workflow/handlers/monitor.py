"""Monitor Lambda: `check` looks at the current training job once and decides what follows,
`abort` stops it and reports the failure the state machine caught (docs/contracts.md, 4).

Thin: gather the observation (DescribeTrainingJob, findings.json, checkpoint list and, while the job
trains, its progress.json and the newest loss line in its metric stream; stragglers.json), call the pure
decision in `stabilizer_workflow.monitoring.monitor`, carry out its effects (stop jobs, publish one notification),
return the state. Failures are raised with the names the state machine catches.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from stabilizer_workflow.aws import invocation_deadline
from stabilizer_workflow.aws.cloudwatch import MetricStreams, get_cloudwatch
from stabilizer_workflow.aws.s3 import Artifacts, get_s3
from stabilizer_workflow.aws.sagemaker import TrainingJobs, get_sagemaker
from stabilizer_workflow.aws.sns import Notifier, get_sns
from stabilizer_workflow.errors import StateCorrupted, WorkflowError
from stabilizer_workflow.evidence.observation import Observation, observe
from stabilizer_workflow.execution.state import WorkflowState, dump_state, load_state
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.monitoring.check_results import Effects
from stabilizer_workflow.notifications import Notification, clean_subject
from stabilizer_workflow.remedies import hangs
from stabilizer_workflow.settings import MonitorSettings
from stabilizer_workflow.telemetry import MetricUnit, instrumented, logger, metrics


@lru_cache(maxsize=1)
def get_settings() -> MonitorSettings:
    return MonitorSettings.from_env(os.environ)


class Collaborators:
    """The adapters one invocation uses; defaults are the cached boto3 clients."""

    def __init__(
        self,
        settings: MonitorSettings | None = None,
        jobs: TrainingJobs | None = None,
        artifacts: Artifacts | None = None,
        notifier: Notifier | None = None,
        streams: MetricStreams | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.jobs = jobs or TrainingJobs(get_sagemaker())
        self.artifacts = artifacts or Artifacts(get_s3())
        self.notifier = notifier or Notifier(get_sns(), self.settings.topic_arn)
        self._streams = streams

    @property
    def streams(self) -> MetricStreams:
        """CloudWatch, created at the first look at a job in training that has a loss metric."""
        if self._streams is None:
            self._streams = MetricStreams(get_cloudwatch(), self.settings.metric_period_seconds)
        return self._streams


def gather(state: WorkflowState, deps: Collaborators, now: datetime) -> Observation:
    attempt = state.current
    if attempt is None:
        raise StateCorrupted("attempts: empty; nothing to monitor")
    description = deps.jobs.describe(attempt.job_name)
    document, unreadable = deps.artifacts.findings(attempt.checkpoint_s3_uri)
    terminal = description.get("TrainingJobStatus") in ("Completed", "Failed", "Stopped")
    if not terminal:
        # SageMaker syncs the checkpoint directory while the job runs, with no promise that an object
        # is never read mid-update: the next check reads it again. Once the job ended, it is a finding.
        unreadable = None
    # Checkpoints matter only once the attempt is over (to resume from the last healthy one).
    keys = deps.artifacts.checkpoint_keys(attempt.checkpoint_s3_uri) if terminal else []
    # While it trains, when it last showed a sign of life (the monitor's own hang check,
    # stabilizer_workflow.remedies.hangs).
    progress = None if terminal else deps.artifacts.progress_time(attempt.checkpoint_s3_uri)
    metric_at, period = None, deps.settings.metric_period_seconds
    started = description.get("TrainingStartTime")
    if not terminal and started is not None and state.job.loss_metric and hangs.monitor_bound(state) is not None:
        metric_at = deps.streams.newest(attempt.job_name, state.job.loss_metric, started, now)
        period = deps.streams.period_seconds
    stragglers = deps.artifacts.stragglers(attempt.checkpoint_s3_uri)
    return observe(description, findings=document, findings_unreadable=unreadable, checkpoint_keys=keys,
                   progress_at=progress, metric_at=metric_at, metric_period_seconds=period, stragglers=stragglers)


def carry_out(effects: Effects, deps: Collaborators) -> None:
    """Stop first (it costs money while it runs), then tell people."""
    if effects.stop_job:
        stopped = deps.jobs.stop(effects.stop_job)
        logger.info(
            "training job stop requested" if stopped else "training job was already over",
            job_name=effects.stop_job,
        )
    for name in effects.stop_processing_jobs:
        stopped = deps.jobs.stop_processing_job(name)
        logger.info(
            "rule evaluation job stopped" if stopped else "rule evaluation job was already over",
            processing_job_name=name,
        )
    if effects.release_warm_pool:
        released = deps.jobs.release_warm_pool(effects.release_warm_pool)
        logger.info("warm pool released" if released else "no warm pool left to release",
                    job_name=effects.release_warm_pool)
    if effects.notification is not None:
        _publish(effects.notification, deps)


def _publish(notification: Notification, deps: Collaborators) -> None:
    deps.notifier.publish(notification)
    logger.info("notification published", event_type=notification.event_type, subject=notification.subject)
    metrics.add_metric(name=f"Event_{notification.event_type}", unit=MetricUnit.Count, value=1)


def check(event: dict[str, Any], deps: Collaborators, now: datetime) -> dict[str, Any]:
    state = load_state(event.get("state"))
    observation = gather(state, deps, now)
    result = monitor.check(state, observation, now)
    carry_out(result.effects, deps)
    metrics.add_metric(name="Checks", unit=MetricUnit.Count, value=1)
    new = result.state
    logger.info(
        "checked training job",
        job_name=observation.job_name,
        job_status=observation.status,
        rule_status=new.rule_status,
        next_action=new.next_action,
        outcome=new.outcome,
        reason=new.reason,
    )
    return dump_state(new)


def _abort_unreadable(event: dict[str, Any], deps: Collaborators, corrupted: StateCorrupted) -> None:
    """The state itself is broken: still stop the job it names and tell someone, then re-raise."""
    raw = event.get("state") if isinstance(event.get("state"), dict) else {}
    job_name = (raw.get("history") or {}).get("latest_job_name")
    execution = str((raw.get("execution") or {}).get("name") or "unknown")
    if isinstance(job_name, str) and job_name:
        deps.jobs.stop(job_name)
    caught = (event.get("error") or {}).get("Error", "Error")
    body = (
        f"Execution: {execution}\n\nThe state machine caught {caught} and the state payload does not "
        f"validate, so the execution ends without its history.\nState problem: {corrupted}\n"
        f"Training job stopped: {job_name or 'none recorded'}"
    )
    note = Notification(
        "failed",
        clean_subject(f"Failed: {caught}; state payload unreadable"),
        body,
        {"event_type": "failed", "execution": execution, "outcome": "failed"},
    )
    _publish(note, deps)


def abort(event: dict[str, Any], deps: Collaborators, now: datetime) -> dict[str, Any]:
    try:
        state = load_state(event.get("state"))
    except StateCorrupted as corrupted:
        _abort_unreadable(event, deps, corrupted)
        raise
    observation = None
    if state.current is not None:
        try:
            observation = gather(state, deps, now)
        except WorkflowError as error:
            # The failure path must still stop the job and tell someone; stop it blind.
            logger.warning("could not describe the job while aborting", error=str(error))
    result = monitor.abort(state, event.get("error"), observation, now)
    failures: list[WorkflowError] = []
    try:
        carry_out(Effects(result.effects.stop_job, result.effects.stop_processing_jobs), deps)
    except WorkflowError as error:
        failures.append(error)
    if result.effects.notification is not None:
        _publish(result.effects.notification, deps)
    if failures:
        raise failures[0]
    metrics.add_metric(name="Aborts", unit=MetricUnit.Count, value=1)
    logger.info("execution aborted", reason=result.state.reason)
    return dump_state(result.state)


def handle(
    event: dict[str, Any], deps: Collaborators | None = None, now: datetime | None = None
) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise StateCorrupted(f"event: expected a JSON object, got {type(event).__name__}")
    action = event.get("action")
    if action not in ("check", "abort"):
        raise StateCorrupted(f"action: expected 'check' or 'abort', got {action!r}")
    deps = deps or Collaborators()
    now = now or datetime.now(UTC)
    return check(event, deps, now) if action == "check" else abort(event, deps, now)


@instrumented
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation_deadline(context)
    return handle(event)
