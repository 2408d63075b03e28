"""The images the template bakes in are the SageMaker Python SDK's, in every region it knows."""

from __future__ import annotations

import json
import os

import pytest

from infra.training_image import PYTORCH_VERSION, framework_versions, url_suffix
from tests.infra.synth import as_list, policy_statements, synth

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
image_uris = pytest.importorskip("sagemaker.image_uris")

# The Lambda service's limit on all of a function's environment variables together.
LAMBDA_ENVIRONMENT_LIMIT = 4096


def _train_environment(raw: dict) -> dict:
    [train] = [r for k, r in raw["Resources"].items()
               if "TrainFunction" in k and r["Type"] == "AWS::Lambda::Function"]
    return train["Properties"]["Environment"]["Variables"]


def _mapping(raw: dict, name: str) -> dict:
    [found] = [m for k, m in raw.get("Mappings", {}).items() if name in k]
    return found


def render(value, raw: dict, region: str, stand_in: str = "x"):  # noqa: PLR0911 - one return per intrinsic
    """Evaluate the intrinsics CloudFormation would, for a stack in `region`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [render(v, raw, region, stand_in) for v in value]
    [(function, argument)] = value.items()
    if function == "Fn::Join":
        separator, parts = argument
        return separator.join(render(p, raw, region, stand_in) for p in parts)
    if function == "Fn::FindInMap":
        mapping, key, attribute = (render(a, raw, region, stand_in) for a in argument)
        return raw["Mappings"][mapping][key][attribute]
    if function == "Ref" and argument == "AWS::Region":
        return region
    if function == "Ref" and argument == "AWS::URLSuffix":
        return url_suffix(region)
    if function == "Ref" and argument == "AWS::Partition":
        return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"
    return stand_in


def _sdk(version: str, region: str, instance_type: str) -> str:
    py = image_uris.config_for_framework("pytorch")["training"]["versions"][version]["py_versions"][-1]
    return image_uris.retrieve("pytorch", region, version=version, py_version=py,
                               instance_type=instance_type, image_scope="training")


@pytest.fixture(scope="module")
def debugger_synth() -> dict:
    return synth(instance_type="ml.g5.xlarge", debugger_rules_enabled="true")[1]


def test_training_images_are_the_sdks_in_every_region_it_knows(default_synth):
    _, raw = default_synth
    env = _train_environment(raw)
    regions = _mapping(raw, "TrainingImageRegistry")
    sdk_regions = image_uris.config_for_framework("pytorch")["training"]["versions"][PYTORCH_VERSION]["registries"]
    assert set(regions) == set(sdk_regions)
    assert {"cn-north-1", "cn-northwest-1", "us-gov-west-1", "eu-central-2", "mx-central-1"} <= set(regions)
    for region in regions:
        assert render(env["TRAINING_IMAGE_URI"], raw, region) == _sdk(PYTORCH_VERSION, region, "ml.m5.xlarge")
        assert render(env["TRAINING_IMAGE_URI_GPU"], raw, region) == _sdk(PYTORCH_VERSION, region, "ml.p4d.24xlarge")
    china = render(env["TRAINING_IMAGE_URI_GPU"], raw, "cn-north-1")
    assert china.endswith(".amazonaws.com.cn/pytorch-training:2.8.0-gpu-py312")


def test_a_framework_version_resolves_in_the_lambda_to_the_sdks_image(default_synth):
    from stabilizer_workflow.launch.images import training_image_for
    from stabilizer_workflow.settings import TrainSettings

    _, raw = default_synth
    env = _train_environment(raw)
    for region in ("us-east-1", "cn-northwest-1", "us-gov-west-1", "ap-southeast-7"):
        baked = {k: render(env[k], raw, region) for k in ("TRAINING_IMAGE_URI", "TRAINING_IMAGE_URI_GPU",
                                                             "FRAMEWORK_IMAGES")}
        settings = TrainSettings.from_env({
            **baked, "BUCKET": "b-ucket", "TOPIC_ARN": "arn", "SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/r",
            "SOURCE_S3_URI": "s3://b-ucket/s", "TRAIN_DATA_S3_URI": "s3://b-ucket/t", "TEST_DATA_S3_URI": "s3://b-ucket/u",
        })
        assert set(settings.framework_images["pytorch"]) == set(framework_versions())
        for version in framework_versions():
            assert training_image_for("ml.g5.xlarge", {"framework": "pytorch", "version": version}, settings) == _sdk(
                version, region, "ml.g5.xlarge")
            assert training_image_for("ml.c5.xlarge", {"framework": "pytorch", "version": version}, settings) == _sdk(
                version, region, "ml.c5.xlarge")
        assert training_image_for("ml.g6.xlarge", None, settings) == _sdk(PYTORCH_VERSION, region, "ml.g6.xlarge")


def test_debugger_rule_image_is_the_sdks_in_every_region_it_knows(debugger_synth):
    env = _train_environment(debugger_synth)
    regions = _mapping(debugger_synth, "DebuggerRuleRegistry")
    assert set(regions) == set(image_uris.config_for_framework("debugger")["versions"]["latest"]["registries"])
    for region in regions:
        assert render(env["DEBUGGER_RULE_IMAGE"], debugger_synth, region) == image_uris.retrieve("debugger", region)


def test_the_lambda_environment_fits_its_4_kb_limit_in_every_region(debugger_synth):
    env = _train_environment(debugger_synth)
    # Other tokens (bucket name, ARNs) at their longest plausible length; regions where a stack with
    # Debugger rules deploys at all (both mappings have them).
    both = set(_mapping(debugger_synth, "TrainingImageRegistry")) & set(_mapping(debugger_synth, "DebuggerRule"))
    assert len(both) >= 20
    for region in sorted(both):
        resolved = {k: render(v, debugger_synth, region, stand_in="x" * 120) for k, v in env.items()}
        size = sum(len(k) + len(v) for k, v in resolved.items())
        assert size < LAMBDA_ENVIRONMENT_LIMIT, (region, size)


def test_the_execution_role_pulls_from_the_mapped_registry(default_synth):
    _, raw = default_synth
    [pull] = [s for _, s in policy_statements(raw) if s.get("Sid") == "PullTrainingImage"]
    rendered = [render(r, raw, "cn-north-1") for r in as_list(pull["Resource"])]
    assert rendered == ["arn:aws-cn:ecr:cn-north-1:727897471807:repository/pytorch-training"]


def test_a_full_image_uri_in_context_is_used_for_every_instance_type():
    uri = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/my-training:v7"
    _, raw = synth(training_image_uri=uri)
    env = _train_environment(raw)
    assert env["TRAINING_IMAGE_URI"] == uri
    assert "TRAINING_IMAGE_URI_GPU" not in env
    [pull] = [s for _, s in policy_statements(raw) if s.get("Sid") == "PullTrainingImage"]
    assert "arn:aws:ecr:eu-west-1:123456789012:repository/my-training" in [
        render(r, raw, "eu-west-1") for r in as_list(pull["Resource"])]



def test_a_custom_image_deploys_in_a_region_the_sdk_does_not_know():
    # A custom image is the way to deploy where the SDK has no registry account: nothing in the
    # template may look the region up in a mapping, or CloudFormation refuses the stack there.
    uri = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/my-training:v7"
    _, raw = synth(training_image_uri=uri)
    assert _region_lookups(raw) == []
    assert "TrainingImageRegistry" not in raw.get("Mappings", {})
    env = _train_environment(raw)
    assert json.loads(env["FRAMEWORK_IMAGES"]) == {}  # images by version need the SDK's region table


def _region_lookups(value) -> list:
    """Every Fn::FindInMap keyed on AWS::Region in a template (one keyed on the partition is fine)."""
    found = []
    if isinstance(value, dict):
        lookup = value.get("Fn::FindInMap")
        if lookup and lookup[1] == {"Ref": "AWS::Region"}:
            found.append(lookup)
        for item in value.values():
            found += _region_lookups(item)
    elif isinstance(value, list):
        for item in value:
            found += _region_lookups(item)
    return found
