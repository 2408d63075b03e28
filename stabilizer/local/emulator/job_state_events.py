"""The "SageMaker Training Job State Change" event, built as SageMaker sends it to EventBridge.

AWS's page "Events that Amazon SageMaker AI sends to Amazon EventBridge" (section "Training job
state change") and the EventBridge schema `aws.sagemaker@SageMakerTrainingJobStateChange` give
the event's `detail`: a subset of DescribeTrainingJob's response, with the times as epoch
milliseconds in strings and `Tags` as a map of key to value; `FailureReason` when the job
failed. No `CheckpointConfig`, `Environment` or Debugger fields: code that needs those must ask
DescribeTrainingJob. The local engine sends only this shape, so the watch function is tried on
what the cloud gives it (tests/events/sagemaker-training-job-state-change.json is the shape).

Pure: a DescribeTrainingJob response and the job's request in, the event out.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

DETAIL_TYPE = "SageMaker Training Job State Change"
SOURCE = "aws.sagemaker"
# The detail's members in the page's example and the schema (ModelArtifacts), nothing else.
DETAIL_KEYS = (
    "TrainingJobName",
    "TrainingJobArn",
    "TrainingJobStatus",
    "SecondaryStatus",
    "FailureReason",
    "HyperParameters",
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "ModelArtifacts",
    "CreationTime",
    "TrainingStartTime",
    "TrainingEndTime",
    "LastModifiedTime",
    "SecondaryStatusTransitions",
    "Tags",
)
_TIMES = ("CreationTime", "TrainingStartTime", "TrainingEndTime", "LastModifiedTime")


def _millis(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return str(round(value.timestamp() * 1000))
    return str(value)


def _plain(value: Any) -> Any:
    """JSON-ready: datetimes inside (status transitions) become epoch-millisecond strings."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime):
        return _millis(value)
    return value


def job_state_change(
    description: dict[str, Any], tags: list[dict[str, str]], *, account: str, region: str,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """The event for a job whose DescribeTrainingJob response is `description`, created with `tags`."""
    detail: dict[str, Any] = {key: _plain(description[key]) for key in DETAIL_KEYS if key in description}
    for key in _TIMES:
        if key in description:
            detail[key] = _millis(description[key])
    detail["Tags"] = {tag["Key"]: tag["Value"] for tag in tags}
    stamp = (now or dt.datetime.now(tz=dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": DETAIL_TYPE,
        "source": SOURCE,
        "account": account,
        "time": stamp,
        "region": region,
        "resources": [description["TrainingJobArn"]],
        "detail": detail,
    }
