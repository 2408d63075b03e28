"""Deployment-level configuration, read once from the Lambda environment (docs/contracts.md, section 4).

CDK bakes these in; the local engine sets them. A missing or malformed variable raises
`MisconfiguredEnvironment` naming it, at the first invocation, instead of failing deep inside a
request. This module reads a mapping it is given; the handlers decide when (once, cached).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError, field_validator

from stabilizer_contract.s3_uris import is_s3_uri, split_s3_uri
from stabilizer_workflow import environment
from stabilizer_workflow.errors import MisconfiguredEnvironment

# The job name is "<prefix>-<8 hex>-<attempt>": 63 characters leave 49 for the prefix with
# attempts up to 9999. IAM scopes training jobs to "<prefix>*", so the prefix is never cut.
MAX_PREFIX = 49
_PREFIX = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


class MonitorSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    topic_arn: str = Field(min_length=1)
    # The resolution of the jobs' metric streams in CloudWatch: SageMaker sends them at a one-minute
    # frequency (stabilizer_workflow.aws.cloudwatch); the local stand-in keeps them to the second.
    metric_period_seconds: int = Field(60, ge=1, le=3600)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MonitorSettings:
        return _load(cls, env, environment.MONITOR)


class WatchSettings(BaseModel):
    """The watch function: where task tokens are kept, whom to tell, whose jobs to look at."""

    model_config = ConfigDict(frozen=True)

    bucket: str = Field(min_length=3)
    topic_arn: str = Field(min_length=1)
    job_name_prefix: str = "stabilizer"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WatchSettings:
        return _load(cls, env, environment.WATCH)


class TrainSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    bucket: str = Field(min_length=3)
    topic_arn: str = Field(min_length=1)
    sagemaker_role_arn: str = Field(min_length=20)
    # The image for CPU instance types; for every type when no GPU image is set (a custom image).
    training_image_uri: str = Field(min_length=1)
    # Images baked in at synth time from the SageMaker Python SDK (infra/training_image.py,
    # workflow/images.py): the GPU build, {framework: {version: {"cpu"|"gpu": uri}}}, and the
    # Debugger rule image (needed only with DEBUGGER_RULES_ENABLED).
    training_image_uri_gpu: str | None = None
    framework_images: Json[dict[str, dict[str, dict[str, str]]]] = Field(default_factory=dict)
    debugger_rule_image: str | None = None
    source_s3_uri: str
    train_data_s3_uri: str
    test_data_s3_uri: str
    job_name_prefix: str = "stabilizer"
    default_instance_type: str = "ml.p3.2xlarge"
    debugger_rules_enabled: bool = False
    # ResourceConfig.KeepAlivePeriodInSeconds: SageMaker managed warm pools, 0 = off.
    warm_pool_seconds: int = Field(0, ge=0, le=3600)
    region: str = "us-east-1"
    # The S3 prefix holding the in-job library (`stabilizer_sentinel/...`), delivered to every job as the
    # `stabilizer` channel; unset, only the reference job (which carries its own copy) can run.
    library_s3_uri: str | None = None
    # Buckets besides the stack's that the deployment lets jobs read channels from (`data_buckets`).
    data_buckets: tuple[str, ...] = ()

    @field_validator("data_buckets", mode="before")
    @classmethod
    def _buckets(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("source_s3_uri", "train_data_s3_uri", "test_data_s3_uri", "library_s3_uri")
    @classmethod
    def _s3(cls, value: str | None) -> str | None:
        if value is not None and not (is_s3_uri(value) and split_s3_uri(value)[1]):
            raise ValueError(f"expected an s3://bucket/key URI, got {value!r}")
        return value

    @field_validator("job_name_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if len(value) > MAX_PREFIX or not _PREFIX.match(value):
            raise ValueError(
                f"expected at most {MAX_PREFIX} characters of [a-zA-Z0-9-], starting and ending "
                f"with a letter or digit, got {value!r}"
            )
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TrainSettings:
        return _load(cls, env, environment.TRAIN)


def _load(model, env: Mapping[str, str], names: dict[str, str]):
    values: dict[str, object] = {}
    for field, variable in names.items():
        raw = env.get(variable) or env.get(environment.FALLBACKS.get(variable, ""), "")
        if raw:
            values[field] = _truthy(raw) if field == "debugger_rules_enabled" else raw
    try:
        return model.model_validate(values)
    except ValidationError as error:
        problems = []
        for item in error.errors(include_url=False):
            field = str(item["loc"][0])
            what = "is not set" if item["type"] == "missing" else item["msg"].replace("Value error, ", "")
            problems.append(f"{names[field]} {what}")
        raise MisconfiguredEnvironment("; ".join(problems)) from None
