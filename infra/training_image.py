"""The SageMaker PyTorch training image for the deployment region, resolved at deploy time.

How it is resolved: AWS Deep Learning Containers publish `pytorch-training` in one registry
account per region. The table below is the "Region Availability" table of
aws/deep-learning-containers `available_images.md`; the tag is that page's newest SageMaker
PyTorch training image (PyTorch 2.9.0, Python 3.12): `-cpu-` for CPU instance types and
`-gpu-...-cu130-` for GPU ones. The stack is region-agnostic, so the account is chosen in the
template with a CfnMapping on AWS::Region; the `training_image_uri` context value replaces the
whole URI (another version, a private copy, a region missing here).

CDK's own DLC fact (region_info) lacks several of these regions, hence the table.
This module must not call AWS.
"""

from __future__ import annotations

PYTORCH_TRAINING_REPOSITORY = "pytorch-training"
PYTORCH_VERSION = "2.9.0"
CPU_TAG = f"{PYTORCH_VERSION}-cpu-py312-ubuntu22.04-sagemaker"
GPU_TAG = f"{PYTORCH_VERSION}-gpu-py312-cu130-ubuntu22.04-sagemaker"

DLC_REGISTRY_ACCOUNTS: dict[str, str] = {
    "us-east-1": "763104351884",
    "us-east-2": "763104351884",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-east-2": "763104351884",
    "ap-south-1": "763104351884",
    "ap-south-2": "772153158452",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896",
    "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462",
    "ap-southeast-7": "590183813437",
    "ap-northeast-1": "763104351884",
    "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360",
    "ca-central-1": "763104351884",
    "ca-west-1": "204538143572",
    "eu-central-1": "763104351884",
    "eu-central-2": "380420809688",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-west-3": "763104351884",
    "eu-south-1": "692866216735",
    "eu-south-2": "503227376785",
    "eu-north-1": "763104351884",
    "il-central-1": "780543022126",
    "me-south-1": "217643126080",
    "me-central-1": "914824155844",
    "mx-central-1": "637423239942",
    "sa-east-1": "763104351884",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
}

# Accelerated instance families: they need the GPU build of the image.
_GPU_FAMILIES = ("ml.p", "ml.g")


def is_gpu_instance(instance_type: str) -> bool:
    return instance_type.startswith(_GPU_FAMILIES)


def image_tag_for(instance_type: str) -> str:
    return GPU_TAG if is_gpu_instance(instance_type) else CPU_TAG
