"""Deployment-level settings, read once from CDK context (`cdk.json` or `cdk deploy -c key=value`).

Every setting has a default here and in cdk.json, and a clear error naming the key when wrong.
Values arrive as strings from the command line and as JSON values from cdk.json; both are read.
This module must not create constructs or call AWS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from infra.training_image import is_gpu_instance


class ContextSource(Protocol):
    def try_get_context(self, key: str) -> Any: ...


class ContextError(ValueError):
    """A context value is wrong; the message names the key and what was expected."""


# SageMaker lower-cases names in resource ARNs, so an IAM scope `training-job/<prefix>*` only
# matches when the prefix is lower case. Job names allow letters, digits and hyphens.
_JOB_PREFIX = re.compile(r"^(?=.{1,31}$)[a-z0-9](-*[a-z0-9])*$")  # as the Lambdas check it, lower case
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_INSTANCE = re.compile(r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
# S3 bucket names: 3-63 lower-case letters, digits, dots and hyphens (S3 user guide, "Bucket naming rules").
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_POWERTOOLS_VERSION = re.compile(r"^(latest|\d+\.\d+\.\d+)$")
# Releases whose /aws/service/powertools/python/x86_64/python3.13/<version> parameter was never
# published, so a deploy pinned to them fails to resolve the layer: 3.23.0's release workflow
# wrote ".../PACKAGE_VERSION" instead (aws-powertools/powertools-lambda-python issue #7689, fixed
# for later releases by PR #7695).
UNPUBLISHED_POWERTOOLS_VERSIONS = frozenset({"3.23.0"})
# The Powertools layer pinned by default. Its python3.13 x86_64 parameter exists: issue #7689's
# reporter resolved /aws/service/powertools/python/x86_64/python3.13/3.22.1 to the layer ARN while
# 3.23.0's was missing. Pinned, so a redeploy does not change the layer under the code the tests ran.
POWERTOOLS_VERSION = "3.22.1"
# The state machine's TimeoutSeconds (statemachine/stabilizer.asl.json, 2,678,400 s; tests/infra keep
# them equal). An execution's checkpoints (it may resume from attempt 1's), findings and wake tokens
# must outlive it: S3 expires an object the given days after its creation, rounded up to the next
# midnight UTC (S3 user guide, "Lifecycle configuration elements", Expiration), so a retention of one
# day more than the timeout never expires an object a running execution still reads.
EXECUTION_TIMEOUT_DAYS = 31
MIN_RETENTION_DAYS = EXECUTION_TIMEOUT_DAYS + 1
# SageMaker managed warm pools keep an instance at most 3600 s after a job (KeepAlivePeriodInSeconds).
WARM_POOL_MAX_SECONDS = 3600


@dataclass(frozen=True)
class DeploymentConfig:
    # Email address subscribed to the topic; empty means no subscription.
    notification_email: str = ""
    # `retain` keeps the bucket and its data when the stack is deleted; `destroy` empties and deletes it.
    removal_policy: str = "retain"
    # CPU by default: new accounts often have no GPU training quota, and ResNet-20 trains on CPU.
    instance_type: str = "ml.m5.xlarge"
    # Debugger is closed to new customers; accounts that still have it may turn its rules on.
    debugger_rules_enabled: bool = False
    # Empty: derived per region from the Deep Learning Containers registry (see training_image).
    training_image_uri: str = ""
    # Training-job names start with this; IAM scopes SageMaker actions to `training-job/<prefix>*`.
    job_name_prefix: str = "stabilizer"
    # Days until checkpoints, tensors and outputs under executions/ expire: longer than an
    # execution may run (EXECUTION_TIMEOUT_DAYS), with a few days to read a finished one.
    artifact_retention_days: int = 35
    # Powertools layer version resolved from its public SSM parameter (a version, or `latest`,
    # which moves under the deployed code at every deploy).
    powertools_version: str = POWERTOOLS_VERSION
    # Seconds SageMaker keeps a finished job's instance for the next attempt (managed warm pools;
    # 0 = off). Needs a warm-pool quota for the instance type (SageMaker guide, "Request a warm
    # pool quota increase"); billed while kept. Off by default: not every account has that quota.
    warm_pool_seconds: int = 0
    # Days of Lambda, state machine logs kept.
    # Days of Lambda and state machine logs: an execution may run 31 days, and its first steps' logs
    # are read when it ends. 60 is the first CloudWatch retention above that.
    log_retention_days: int = 60
    # Buckets besides the stack's that jobs may read channels from (read only); a channel in any
    # other bucket is refused at ValidateInput (lambdas/stabilizer_workflow/launch/access.py).
    data_buckets: tuple[str, ...] = ()

    @property
    def uses_gpu(self) -> bool:
        return is_gpu_instance(self.instance_type)


def _text(source: ContextSource, key: str, default: str) -> str:
    value = source.try_get_context(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ContextError(f"context '{key}' must be a string, got {value!r}")
    return value.strip()


def _flag(source: ContextSource, key: str, default: bool) -> bool:
    value = source.try_get_context(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "1", "false", "0"}:
        return value.strip().lower() in {"true", "1"}
    raise ContextError(f"context '{key}' must be true or false, got {value!r}")


def _count(source: ContextSource, key: str, default: int, minimum: int) -> int:
    value = source.try_get_context(key)
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < minimum:
        raise ContextError(f"context '{key}' must be an integer >= {minimum}, got {value!r}")
    return number


def _names(source: ContextSource, key: str) -> tuple[str, ...]:
    """A comma-separated string (`-c key=a,b`) or a JSON list of strings (cdk.json)."""
    value = source.try_get_context(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        return tuple(name.strip() for name in value if name.strip())
    raise ContextError(f"context '{key}' must be a comma-separated string or a list of strings, got {value!r}")


def read_config(source: ContextSource) -> DeploymentConfig:
    """Read and check every deployment setting; raise ContextError naming the first bad key."""
    defaults = DeploymentConfig()
    config = DeploymentConfig(
        notification_email=_text(source, "notification_email", defaults.notification_email),
        removal_policy=_text(source, "removal_policy", defaults.removal_policy).lower(),
        instance_type=_text(source, "instance_type", defaults.instance_type),
        debugger_rules_enabled=_flag(source, "debugger_rules_enabled", defaults.debugger_rules_enabled),
        training_image_uri=_text(source, "training_image_uri", defaults.training_image_uri),
        job_name_prefix=_text(source, "job_name_prefix", defaults.job_name_prefix),
        artifact_retention_days=_count(
            source, "artifact_retention_days", defaults.artifact_retention_days, MIN_RETENTION_DAYS
        ),
        powertools_version=_text(source, "powertools_version", defaults.powertools_version),
        log_retention_days=_count(source, "log_retention_days", defaults.log_retention_days,
                                  MIN_RETENTION_DAYS),
        warm_pool_seconds=_count(source, "warm_pool_seconds", defaults.warm_pool_seconds, 0),
        data_buckets=_names(source, "data_buckets"),
    )
    for bucket in config.data_buckets:
        if not _BUCKET.match(bucket):
            raise ContextError(f"context 'data_buckets' must hold S3 bucket names, got {bucket!r}")
    if config.notification_email and not _EMAIL.match(config.notification_email):
        raise ContextError(
            f"context 'notification_email' must be an email address, got {config.notification_email!r}"
        )
    if config.removal_policy not in {"retain", "destroy"}:
        raise ContextError(
            f"context 'removal_policy' must be retain or destroy, got {config.removal_policy!r}"
        )
    if not _INSTANCE.match(config.instance_type):
        raise ContextError(
            f"context 'instance_type' must be a SageMaker instance type like ml.m5.xlarge, "
            f"got {config.instance_type!r}"
        )
    if not _JOB_PREFIX.match(config.job_name_prefix):
        raise ContextError(
            "context 'job_name_prefix' must be 1-31 lower-case letters, digits or inner hyphens "
            f"(SageMaker ARNs are lower case), got {config.job_name_prefix!r}"
        )
    if not _POWERTOOLS_VERSION.match(config.powertools_version):
        raise ContextError(
            f"context 'powertools_version' must be latest or a version like 3.22.1, "
            f"got {config.powertools_version!r}"
        )
    if config.powertools_version in UNPUBLISHED_POWERTOOLS_VERSIONS:
        raise ContextError(
            f"context 'powertools_version' {config.powertools_version} has no published python3.13 "
            f"x86_64 layer parameter (powertools-lambda-python#7689); use {POWERTOOLS_VERSION}"
        )
    if config.warm_pool_seconds > WARM_POOL_MAX_SECONDS:
        raise ContextError(
            f"context 'warm_pool_seconds' must be 0..{WARM_POOL_MAX_SECONDS} (SageMaker's "
            f"KeepAlivePeriodInSeconds limit), got {config.warm_pool_seconds}"
        )
    return config
