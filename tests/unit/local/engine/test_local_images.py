"""Local mode's functions get the image variables the deployed stack bakes in, resolved from the
SageMaker Python SDK for the local region: a GPU instance type gets the GPU build, `job.image` by
framework and version resolves, and Debugger rules have their rule image."""

from __future__ import annotations

import pytest

from stabilizer.cli.commands import gpu_instance_note
from stabilizer.local.engine.deployment import REGION, LocalSettings
from stabilizer.training_images import PYTORCH_VERSION

EXECUTION = {"id": f"arn:aws:states:{REGION}:123456789012:execution:m:local-1", "name": "local-1"}


def _sdk_training_image(instance_type: str, version: str = PYTORCH_VERSION) -> str:
    from sagemaker import image_uris

    py = image_uris.config_for_framework("pytorch")["training"]["versions"][version]["py_versions"][-1]
    return image_uris.retrieve("pytorch", REGION, version=version, py_version=py, instance_type=instance_type,
                               image_scope="training")


def _prepare(raw_input: dict, settings: LocalSettings):
    from stabilizer_workflow.launch.attempts import prepare
    from stabilizer_workflow.settings import TrainSettings

    train = TrainSettings.from_env({**settings.lambda_environment(), "AWS_REGION": REGION})
    return prepare(raw_input, EXECUTION, train), train


def test_local_functions_get_the_cpu_gpu_and_debugger_images_the_sdk_names():
    from sagemaker import image_uris

    plain = LocalSettings().lambda_environment()
    assert plain["TRAINING_IMAGE_URI"] == _sdk_training_image("ml.m5.xlarge")
    assert plain["TRAINING_IMAGE_URI_GPU"] == _sdk_training_image("ml.g5.xlarge")
    assert "DEBUGGER_RULE_IMAGE" not in plain
    with_rules = LocalSettings(debugger_rules_enabled=True).lambda_environment()
    assert with_rules["DEBUGGER_RULE_IMAGE"] == image_uris.retrieve("debugger", REGION)


@pytest.mark.parametrize("instance_type", ["ml.p3.2xlarge", "ml.g5.xlarge"])
def test_a_gpu_instance_type_passes_validate_input_in_local_mode_with_the_gpu_image(instance_type):
    state, _ = _prepare({"run_spec": {"instance_type": instance_type}}, LocalSettings())
    assert state.job.image == _sdk_training_image("ml.g5.xlarge")


def test_job_image_by_framework_and_version_resolves_in_local_mode():
    raw = {"job": {"source": "s3://stabilizer-local/source/jobs/mine/sourcedir.tar.gz", "entry_point": "train.py",
                   "image": {"framework": "pytorch", "version": "2.7"}, "instance_type": "ml.c5.xlarge"}}
    state, _ = _prepare(raw, LocalSettings())
    assert state.job.image == _sdk_training_image("ml.c5.xlarge", "2.7.1")


def test_debugger_rules_get_the_rule_image_in_the_first_request():
    from stabilizer_workflow.launch.requests import build_create_training_job

    # A rule only Debugger runs: the engine's own rules never reach Debugger.
    raw = {"run_spec": {"rules": [{"name": "NLPSequenceRatio", "parameters": {"token_values": "0"}}]}}
    state, train = _prepare(raw, LocalSettings(debugger_rules_enabled=True))
    request = build_create_training_job(state, train, 1)
    from sagemaker import image_uris

    images = {rule["RuleEvaluatorImage"] for rule in request["DebugRuleConfigurations"]}
    assert images == {image_uris.retrieve("debugger", REGION)}


def test_a_gpu_instance_is_said_to_train_on_the_cpu_in_local_mode():
    note = gpu_instance_note({"run_spec": {"instance_type": "ml.p3.2xlarge"}}, "ml.m5.xlarge")
    assert note is not None and note.startswith("ml.p3.2xlarge is a GPU instance") and "CPU" in note
    assert gpu_instance_note({"job": {"instance_type": "ml.g5.xlarge"}}, "ml.m5.xlarge") is not None
    assert gpu_instance_note({"run_spec": {"instance_type": "ml.c5.xlarge"}}, "ml.m5.xlarge") is None
    assert gpu_instance_note({}, "ml.m5.xlarge") is None
