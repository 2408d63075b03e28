"""Which training image a job runs on: the image follows the instance type, per request.

The deployment bakes in, at synth time and from the SageMaker Python SDK's own image URI lookup
(infra/training_image.py), a CPU and a GPU training image for its region and a small map of
framework versions to their CPU and GPU images. This module picks from what was baked in; it
never imports the SDK (the Lambda asset stays free of it) and never calls AWS.

- No image given: the deployment's GPU image on an NVIDIA GPU instance, its CPU image otherwise.
- `{"framework": "pytorch", "version": "2.8"}`: looked up in the baked map, CPU or GPU build by
  instance type; a version the deployment does not know is refused naming `job.image`.
- A URI: used as given, after checking that its tag does not contradict the instance type.

GPU instance families, and why they are told apart by the family's first letter: SageMaker's
NVIDIA instances are the `ml.p*` (P2 K80, P3 V100, P4d A100, P5 H100/H200, P6 B200) and `ml.g*`
(G4dn T4, G5 A10G, G6 L4, G6e L40S) families; `ml.trn*` and `ml.inf*` carry AWS Trainium and
Inferentia, which need Neuron images; every other family is CPU only. The SageMaker Python SDK
classifies them the same way (`image_uris._processor`: family starting with g or p is GPU).

CUDA 13 and the oldest GPUs: CUDA 13.0 removed support for the Maxwell, Pascal and Volta
architectures (CUDA Toolkit 13.0 release notes, "Deprecated architectures"; PyTorch's CUDA 13.0
builds target compute capability 7.5 and newer, pytorch/pytorch#172352), and CUDA 12.0 removed
Kepler. So a CUDA 13 image cannot run on ml.p3/ml.p3dn (V100, compute capability 7.0), and no
CUDA 12 or 13 image runs on ml.p2 (K80, 3.7). Turing (ml.g4dn, T4, 7.5) and newer run both. The
PyTorch training Deep Learning Containers are CUDA 13 from PyTorch 2.9 (`2.9.0-gpu-py312-cu130`,
aws/deep-learning-containers docs/src/data/pytorch-training/2.9-gpu-sagemaker.yml) and CUDA 12
from 2.1 to 2.8 (2.8 is `cu129`, whose PyTorch build keeps sm_70: pytorch .ci/manywheel/
build_cuda.sh). Such a pair is refused before launch, naming the field: silently swapping in an
older framework would run a different job than the one described.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from stabilizer_workflow.errors import InvalidInput

Accelerator = Literal["cpu", "gpu", "neuron"]

_INSTANCE = re.compile(r"^ml\.(?P<family>[a-z0-9-]+)\.[a-z0-9]+$")
# Families older than Turing, with the GPU and its compute capability.
_PRE_TURING: dict[str, tuple[str, tuple[int, int]]] = {
    "p2": ("NVIDIA K80", (3, 7)),
    "p3": ("NVIDIA V100", (7, 0)),
    "p3dn": ("NVIDIA V100", (7, 0)),
}
# The oldest compute capability each CUDA major version still supports.
_CUDA_MINIMUM: dict[int, tuple[int, int]] = {12: (5, 0), 13: (7, 5)}
_CUDA_IN_TAG = re.compile(r"(?:^|[-_.])cu(\d{2,3})(?:[-_.]|$)")
_DLC_PYTORCH_TAG = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?-gpu-")


class ImageSettings(Protocol):
    """What the deployment baked in (stabilizer_workflow.settings.TrainSettings has these)."""

    training_image_uri: str
    training_image_uri_gpu: str | None
    framework_images: Mapping[str, Mapping[str, Mapping[str, str]]]


def instance_family(instance_type: str) -> str:
    match = _INSTANCE.match(instance_type or "")
    if not match:
        raise InvalidInput(
            f"job.instance_type: expected a SageMaker instance type such as 'ml.g5.xlarge', got {instance_type!r}"
        )
    return match["family"]


def instance_accelerator(instance_type: str) -> Accelerator:
    family = instance_family(instance_type)
    if family.startswith(("trn", "inf")):
        return "neuron"
    return "gpu" if family.startswith(("p", "g")) else "cpu"


def _name(accelerator: Accelerator) -> str:
    return "Neuron" if accelerator == "neuron" else accelerator.upper()


def _tag(uri: str) -> str:
    last = uri.rsplit("/", 1)[-1].split("@", 1)[0]
    return last.partition(":")[2]


def image_accelerator(uri: str) -> Accelerator | None:
    """What an image's tag says it runs on, or None when it says nothing (a custom image).

    The Deep Learning Containers tag their builds `-cpu-`, `-gpu-` (with `cuNNN`) or `neuronx`.
    """
    tag = f"-{_tag(uri)}-"
    if "neuron" in tag:
        return "neuron"
    if "-gpu-" in tag or _CUDA_IN_TAG.search(tag):
        return "gpu"
    if "-cpu-" in tag:
        return "cpu"
    return None


def image_cuda_major(uri: str) -> int | None:
    """The CUDA major version an image is built with, from its tag, or None when unknown."""
    tag = _tag(uri)
    found = _CUDA_IN_TAG.search(tag)
    if found:
        return int(found[1][:-1])  # cu129 -> 12, cu130 -> 13
    dlc = _DLC_PYTORCH_TAG.match(tag) if "pytorch-training" in uri else None
    if dlc:
        version = (int(dlc[1]), int(dlc[2]))
        if version >= (2, 9):
            return 13
        if version >= (2, 1):
            return 12
    return None


def _refuse_old_gpu(instance_type: str, uri: str, field: str) -> None:
    old = _PRE_TURING.get(instance_family(instance_type))
    cuda = image_cuda_major(uri)
    if old is None or cuda is None:
        return
    gpu, capability = old
    minimum = _CUDA_MINIMUM.get(cuda, _CUDA_MINIMUM[max(_CUDA_MINIMUM)])
    if capability < minimum:
        raise InvalidInput(
            f"{field}: {uri} is built with CUDA {cuda}, which does not run on {instance_type} "
            f"({gpu}, compute capability {capability[0]}.{capability[1]}; CUDA {cuda} needs "
            f"{minimum[0]}.{minimum[1]} or newer). Choose ml.g4dn or a newer GPU family, or an image built "
            "with an older CUDA (PyTorch 2.8 or earlier)"
        )


def _mismatch(image: Accelerator, instance: Accelerator, uri: str, instance_type: str) -> str:
    if instance == "gpu":
        return f"{uri} is a {_name(image)} image but {instance_type} is a GPU instance (its GPU would sit idle)"
    if image == "gpu":
        return f"{uri} is a GPU image but {instance_type} has no NVIDIA GPU"
    if image == "neuron":
        return f"{uri} is a Neuron image but {instance_type} has no Trainium or Inferentia chip"
    return f"{uri} is a CPU image but {instance_type} is a Trainium/Inferentia instance"


def check_image_fits_instance(instance_type: str, uri: str, field: str = "job.image", note: str = "") -> None:
    """Refuse, naming `field`, an image whose tag contradicts the instance type."""
    instance = instance_accelerator(instance_type)
    image = image_accelerator(uri)
    if image is not None and image != instance:
        raise InvalidInput(f"{field}: {_mismatch(image, instance, uri, instance_type)}{note}")
    if instance == "gpu":
        _refuse_old_gpu(instance_type, uri, field)


def _spec_fields(spec: Any) -> tuple[str, str, str | None]:
    if isinstance(spec, Mapping):
        framework, version, python = spec.get("framework", "pytorch"), spec.get("version"), spec.get("python_version")
    else:
        framework = getattr(spec, "framework", "pytorch")
        version, python = getattr(spec, "version", None), getattr(spec, "python_version", None)
    if not isinstance(framework, str) or not isinstance(version, str) or not version:
        raise InvalidInput(
            f"job.image: expected an image URI or {{\"framework\": ..., \"version\": ...}}, got {spec!r}"
        )
    return framework, version, python


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def resolve_framework_image(spec: Any, instance_type: str, settings: ImageSettings) -> str:
    """The baked-in image for `{framework, version[, python_version]}` on this instance type."""
    framework, version, python = _spec_fields(spec)
    builds = settings.framework_images.get(framework)
    if not builds:
        known = ", ".join(sorted(settings.framework_images)) or "none"
        raise InvalidInput(
            f"job.image.framework: this deployment has no {framework!r} images (it has: {known}); "
            "give job.image as an image URI"
        )
    # "2.8" means the newest 2.8.x the deployment has, as the SDK's version aliases do.
    candidates = [v for v in builds if v == version or v.startswith(f"{version}.")]
    if not candidates:
        raise InvalidInput(
            f"job.image.version: {framework} {version} is not among this deployment's images "
            f"({', '.join(sorted(builds, key=_version_key))}); give one of those, or job.image as an image URI"
        )
    chosen = max(candidates, key=_version_key)
    accelerator = instance_accelerator(instance_type)
    uri = builds[chosen].get(accelerator)
    if uri is None:
        raise InvalidInput(
            f"job.instance_type: {instance_type} needs a {_name(accelerator)} build, and this deployment has "
            f"none for {framework} {chosen}; give job.image as an image URI"
        )
    if python and f"-{python}" not in f"-{_tag(uri)}":
        raise InvalidInput(
            f"job.image.python_version: {framework} {chosen} is baked in as {_tag(uri)}, not for {python}; "
            "leave python_version out or give job.image as an image URI"
        )
    check_image_fits_instance(instance_type, uri, "job.instance_type")
    return uri


def default_image(instance_type: str, settings: ImageSettings, field: str = "job.instance_type") -> str:
    """The deployment's own image for this instance type: GPU build on GPU instances."""
    accelerator = instance_accelerator(instance_type)
    if accelerator == "neuron":
        raise InvalidInput(
            f"job.instance_type: {instance_type} carries AWS Trainium/Inferentia chips, which need a "
            "Neuron image; the deployment's images are CPU and GPU builds. Give job.image as a Neuron image URI"
        )
    uri = settings.training_image_uri
    if accelerator == "gpu" and settings.training_image_uri_gpu:
        uri = settings.training_image_uri_gpu
    check_image_fits_instance(instance_type, uri, field, " (the deployment's training image)")
    return uri


def training_image_for(instance_type: str, image_spec: Any, settings: ImageSettings) -> str:
    """The TrainingImage of a request: `image_spec` is None, an image URI, or {framework, version}."""
    if image_spec is None:
        return default_image(instance_type, settings)
    if isinstance(image_spec, str):
        if not image_spec.strip():
            raise InvalidInput("job.image: empty; leave it out to use the deployment's image")
        check_image_fits_instance(instance_type, image_spec)
        return image_spec
    return resolve_framework_image(image_spec, instance_type, settings)
