"""`{}` on a freshly deployed stack: no data yet. The first launch says what to upload where,
before any training job exists, instead of a job failing minutes later."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from stabilizer_workflow.aws import s3 as aws_s3
from stabilizer_workflow.aws import sagemaker as aws_sagemaker
from stabilizer_workflow.errors import TrainingDataMissing
from stabilizer_workflow.execution.state import dump_state
from stabilizer_workflow.handlers import train as train_handler
from stabilizer_workflow.launch.attempts import prepare
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, EXECUTION, T0


@pytest.fixture
def empty_stack(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=ENV["BUCKET"])
        yield s3


def _launch(s3, settings):
    state = dump_state(prepare({}, EXECUTION, settings))
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(sagemaker) as stub:  # no response queued: any SageMaker call would fail the test
        train_handler.handle({"action": "launch", "state": state}, settings=settings,
                             jobs=aws_sagemaker.TrainingJobs(sagemaker), artifacts=aws_s3.Artifacts(s3), now=T0)
        stub.assert_no_pending_responses()


def test_a_fresh_stack_says_what_to_upload_where_before_launching(empty_stack):
    settings = TrainSettings.from_env(ENV)
    with pytest.raises(TrainingDataMissing) as error:
        _launch(empty_stack, settings)
    message = str(error.value)
    assert "channel train: nothing under s3://stabilizer-bucket/data/train" in message
    assert "channel test: nothing under s3://stabilizer-bucket/data/test" in message
    assert "x.npy and y.npy" in message and "data.py cifar10" in message


def test_one_channel_uploaded_names_only_the_other(empty_stack):
    empty_stack.put_object(Bucket=ENV["BUCKET"], Key="data/train/x.npy", Body=b"x")
    with pytest.raises(TrainingDataMissing) as error:
        _launch(empty_stack, TrainSettings.from_env(ENV))
    assert "channel test" in str(error.value) and "channel train" not in str(error.value)
