"""An SDK estimator with managed spot training (``use_spot_instances=True``, ``max_wait``,
``checkpoint_s3_uri``) goes in as it is, and the workflow asks SageMaker for spot as the SDK's own
``fit()`` does: ``EnableManagedSpotTraining`` and ``StoppingCondition.MaxWaitTimeInSeconds``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_sdk_distribution import BUCKET, ROLE, our_request, sdk_request, session  # noqa: F401 - the fixture

from stabilizer.client.sdk import job_from_sdk

sagemaker = pytest.importorskip("sagemaker")


def spot_estimator(session: Any, source, **spot: Any) -> Any:  # noqa: F811
    from sagemaker.pytorch import PyTorch

    return PyTorch(entry_point="fit.py", source_dir=str(source), role=ROLE, framework_version="2.8.0",
                   py_version="py312", instance_type="ml.g5.12xlarge", instance_count=1,
                   hyperparameters={"lr": 0.1}, max_run=3600, sagemaker_session=session, **spot)


def test_a_spot_estimator_is_launched_with_the_spot_request_the_sdk_sends(session, tmp_path):  # noqa: F811
    definition = spot_estimator(session, tmp_path, use_spot_instances=True, max_wait=7200,
                                checkpoint_s3_uri=f"s3://{BUCKET}/my-checkpoints")
    theirs = sdk_request(session, definition)
    uploaded = json.loads(theirs["HyperParameters"]["sagemaker_submit_directory"])
    ours = our_request(definition, f"s3://{BUCKET}/source/jobs/sdk/{uploaded.rsplit('/', 1)[1]}")
    assert ours["EnableManagedSpotTraining"] is theirs["EnableManagedSpotTraining"] is True
    assert ours["StoppingCondition"] == theirs["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600,
                                                                        "MaxWaitTimeInSeconds": 7200}
    # The SDK checkpoints where checkpoint_s3_uri says; each attempt checkpoints under its execution.
    assert theirs["CheckpointConfig"]["S3Uri"] == f"s3://{BUCKET}/my-checkpoints"
    assert ours["CheckpointConfig"]["S3Uri"].endswith("/attempt-1/checkpoints")
    job = job_from_sdk(definition)
    assert (job["use_spot_instances"], job["max_wait_seconds"], job["checkpoint_s3_uri"]) == (
        True, 7200, f"s3://{BUCKET}/my-checkpoints")


def test_an_on_demand_estimator_stays_on_demand(session, tmp_path):  # noqa: F811
    job = job_from_sdk(spot_estimator(session, tmp_path))
    assert "use_spot_instances" not in job and "max_wait_seconds" not in job
