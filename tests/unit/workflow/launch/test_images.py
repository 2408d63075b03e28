"""The training image follows the instance type, per request (stabilizer_workflow.launch.images)."""

from __future__ import annotations

import json

import pytest

from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.launch.images import (
    image_accelerator,
    image_cuda_major,
    instance_accelerator,
    training_image_for,
)
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV

REGISTRY = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training"
CPU = f"{REGISTRY}:2.8.0-cpu-py312"
GPU = f"{REGISTRY}:2.8.0-gpu-py312"
FRAMEWORKS = {
    "pytorch": {
        "2.7.1": {"cpu": f"{REGISTRY}:2.7.1-cpu-py312", "gpu": f"{REGISTRY}:2.7.1-gpu-py312"},
        "2.8.0": {"cpu": CPU, "gpu": GPU},
        "2.6.0": {"cpu": f"{REGISTRY}:2.6.0-cpu-py312", "gpu": f"{REGISTRY}:2.6.0-gpu-py312"},
    }
}


@pytest.fixture
def baked() -> TrainSettings:
    """Settings as the deployment bakes them: both images and the framework map."""
    return TrainSettings.from_env(
        {**ENV, "TRAINING_IMAGE_URI": CPU, "TRAINING_IMAGE_URI_GPU": GPU, "FRAMEWORK_IMAGES": json.dumps(FRAMEWORKS)}
    )


@pytest.mark.parametrize(
    ("instance_type", "accelerator"),
    [
        ("ml.m5.xlarge", "cpu"),
        ("ml.c5.2xlarge", "cpu"),
        ("ml.t3.medium", "cpu"),
        ("ml.g4dn.xlarge", "gpu"),
        ("ml.g5.xlarge", "gpu"),
        ("ml.g6e.2xlarge", "gpu"),
        ("ml.p3.2xlarge", "gpu"),
        ("ml.p4d.24xlarge", "gpu"),
        ("ml.p5.48xlarge", "gpu"),
        ("ml.p6-b200.48xlarge", "gpu"),
        ("ml.trn1.2xlarge", "neuron"),
        ("ml.inf2.xlarge", "neuron"),
    ],
)
def test_instance_families_are_told_apart(instance_type, accelerator):
    assert instance_accelerator(instance_type) == accelerator


def test_the_default_image_follows_the_instance_type(baked):
    assert training_image_for("ml.m5.xlarge", None, baked) == CPU
    assert training_image_for("ml.g5.xlarge", None, baked) == GPU
    assert training_image_for("ml.p4d.24xlarge", None, baked) == GPU


def test_one_custom_image_serves_every_instance_type_when_no_gpu_image_is_baked():
    custom = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/my-training:latest"
    settings = TrainSettings.from_env({**ENV, "TRAINING_IMAGE_URI": custom})
    assert training_image_for("ml.m5.xlarge", None, settings) == custom
    assert training_image_for("ml.g5.xlarge", None, settings) == custom


def test_a_cpu_only_deployment_refuses_a_gpu_instance_naming_the_field():
    settings = TrainSettings.from_env({**ENV, "TRAINING_IMAGE_URI": CPU})
    says = r"^job.instance_type: .*CPU image but ml.g5.xlarge is a GPU instance .*deployment's training image"
    with pytest.raises(InvalidInput, match=says):
        training_image_for("ml.g5.xlarge", None, settings)


def test_framework_and_version_resolve_from_what_the_deployment_baked_in(baked):
    assert training_image_for("ml.m5.xlarge", {"framework": "pytorch", "version": "2.7.1"}, baked).endswith(
        ":2.7.1-cpu-py312"
    )
    assert training_image_for("ml.g5.xlarge", {"framework": "pytorch", "version": "2.7"}, baked).endswith(
        ":2.7.1-gpu-py312"
    )
    # A model object with the same attributes (the execution input's ImageSpec) works too.
    spec = type("ImageSpec", (), {"framework": "pytorch", "version": "2.8", "python_version": "py312"})()
    assert training_image_for("ml.g5.xlarge", spec, baked) == GPU


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"framework": "pytorch", "version": "2.9.0"}, "job.image.version", "2.6.0, 2.7.1, 2.8.0"),
        ({"framework": "tensorflow", "version": "2.16"}, "job.image.framework", "has: pytorch"),
        ({"framework": "pytorch", "version": "2.8", "python_version": "py311"}, "job.image.python_version", "py311"),
        ({"framework": "pytorch"}, "job.image", "version"),
    ],
)
def test_an_image_the_deployment_cannot_resolve_is_refused_naming_the_field(baked, spec, field, says):
    with pytest.raises(InvalidInput, match=rf"^{field}: .*{says}"):
        training_image_for("ml.m5.xlarge", spec, baked)


@pytest.mark.parametrize(
    ("instance_type", "uri", "says"),
    [
        ("ml.m5.xlarge", GPU, "GPU image but ml.m5.xlarge has no NVIDIA GPU"),
        ("ml.g5.xlarge", CPU, "CPU image but ml.g5.xlarge is a GPU instance"),
        ("ml.trn1.2xlarge", GPU, "GPU image but ml.trn1.2xlarge has no NVIDIA GPU"),
        ("ml.trn1.2xlarge", CPU, "CPU image but ml.trn1.2xlarge is a Trainium/Inferentia instance"),
    ],
)
def test_an_image_uri_that_contradicts_the_instance_is_refused(baked, instance_type, uri, says):
    with pytest.raises(InvalidInput, match=f"^job.image: .*{says}"):
        training_image_for(instance_type, uri, baked)


def test_a_custom_image_uri_is_used_as_given(baked):
    custom = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:v3"
    assert training_image_for("ml.g5.xlarge", custom, baked) == custom
    neuron = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training-neuronx:2.1.2-neuronx-py310-sdk2.20.0"
    assert training_image_for("ml.trn1.2xlarge", neuron, baked) == neuron


def test_trainium_without_an_image_is_refused_naming_the_instance(baked):
    with pytest.raises(InvalidInput, match=r"^job.instance_type: ml.trn1.2xlarge .*Neuron image"):
        training_image_for("ml.trn1.2xlarge", None, baked)


@pytest.mark.parametrize(
    ("uri", "cuda"),
    [
        (f"{REGISTRY}:2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker", 13),
        (f"{REGISTRY}:2.8.0-gpu-py312-cu129-ubuntu22.04-sagemaker", 12),
        (f"{REGISTRY}:2.9.0-gpu-py312", 13),  # the SDK's short tag: the DLC 2.9 build is CUDA 13
        (GPU, 12),
        (CPU, None),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:v3", None),
    ],
)
def test_the_cuda_of_an_image_is_read_from_its_tag(uri, cuda):
    assert image_cuda_major(uri) == cuda


def test_cuda_13_images_are_refused_on_volta_but_run_on_turing(baked):
    cu130 = f"{REGISTRY}:2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker"
    volta = r"^job.image: .*CUDA 13.*ml.p3.2xlarge \(NVIDIA V100, compute capability 7.0"
    with pytest.raises(InvalidInput, match=volta):
        training_image_for("ml.p3.2xlarge", cu130, baked)
    with pytest.raises(InvalidInput, match=r"ml\.p3dn\.24xlarge"):
        training_image_for("ml.p3dn.24xlarge", cu130, baked)
    assert training_image_for("ml.g4dn.xlarge", cu130, baked) == cu130  # T4 is Turing, 7.5
    # The deployment's own GPU image (PyTorch 2.8, CUDA 12.9) still runs on a V100.
    assert training_image_for("ml.p3.2xlarge", None, baked) == GPU
    assert image_accelerator(cu130) == "gpu"


def test_no_cuda_12_or_13_image_runs_on_kepler(baked):
    with pytest.raises(InvalidInput, match=r"^job.instance_type: .*ml.p2.xlarge \(NVIDIA K80"):
        training_image_for("ml.p2.xlarge", None, baked)


def test_a_malformed_instance_type_names_the_field(baked):
    with pytest.raises(InvalidInput, match=r"^job\.instance_type: "):
        training_image_for("m5.xlarge", None, baked)
