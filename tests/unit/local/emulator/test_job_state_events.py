"""The local engine's job-end event has the shape SageMaker's has (tests/events/README.md): no
member DescribeTrainingJob alone returns, so the watch function is tried on what AWS sends."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from stabilizer.local.emulator.job_state_events import job_state_change

EVENTS = Path(__file__).resolve().parents[3] / "events"
T0 = dt.datetime(2026, 11, 25, 9, 0, tzinfo=dt.UTC)


def _documented() -> dict:
    return json.loads((EVENTS / "sagemaker-training-job-state-change.json").read_text())


def _described() -> dict:
    """A DescribeTrainingJob response of a failed local job, with the members the event lacks."""
    return {
        "TrainingJobName": "stabilizer-0a1b2c3d-1",
        "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/stabilizer-0a1b2c3d-1",
        "TrainingJobStatus": "Failed",
        "SecondaryStatus": "Failed",
        "FailureReason": "AlgorithmError: exit 86",
        "HyperParameters": {"learning_rate": "0.1"},
        "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/r",
        "InputDataConfig": [],
        "OutputDataConfig": {"S3OutputPath": "s3://b/executions/e/attempt-1/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/executions/e/attempt-1/output/model.tar.gz"},
        "CreationTime": T0,
        "LastModifiedTime": T0,
        "TrainingEndTime": T0,
        "SecondaryStatusTransitions": [{"Status": "Failed", "StartTime": T0, "StatusMessage": "failed"}],
        "CheckpointConfig": {"S3Uri": "s3://b/executions/e/attempt-1/checkpoints"},
        "Environment": {"PYTHONPATH": "/opt/ml/input/data/stabilizer"},
        "DebugRuleEvaluationStatuses": [],
        "EnableNetworkIsolation": False,
        "FinalMetricDataList": [],
    }


def test_the_local_job_end_event_carries_only_what_sagemakers_event_carries():
    documented = _documented()
    tags = [{"Key": "stabilizer:execution", "Value": "e"}, {"Key": "stabilizer:attempt", "Value": "1"}]
    event = job_state_change(_described(), tags, account="123456789012", region="us-east-1", now=T0)
    assert set(event) == set(documented)
    assert event["detail-type"] == documented["detail-type"] and event["source"] == documented["source"]
    # The page's example members, FailureReason (a failed job's, per the page) and ModelArtifacts (the schema).
    assert set(event["detail"]) <= set(documented["detail"]) | {"FailureReason", "ModelArtifacts"}
    for describe_only in ("CheckpointConfig", "Environment", "DebugRuleEvaluationStatuses", "FinalMetricDataList"):
        assert describe_only not in event["detail"]
    assert event["detail"]["Tags"] == {"stabilizer:execution": "e", "stabilizer:attempt": "1"}
    assert event["detail"]["CreationTime"] == str(round(T0.timestamp() * 1000))
    assert isinstance(documented["detail"]["CreationTime"], str)
    json.dumps(event)  # plain JSON, as EventBridge delivers it
