"""The watch function's decisions: where a parked execution's task token is kept, which job an
EventBridge event is about, which jobs an ended execution left running, and what to tell people.

Pure: events (parsed at the handler's edge, stabilizer_workflow.monitoring.watch_events) and descriptions in,
names and notifications out. The AWS calls are the handler's (`stabilizer_workflow/handlers/watch.py`).
Event shapes, from the EventBridge events reference:
- "SageMaker Training Job State Change": `detail` is a part of the job's DescribeTrainingJob
  response: `TrainingJobName`, `TrainingJobStatus`, `OutputDataConfig`, `HyperParameters`,
  `Tags` (a map), ... but no `CheckpointConfig` (AWS's page "Events that Amazon SageMaker AI
  sends to Amazon EventBridge", section "Training job state change", and the EventBridge schema
  `aws.sagemaker@SageMakerTrainingJobStateChange`; tests/events/README.md). The attempt is found
  from `OutputDataConfig.S3OutputPath`, which the train function sets to
  `s3://<bucket>/executions/<execution>/attempt-<n>/output`, or else from the job's
  `stabilizer:execution` and `stabilizer:attempt` tags;
- "Step Functions Execution Status Change": `detail` has `executionArn`, `stateMachineArn`,
  `name`, `status`, `startDate`, `stopDate`, `input`, `output` (no error or cause: the handler
  asks DescribeExecution for those).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stabilizer_workflow.monitoring.watch_events import ExecutionStatusChange, TrainingJobStateChange
from stabilizer_workflow.notifications import Notification, clean_subject

TOKEN_FILE = "wake-token.json"
TERMINAL_JOB_STATUSES = ("Completed", "Failed", "Stopped")
# Errors no Catch can handle (States.ALL does not match them), so the definition's own failure
# path never ran and nobody was told (Step Functions developer guide, "Error handling").
UNCATCHABLE_ERRORS = ("States.Runtime", "States.DataLimitExceeded")


# OutputDataConfig.S3OutputPath is <attempt prefix>/output (stabilizer_workflow.launch.requests).
OUTPUT_FOLDER = "output"


def token_uri(checkpoint_s3_uri: str) -> str:
    """`s3://b/executions/<e>/attempt-<n>/checkpoints` -> `s3://b/executions/<e>/attempt-<n>/wake-token.json`.

    Beside the checkpoints, not in them: SageMaker mirrors the job's checkpoint directory to S3,
    deletions included, and this file is not the job's.
    """
    return attempt_token_uri(checkpoint_s3_uri.rstrip("/").rsplit("/", 1)[0])


def attempt_token_uri(attempt_prefix: str) -> str:
    """`s3://b/executions/<e>/attempt-<n>` -> its `wake-token.json`."""
    return f"{attempt_prefix.rstrip('/')}/{TOKEN_FILE}"


@dataclass(frozen=True)
class JobEnded:
    job_name: str
    status: str
    attempt_prefix: str | None  # s3://<bucket>/executions/<execution>/attempt-<n>, None when not ours


@dataclass(frozen=True)
class ExecutionEnded:
    arn: str
    name: str
    status: str


def attempt_of(detail: TrainingJobStateChange, bucket: str) -> str | None:
    """`s3://<bucket>/executions/<execution>/attempt-<n>` of the job an event is about, from what the
    event carries: its output path, else its tags. None when neither says (not this workflow's job)."""
    output = detail.output_path
    if output is not None:
        prefix, _, last = output.rstrip("/").rpartition("/")
        if last == OUTPUT_FOLDER and prefix.rsplit("/", 1)[-1].startswith("attempt-"):
            return prefix
    tags = detail.tag_map
    execution, attempt = tags.get("stabilizer:execution"), tags.get("stabilizer:attempt")
    if execution and attempt and attempt.isdigit():
        return f"s3://{bucket}/executions/{execution}/attempt-{attempt}"
    return None


def job_ended(detail: TrainingJobStateChange, bucket: str) -> JobEnded | None:
    """The job's end, when the event reports one (SageMaker also reports InProgress changes)."""
    if detail.training_job_status not in TERMINAL_JOB_STATUSES:
        return None
    return JobEnded(detail.training_job_name, detail.training_job_status, attempt_of(detail, bucket))


def launched_by(description: dict[str, Any], attempt_prefix: str) -> bool:
    """Whether a described job is the one this execution's attempt launched: its output path lies
    under that attempt's prefix (another deployment with the same job-name prefix writes elsewhere)."""
    output = str((description.get("OutputDataConfig") or {}).get("S3OutputPath", ""))
    return output.rstrip("/") == f"{attempt_prefix.rstrip('/')}/{OUTPUT_FOLDER}"


def execution_ended(detail: ExecutionStatusChange) -> ExecutionEnded:
    return ExecutionEnded(detail.execution_arn, detail.name, detail.status)


def in_bucket(uri: str | None, bucket: str) -> bool:
    return bool(uri) and uri.startswith(f"s3://{bucket}/")


def jobs_left_by(descriptions: list[dict[str, Any]], bucket: str, execution_name: str) -> list[str]:
    """The running jobs of one execution: their checkpoints live under executions/<name>/ of our bucket.

    Execution names are unique per state machine for 90 days; the bucket tells this deployment's
    jobs from another's with the same job-name prefix.
    """
    prefix = f"s3://{bucket}/executions/{execution_name}/"
    return [
        d["TrainingJobName"]
        for d in descriptions
        if str((d.get("CheckpointConfig") or {}).get("S3Uri", "")).startswith(prefix)
    ]


def cleanup_notification(
    ended: ExecutionEnded, stopped: list[str], error: str | None, cause: str | None
) -> Notification | None:
    """What to tell people after an execution ended abnormally; None when its own path already did.

    A FAILED execution went through the definition's Catch, which stopped the job and published,
    unless the error was uncatchable; a TIMED_OUT or ABORTED one ran no state at all. Any job
    this function had to stop is news in every case.
    """
    uncaught = ended.status != "FAILED" or (error or "") in UNCATCHABLE_ERRORS
    if not stopped and not uncaught:
        return None
    what = {"TIMED_OUT": "timed out", "ABORTED": "was aborted", "FAILED": "failed"}.get(
        ended.status, ended.status.lower()
    )
    jobs = ", ".join(stopped) if stopped else "none was running"
    lines = [
        f"Execution: {ended.name}",
        "",
        f"The execution {what}" + (f" ({error}: {' '.join((cause or '').split())[:300]})" if error else "") + ".",
        f"Training jobs stopped after it ended: {jobs}",
        "",
        f"Execution ARN: {ended.arn}",
    ]
    subject = f"Execution {what}" + (f"; stopped {len(stopped)} job(s) it left running" if stopped else "")
    return Notification(
        "failed",
        clean_subject(subject),
        "\n".join(lines),
        {"event_type": "failed", "execution": ended.name, "outcome": "failed"},
    )
