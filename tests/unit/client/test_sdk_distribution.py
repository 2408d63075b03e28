"""A multi-instance SDK estimator (``instance_count`` 2, ``distribution`` torch_distributed or
pytorchddp) goes in as it is: the CreateTrainingJob request the workflow sends is the one the SDK
itself sends for the same estimator, read from a SageMaker session whose client is stubbed. What
the workflow does not run is refused naming the SDK attribute or the job field."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from stabilizer.client.sdk import SdkJobError, job_from_sdk

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
sagemaker = pytest.importorskip("sagemaker")
launching = pytest.importorskip("stabilizer_workflow.launch.attempts", reason="the workflow's request builder")
from stabilizer_workflow.errors import InvalidInput  # noqa: E402
from stabilizer_workflow.launch.requests import build_create_training_job  # noqa: E402
from stabilizer_workflow.settings import TrainSettings  # noqa: E402

REGION = "us-east-1"
BUCKET = "sdk-parity-bucket"
ROLE = "arn:aws:iam::123456789012:role/sagemaker-execution"
SETTINGS = {
    "BUCKET": BUCKET,
    "TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:stabilizer",
    "SAGEMAKER_ROLE_ARN": ROLE,
    "TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312",
    "SOURCE_S3_URI": f"s3://{BUCKET}/source/sourcedir.tar.gz",
    "TRAIN_DATA_S3_URI": f"s3://{BUCKET}/data/train",
    "TEST_DATA_S3_URI": f"s3://{BUCKET}/data/test",
    "JOB_NAME_PREFIX": "stabilizer",
    "DEFAULT_INSTANCE_TYPE": "ml.g5.12xlarge",
    "DEBUGGER_RULES_ENABLED": "false",
    "LIBRARY_S3_URI": f"s3://{BUCKET}/library/",
    "DATA_BUCKETS": BUCKET,
    "AWS_REGION": REGION,
}
EXECUTION = {"id": "arn:aws:states:us-east-1:123456789012:execution:stabilizer:run-1", "name": "run-1"}
# What the SDK sends that names the SDK's own job or upload, not the job: the workflow sends its own.
THE_SDKS_OWN = {"sagemaker_job_name", "sagemaker_submit_directory"}


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Any:
    for key, value in {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "fit.py").write_text("print('fit')\n")
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield sagemaker.session.Session(boto_session=boto3.Session(region_name=REGION), default_bucket=BUCKET)


def estimator(session: Any, source, instance_type: str, distribution: dict, version: str = "2.8.0",
              python: str = "py312") -> Any:
    from sagemaker.pytorch import PyTorch

    return PyTorch(entry_point="fit.py", source_dir=str(source), role=ROLE, framework_version=version,
                   py_version=python, instance_type=instance_type, instance_count=2,
                   hyperparameters={"lr": 0.1, "epochs": 3}, distribution=distribution, max_run=3600,
                   sagemaker_session=session)


def sdk_request(session: Any, definition: Any) -> dict[str, Any]:
    """The CreateTrainingJob request ``fit()`` sends, answered by a stubbed client."""
    sent: dict[str, Any] = {}
    client = session.sagemaker_client
    client.meta.events.register("provide-client-params.sagemaker.CreateTrainingJob",
                                lambda params, **_: sent.update(params))
    with Stubber(client) as stubber:
        stubber.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:::training-job/sdk"})
        definition.fit(wait=False, logs=False, job_name="sdk-job")
    return sent


def our_request(definition: Any, submitted: str) -> dict[str, Any]:
    settings = TrainSettings.from_env(SETTINGS)
    job = {**job_from_sdk(definition, region=REGION), "source": submitted}
    state = launching.prepare({"job": job}, EXECUTION, settings)
    return build_create_training_job(state, settings, 1)


@pytest.mark.parametrize(
    ("instance_type", "distribution", "version", "python"),
    [("ml.g5.12xlarge", {"torch_distributed": {"enabled": True}}, "2.8.0", "py312"),
     ("ml.p4d.24xlarge", {"pytorchddp": {"enabled": True}}, "2.2.0", "py310")],
)
def test_a_multi_instance_estimator_is_launched_with_the_request_the_sdk_sends(
        session, tmp_path, instance_type, distribution, version, python):
    definition = estimator(session, tmp_path, instance_type, distribution, version, python)
    theirs = sdk_request(session, definition)
    # The SDK uploads the source under its job's prefix; the client stages it under source/jobs/ of
    # the stack's bucket, where the workflow reads archives (the submit directory is the SDK's own).
    uploaded = json.loads(theirs["HyperParameters"]["sagemaker_submit_directory"])
    ours = our_request(definition, f"s3://{BUCKET}/source/jobs/sdk/{uploaded.rsplit('/', 1)[1]}")
    assert ours["ResourceConfig"]["InstanceCount"] == theirs["ResourceConfig"]["InstanceCount"] == 2
    assert ours["ResourceConfig"]["InstanceType"] == theirs["ResourceConfig"]["InstanceType"]
    assert ours["AlgorithmSpecification"]["TrainingImage"] == theirs["AlgorithmSpecification"]["TrainingImage"]
    expected = {key: value for key, value in theirs["HyperParameters"].items() if key not in THE_SDKS_OWN}
    assert {key: ours["HyperParameters"].get(key) for key in expected} == expected


def test_a_launcher_the_workflow_does_not_run_is_refused_naming_the_sdk_attribute(session, tmp_path):
    definition = estimator(session, tmp_path, "ml.p4d.24xlarge", {"mpi": {"enabled": True, "processes_per_host": 8}})
    with pytest.raises(SdkJobError, match=r"^distribution\.mpi: stabilizer runs torch_distributed and pytorchddp"):
        job_from_sdk(definition)


@pytest.mark.parametrize(
    ("distribution", "instance_type", "expected"),
    [({"mpi": {"enabled": True}}, "ml.g5.12xlarge", "job.distribution.mpi"),
     ({"pytorchddp": {"enabled": True}}, "ml.g5.12xlarge", "job.distribution.pytorchddp: SageMaker's data parallel"),
     ({"torch_distributed": {"enabled": True}, "pytorchddp": {"enabled": True}}, "ml.p4d.24xlarge",
      "job.distribution: ")],
)
def test_the_job_input_refuses_at_validate_input_what_the_workflow_does_not_run(distribution, instance_type,
                                                                                 expected):
    job = {"source": f"s3://{BUCKET}/source/jobs/x/sourcedir.tar.gz", "entry_point": "fit.py",
           "instance_type": instance_type, "instance_count": 2, "distribution": distribution}
    with pytest.raises(InvalidInput, match=re.escape(expected)):
        launching.prepare({"job": job}, EXECUTION, TrainSettings.from_env(SETTINGS))


def test_torch_distributed_on_a_cpu_instance_is_refused_as_the_sdk_refuses_it(session, tmp_path):
    """The SDK's PyTorch estimator refuses torch_distributed on an instance that is neither GPU nor
    Trainium when it picks the image itself (sagemaker.fw_utils.validate_torch_distributed_distribution:
    "Currently torch_distributed is supported only for GPU and Trainium instances"); so does ValidateInput,
    naming the field. With an image of the user's own, neither asks."""
    with pytest.raises(ValueError, match="torch_distributed is supported only for GPU and Trainium instances"):
        estimator(session, tmp_path, "ml.m5.xlarge", {"torch_distributed": {"enabled": True}})
    job = {"source": f"s3://{BUCKET}/source/jobs/x/sourcedir.tar.gz", "entry_point": "fit.py",
           "instance_type": "ml.m5.xlarge", "instance_count": 2,
           "distribution": {"torch_distributed": {"enabled": True}}}
    cpu = SETTINGS["TRAINING_IMAGE_URI"].replace("-gpu-", "-cpu-")
    settings = TrainSettings.from_env({**SETTINGS, "TRAINING_IMAGE_URI": cpu,
                                       "TRAINING_IMAGE_URI_GPU": SETTINGS["TRAINING_IMAGE_URI"]})
    refused = r"^job\.distribution\.torch_distributed: .*GPU and Trainium .*ml\.m5\.xlarge"
    with pytest.raises(InvalidInput, match=refused):
        launching.prepare({"job": job}, EXECUTION, settings)
    launching.prepare({"job": {**job, "instance_type": "ml.g5.12xlarge"}}, EXECUTION, settings)
    own = {**job, "image": cpu}
    from sagemaker.pytorch import PyTorch

    PyTorch(entry_point="fit.py", source_dir=str(tmp_path), role=ROLE, image_uri=cpu, instance_type="ml.m5.xlarge",
            instance_count=2, distribution={"torch_distributed": {"enabled": True}}, sagemaker_session=session)
    launching.prepare({"job": own}, EXECUTION, settings)
