"""The training and Debugger rule images, as the SageMaker Python SDK names them (stabilizer/training_images.py).

The lookup lives in the `stabilizer` package so that local mode, which ships without infra/,
resolves the same images the CDK app bakes into the deployed stack.
"""

from stabilizer.training_images import (
    DEBUGGER_REPOSITORY,
    FRAMEWORK_VERSIONS,
    PYTORCH_TRAINING_REPOSITORY,
    PYTORCH_VERSION,
    RegionalImage,
    debugger_rules,
    environment_for_region,
    framework_images,
    framework_versions,
    is_gpu_instance,
    pytorch_training,
    url_suffix,
)

__all__ = [
    "DEBUGGER_REPOSITORY",
    "FRAMEWORK_VERSIONS",
    "PYTORCH_TRAINING_REPOSITORY",
    "PYTORCH_VERSION",
    "RegionalImage",
    "debugger_rules",
    "environment_for_region",
    "framework_images",
    "framework_versions",
    "is_gpu_instance",
    "pytorch_training",
    "url_suffix",
]
