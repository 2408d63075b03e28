"""The Lambda environment's names have one home (stabilizer_workflow.environment): each function's
settings read every field from it, and the deployment sets what the functions need."""

from __future__ import annotations

import pytest

from stabilizer_workflow import environment
from stabilizer_workflow.errors import MisconfiguredEnvironment
from stabilizer_workflow.settings import MonitorSettings, TrainSettings, WatchSettings


@pytest.mark.parametrize(("function", "model"),
                         [("monitor", MonitorSettings), ("watch", WatchSettings), ("train", TrainSettings)])
def test_every_setting_of_a_function_is_read_from_a_variable_named_there(function, model):
    assert set(environment.FUNCTIONS[function]) == set(model.model_fields)


def test_a_missing_variable_is_named_by_the_name_from_its_home():
    with pytest.raises(MisconfiguredEnvironment, match=f"{environment.TOPIC_ARN} is not set"):
        MonitorSettings.from_env({})


def test_the_region_falls_back_to_the_default_region_variable():
    settings = WatchSettings.from_env({environment.BUCKET: "bkt", environment.TOPIC_ARN: "arn:t"})
    assert settings.bucket == "bkt"
    base = {environment.BUCKET: "bkt", environment.TOPIC_ARN: "arn:aws:sns:eu-west-1:1:t",
            environment.SAGEMAKER_ROLE_ARN: "arn:aws:iam::123456789012:role/r",
            environment.TRAINING_IMAGE_URI: "img", environment.SOURCE_S3_URI: "s3://bkt/source/s.tar.gz",
            environment.TRAIN_DATA_S3_URI: "s3://bkt/data/train/", environment.TEST_DATA_S3_URI: "s3://bkt/data/test/"}
    assert TrainSettings.from_env({**base, environment.AWS_DEFAULT_REGION: "eu-west-1"}).region == "eu-west-1"
    assert TrainSettings.from_env({**base, environment.AWS_REGION: "eu-west-2",
                                   environment.AWS_DEFAULT_REGION: "eu-west-1"}).region == "eu-west-2"


def test_what_a_deployment_sets_is_what_the_functions_read_less_the_optional_and_the_runtimes():
    assert environment.deployed("monitor") == {environment.TOPIC_ARN, environment.POWERTOOLS_SERVICE_NAME}
    assert environment.AWS_REGION not in environment.deployed("train")
    assert set().union(*(names.values() for names in environment.FUNCTIONS.values())) >= environment.OPTIONAL
