"""What the deployment's SageMaker execution role can reach, checked before anything is launched.

A training job runs as the stack's execution role (infra/training_runtime.py). That role reads
every object of the stack's bucket (so a channel may sit at any prefix of it; a source archive
under source/ only, where the train function reads it at ValidateInput) and of the buckets
the deployment names in `data_buckets` (DATA_BUCKETS), and pulls images from the repositories of
the images the deployment baked in (the SDK's PyTorch training repository of its region, and the
repository of `training_image_uri` when one is deployed). A job whose channel or image lies
elsewhere would be created and then fail minutes later ("ClientError: ... the role has access
to it", "CannotPullContainerError"), or run with what some other policy allows; it is refused
here instead, as `InvalidInput` naming the field and what the role cannot read.

Pure: a job and the settings in, problems out. No AWS calls, no boto3.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stabilizer_contract.s3_uris import bucket_of, split_s3_uri
from stabilizer_workflow.errors import InvalidInput

# <account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository>[:<tag>|@<digest>]: an image in
# Amazon ECR (SageMaker training images come from ECR, or from a private registry reached through
# the job's VPC, which this deployment does not configure).
_ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9][a-z0-9._/-]*?)(?::[^/@]+|@sha256:[0-9a-f]{64})?$"
)


@dataclass(frozen=True, order=True)
class Repository:
    account: str
    region: str
    name: str

    def __str__(self) -> str:
        return f"{self.account}.dkr.ecr.{self.region}/{self.name}"


def repository_of(uri: str) -> Repository | None:
    """The ECR repository an image URI names, or None when it is not an ECR image URI."""
    match = _ECR_IMAGE.match(uri.strip())
    if not match:
        return None
    return Repository(match["account"], match["region"], match["repository"])


def pullable_repositories(settings: Any) -> set[Repository]:
    """The repositories of every image the deployment baked in: the ones its role may pull.

    The stack grants the execution role ECR pulls on exactly these (infra/image_mapping.py,
    `repository_arns`): the SDK's training repository of the region (which holds the CPU, GPU and
    framework-version builds alike) and `training_image_uri`'s.
    """
    uris = [settings.training_image_uri, settings.training_image_uri_gpu]
    for builds in dict(settings.framework_images or {}).values():
        for processors in builds.values():
            uris.extend(processors.values())
    return {repository for uri in uris if uri for repository in [repository_of(uri)] if repository}


def readable_buckets(settings: Any) -> list[str]:
    """The stack's bucket first, then the buckets the deployment granted with `data_buckets`."""
    extra = [b for b in getattr(settings, "data_buckets", ()) or () if b != settings.bucket]
    return [settings.bucket, *extra]


def channel_problems(channels: dict[str, str], settings: Any) -> list[str]:
    buckets = readable_buckets(settings)
    problems = []
    for name, uri in channels.items():
        bucket = bucket_of(uri)
        if bucket not in buckets:
            problems.append(
                f"job.channels.{name}: {uri} is in bucket {bucket!r}, which the deployment's SageMaker "
                f"execution role cannot read (it reads {_listed(buckets)}). Copy the data under a "
                f"prefix of s3://{settings.bucket}/, or deploy with -c data_buckets={bucket} to grant it"
            )
    return problems


def image_problem(image: str, settings: Any) -> str | None:
    pullable = pullable_repositories(settings)
    repository = repository_of(image)
    allowed = _listed(str(r) for r in sorted(pullable))
    if repository is None:
        return (
            f"job.image: {image!r} is not an Amazon ECR image URI "
            "(<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>); SageMaker pulls training "
            f"images from ECR, and this deployment's role pulls from {allowed}"
        )
    if repository not in pullable:
        return (
            f"job.image: {image} is in repository {repository}, which the deployment's SageMaker "
            f"execution role cannot pull (it pulls from {allowed}). Leave job.image out, give "
            '{"framework": "pytorch", "version": ...}, or deploy with -c training_image_uri=<your image> '
            "to grant its repository"
        )
    return None


# Where the train function reads source archives in the stack's bucket (infra/workflow.py,
# ReadSourceArchives): ValidateInput lists an archive's members to find the entry point in it.
SOURCE_PREFIX = "source/"


def source_problem(source: str, settings: Any) -> str | None:
    bucket = bucket_of(source)
    buckets = readable_buckets(settings)
    if bucket == settings.bucket and not split_s3_uri(source)[1].startswith(SOURCE_PREFIX):
        return (
            f"job.source: {source} is outside s3://{settings.bucket}/{SOURCE_PREFIX}, where the workflow reads "
            f"source archives to check their entry point; upload it under s3://{settings.bucket}/{SOURCE_PREFIX}"
        )
    if bucket in buckets:
        return None
    return (
        f"job.source: {source} is in bucket {bucket!r}, which the deployment's SageMaker execution role "
        f"cannot read (it reads {_listed(buckets)}). Upload the archive under s3://{settings.bucket}/source/, "
        f"or deploy with -c data_buckets={bucket} to grant it"
    )


def check_job_access(job: Any, settings: Any) -> None:
    """Raise InvalidInput naming the source, each channel and the image the execution role could not reach."""
    problems = [p for p in [source_problem(job.source, settings)] if p]
    problems += channel_problems(dict(job.channels), settings)
    if isinstance(job.image, str):
        problem = image_problem(job.image, settings)
        if problem:
            problems.append(problem)
    if problems:
        raise InvalidInput("; ".join(problems))


def _listed(items: Iterable[str]) -> str:
    items = list(items)
    return ", ".join(items) if items else "nothing"
