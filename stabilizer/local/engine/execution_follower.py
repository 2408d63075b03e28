"""Following one local execution to its end: what happened, as it happens, into a RunRecord.

The follower polls the execution's history (the states entered, the state payload they carried),
the training jobs that belong to it (each job's log for its plan, loss and gradient norm; its
``findings.json``; its status and rule verdicts) and the mailbox (the SNS notifications sent for
it), fills the execution's ``RunRecord`` and tells an observer each thing as an ``EngineEvent``.

It only watches: it starts nothing and decides nothing. Starting the engine and the execution is
``stabilizer.local.engine.engine``'s part.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabilizer.local.emulator.sagemaker import LocalSageMaker
from stabilizer.local.emulator.training_job import LocalTrainingJob
from stabilizer.mailbox import Mailbox
from stabilizer.reports.records import (
    AttemptRecord,
    EvalPoint,
    MetricPoint,
    Notification,
    RunRecord,
    TrainingPlan,
    parse_log_line,
)


@dataclass
class EngineEvent:
    """Something the follower observed; ``kind`` says which fields are set."""

    kind: str  # state | notification | job | plan | metric | eval | finding | rules
    attempt: AttemptRecord | None = None
    state: str | None = None
    notification: Notification | None = None
    metric: MetricPoint | None = None
    evaluation: EvalPoint | None = None
    detail: str | None = None


Observer = Callable[[EngineEvent], None]


def unobserved(event: EngineEvent) -> None:
    """The observer of a caller that wants only the record."""


def failure_message(cause: str | None) -> str | None:
    """What a failure's ``cause`` says, in words: a Lambda error's cause is its JSON error object
    (``{"errorType", "errorMessage", "stackTrace"}``), of which the message is what a person reads."""
    if not cause:
        return None
    try:
        payload = json.loads(cause)
    except ValueError:
        return cause
    if isinstance(payload, dict) and isinstance(payload.get("errorMessage"), str):
        return payload["errorMessage"]
    return cause


def state_payload(text: str) -> dict[str, Any] | None:
    """The workflow state in a state's output: ``{"state": {...}}`` between steps, bare at the end."""
    try:
        payload = json.loads(text)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    inner = payload.get("state")
    if isinstance(inner, dict):
        return inner
    return payload if "attempts" in payload else None


@dataclass
class _Tail:
    """The lines a growing file gained since the last read."""

    path: Path
    offset: int = 0
    partial: str = ""

    def lines(self) -> list[str]:
        if not self.path.is_file():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        text = self.partial + chunk.decode(errors="replace")
        *complete, self.partial = text.split("\n")
        return complete


@dataclass
class ExecutionFollower:
    """One execution being followed: what has been seen of it so far."""

    sfn: Any
    sagemaker: LocalSageMaker | None
    mailbox: Mailbox
    record: RunRecord
    emit: Observer = unobserved
    started: float = field(default_factory=time.monotonic)
    seen_events: int = 0
    tails: dict[str, _Tail] = field(default_factory=dict)
    job_status: dict[str, str] = field(default_factory=dict)
    findings_mtime: dict[str, int] = field(default_factory=dict)
    rule_verdicts: dict[str, str] = field(default_factory=dict)
    known_jobs: set[str] = field(init=False)  # the jobs there were before: earlier executions'

    def __post_init__(self) -> None:
        self.known_jobs = set(self.sagemaker.jobs) if self.sagemaker else set()

    def follow(
        self,
        *,
        poll_seconds: float = 0.25,
        interrupt: threading.Event | None = None,
        on_interrupt: Callable[[], object] = lambda: None,
    ) -> RunRecord:
        """Poll until the execution ends (``on_interrupt`` runs once ``interrupt`` is set); the record."""
        arn = self.record.execution_arn
        while True:
            described = self.sfn.describe_execution(executionArn=arn)
            self.poll()
            if described["status"] != "RUNNING":
                break
            if interrupt is not None and interrupt.is_set():
                self.record.interrupted = True
                on_interrupt()
                continue
            time.sleep(poll_seconds)
        # One more pass: the last notification and the final job state may land with the end.
        time.sleep(min(poll_seconds, 0.2))
        self.poll()
        record = self.record
        record.status = described["status"]
        record.error = described.get("error")
        record.cause = described.get("cause")
        if described.get("output"):
            record.state = state_payload(described["output"]) or record.state
        record.wall_seconds = time.monotonic() - self.started
        return record

    def poll(self) -> None:
        self._poll_history()
        self._poll_jobs()
        self._poll_notifications()

    def _poll_history(self) -> None:
        events = self.sfn.get_execution_history(executionArn=self.record.execution_arn)["events"]
        for event in events[self.seen_events :]:
            entered = event.get("stateEnteredEventDetails")
            if entered and event["type"].endswith("StateEntered"):
                self.record.states.append(entered["name"])
                self.emit(EngineEvent(kind="state", state=entered["name"], detail=event["type"]))
            exited = event.get("stateExitedEventDetails") or event.get("executionSucceededEventDetails")
            if exited and exited.get("output"):
                payload = state_payload(exited["output"])
                if payload is not None:
                    self.record.state = payload
            failed = event.get("taskFailedEventDetails")
            if failed:
                why = failure_message(failed.get("cause")) or "no cause given"
                self.emit(EngineEvent(kind="state", state=None, detail=f"{failed.get('error')}: {why}"))
        self.seen_events = len(events)

    def _poll_jobs(self) -> None:
        if self.sagemaker is None:
            return
        record = self.record
        jobs = [job for job in self.sagemaker.jobs.values() if _job_of(job, record.name, self.known_jobs)]
        for number, job in enumerate(jobs, start=1):
            if len(record.attempts) < number:
                attempt = AttemptRecord(
                    number=number,
                    job_name=job.name,
                    hyperparameters=dict(job.request.get("HyperParameters", {})),
                    checkpoint_dir=str(job.checkpoint_dir),
                    checkpoint_uri=job.request.get("CheckpointConfig", {}).get("S3Uri"),
                    tensor_store=str(job.checkpoint_dir / "tensors"),
                )
                record.attempts.append(attempt)
                self.tails[job.name] = _Tail(job.log_path)
            attempt = record.attempts[number - 1]
            self._read_log(job, attempt)
            self._poll_findings(job, attempt)
            with job.lock:
                status = (job.status, job.secondary_status)
                attempt.status, attempt.secondary_status = status
                attempt.failure_reason = job.failure_reason
                attempt.seconds = job.seconds
                if job.rules is not None:
                    attempt.rule_statuses = job.rules.statuses()
            verdicts = ", ".join(
                f"{r['RuleConfigurationName']}={r['RuleEvaluationStatus']}" for r in attempt.rule_statuses
            )
            if verdicts and self.rule_verdicts.get(job.name) != verdicts:
                self.rule_verdicts[job.name] = verdicts
                self.emit(EngineEvent(kind="rules", attempt=attempt, detail=verdicts))
            if self.job_status.get(job.name) != f"{status}":
                self.job_status[job.name] = f"{status}"
                self.emit(EngineEvent(kind="job", attempt=attempt, detail=f"{status[0]}/{status[1]}"))

    def _read_log(self, job: LocalTrainingJob, attempt: AttemptRecord) -> None:
        for line in self.tails[job.name].lines():
            point = parse_log_line(line)
            if isinstance(point, MetricPoint):
                attempt.metrics.append(point)
                self.emit(EngineEvent(kind="metric", attempt=attempt, metric=point))
            elif isinstance(point, EvalPoint):
                attempt.evals.append(point)
                self.emit(EngineEvent(kind="eval", attempt=attempt, evaluation=point))
            elif isinstance(point, TrainingPlan):
                attempt.plan = point
                self.emit(EngineEvent(kind="plan", attempt=attempt))

    def _poll_findings(self, job: LocalTrainingJob, attempt: AttemptRecord) -> None:
        path = job.checkpoint_dir / "findings.json"
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if self.findings_mtime.get(job.name) == mtime:
            return
        try:
            attempt.findings = json.loads(path.read_text())
        except ValueError:
            return  # written by rename, so a partial read means it is being replaced; next poll
        self.findings_mtime[job.name] = mtime
        self.emit(EngineEvent(kind="finding", attempt=attempt))

    def _poll_notifications(self) -> None:
        # One queue serves every execution of this engine: drain it, then take this execution's messages.
        self.mailbox.drain()
        record = self.record
        for letter in self.mailbox.for_execution(record.name, record.execution_arn, take=True):
            note = letter.notification(since=self.started)
            record.notifications.append(note)
            self.emit(EngineEvent(kind="notification", notification=note))


def _job_of(job: LocalTrainingJob, execution: str, known_before: set[str]) -> bool:
    """Whether a job belongs to an execution: its checkpoints live under executions/<name>/."""
    uri = job.request.get("CheckpointConfig", {}).get("S3Uri")
    if uri:
        return f"/executions/{execution}/" in uri
    return job.name not in known_before
