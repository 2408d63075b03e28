"""Training and Debugger rule images, resolved at synth time with the SageMaker Python SDK.

Nothing here is a table of ours: every registry account, repository and tag comes from the SDK's
image URI lookup (`sagemaker.image_uris.retrieve`, the same call an estimator makes), asked for
every region the SDK knows. The stack is region-agnostic, so the per-region registry accounts go
into a CfnMapping on AWS::Region and each URI is joined from the account, the region and
AWS::URLSuffix (`amazonaws.com`, or `amazonaws.com.cn` in the China regions, as the SDK's own
URIs say; tests/infra checks the joined URI equals the SDK's for every region).

What the deployment bakes into the train Lambda (workflow/images.py picks per request):
- the CPU and the GPU build of PyTorch `PYTORCH_VERSION` (TRAINING_IMAGE_URI, TRAINING_IMAGE_URI_GPU);
- FRAMEWORK_IMAGES, the CPU and GPU builds of the newest `FRAMEWORK_VERSIONS` PyTorch versions the
  SDK knows, for `job.image: {"framework": "pytorch", "version": ...}`;
- DEBUGGER_RULE_IMAGE (`image_uris.retrieve("debugger", region)`) when Debugger rules are on.

In a region the SDK does not know (one newer than the installed SDK), CloudFormation refuses the
stack at deploy time because the mapping has no entry for it ("Unable to get mapping for
TrainingImageRegistry::<region>"); set `-c training_image_uri=<a full URI>` there, or upgrade the
SDK and synthesize again. With Debugger rules on, a region without a Debugger rule image is
refused the same way (mapping DebuggerRuleRegistry).

The CDK app reads this module through infra/training_image.py; local mode
(stabilizer.local.engine.deployment) gives its functions the same variables for its region, so an
instance type or `job.image` resolves there as it does in the deployed stack. The SDK is imported
only here, at synth time and when local mode starts; the Lambda asset never contains it. No AWS calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache

from stabilizer_workflow import environment as names

# The newest PyTorch training image the pinned SDK (sagemaker 2.257.7) knows; its GPU build is
# CUDA 12.9, which still runs on V100 (ml.p3). Changing it is a deliberate, tested decision.
PYTORCH_VERSION = "2.8.0"
# How many PyTorch versions `job.image` may name by version (each costs two URIs of the Lambda's
# 4 KB environment).
FRAMEWORK_VERSIONS = 4
PYTORCH_TRAINING_REPOSITORY = "pytorch-training"
DEBUGGER_REPOSITORY = "sagemaker-debugger-rules"
# The SDK derives the processor (cpu/gpu) from an instance type; any of each kind gives the same URI.
_CPU_EXAMPLE, _GPU_EXAMPLE = "ml.m5.xlarge", "ml.g5.xlarge"
_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.(?P<suffix>[a-z.]+)/(?P<repository>[^:]+):(?P<tag>.+)$"
)

# Accelerated instance families: they need the GPU build of the image (see workflow/images.py).
_GPU_FAMILIES = ("ml.p", "ml.g")


def is_gpu_instance(instance_type: str) -> bool:
    return instance_type.startswith(_GPU_FAMILIES)


def url_suffix(region: str) -> str:
    """What AWS::URLSuffix is in the partitions the SDK's DLC regions are in (aws, aws-cn, aws-us-gov)."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


@dataclass(frozen=True)
class RegionalImage:
    """One image as the SDK names it in every region it knows.

    `<account>.dkr.ecr.<region>.<suffix>/<repository>:<tag>`, with one account per region.
    """

    repository: str
    tag: str
    accounts: dict[str, str]  # region -> registry account

    def uri(self, region: str) -> str:
        return f"{self.accounts[region]}.dkr.ecr.{region}.{url_suffix(region)}/{self.repository}:{self.tag}"


def _sdk():
    import logging
    import os

    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    logging.getLogger("sagemaker.config").setLevel(logging.WARNING)
    from sagemaker import image_uris, utils

    # retrieve() reloads botocore's endpoint data on every call (about 60 ms); it cannot change
    # during one synth, and this module asks for a few hundred URIs.
    if not hasattr(utils._botocore_resolver, "cache_info"):
        utils._botocore_resolver = cache(utils._botocore_resolver)
    return image_uris


def _regional(uris: dict[str, str]) -> RegionalImage:
    """Split the SDK's URIs per region into one repository, one tag and the accounts.

    A region whose URI does not have the standard or China host suffix (an isolated partition)
    is left out: AWS::URLSuffix there is something this check cannot vouch for.
    """
    accounts, shapes = {}, set()
    for region, uri in uris.items():
        match = _URI.match(uri)
        if not match or match["region"] != region or match["suffix"] != url_suffix(region):
            continue
        accounts[region] = match["account"]
        shapes.add((match["repository"], match["tag"]))
    if len(shapes) != 1:
        raise ValueError(f"the SageMaker Python SDK names this image differently per region: {sorted(shapes)}")
    (repository, tag), = shapes
    return RegionalImage(repository=repository, tag=tag, accounts=accounts)


def _py_version(version: str) -> str:
    config = _sdk().config_for_framework("pytorch")["training"]["versions"][version]
    return config["py_versions"][-1]


@cache
def pytorch_training(version: str, processor: str) -> RegionalImage:
    """The SDK's PyTorch training image of `version` for `processor` (cpu|gpu), in every region it knows."""
    image_uris = _sdk()
    regions = image_uris.config_for_framework("pytorch")["training"]["versions"][version]["registries"]
    example = _GPU_EXAMPLE if processor == "gpu" else _CPU_EXAMPLE
    return _regional({
        region: image_uris.retrieve(
            "pytorch", region, version=version, py_version=_py_version(version),
            instance_type=example, image_scope="training",
        )
        for region in regions
    })


@cache
def debugger_rules() -> RegionalImage:
    """The SDK's Debugger rule image (`image_uris.retrieve("debugger", region)`) in every region it knows."""
    image_uris = _sdk()
    regions = image_uris.config_for_framework("debugger")["versions"]["latest"]["registries"]
    return _regional({region: image_uris.retrieve("debugger", region) for region in regions})


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


@cache
def framework_versions(count: int = FRAMEWORK_VERSIONS) -> tuple[str, ...]:
    """The newest `count` PyTorch training versions the SDK knows whose images sit in the same
    registries as PYTORCH_VERSION's (so one region mapping serves them all), newest first."""
    versions = _sdk().config_for_framework("pytorch")["training"]["versions"]
    base = pytorch_training(PYTORCH_VERSION, "cpu").accounts
    same = [v for v in versions if all(versions[v]["registries"].get(r) == a for r, a in base.items())]
    return tuple(sorted(same, key=_version_key, reverse=True)[:count])


def framework_images(region: str) -> dict[str, dict[str, dict[str, str]]]:
    """FRAMEWORK_IMAGES for one known region, as plain strings (local mode and tests)."""
    return {
        "pytorch": {
            version: {p: pytorch_training(version, p).uri(region) for p in ("cpu", "gpu")}
            for version in framework_versions()
        }
    }


def environment_for_region(region: str, debugger: bool = False) -> dict[str, str]:
    """The image variables the train Lambda reads, resolved for one region (local mode, tests)."""
    env = {
        names.TRAINING_IMAGE_URI: pytorch_training(PYTORCH_VERSION, "cpu").uri(region),
        names.TRAINING_IMAGE_URI_GPU: pytorch_training(PYTORCH_VERSION, "gpu").uri(region),
        names.FRAMEWORK_IMAGES: json.dumps(framework_images(region), separators=(",", ":")),
    }
    if debugger:
        env[names.DEBUGGER_RULE_IMAGE] = debugger_rules().uri(region)
    return env
