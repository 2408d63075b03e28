"""The AWS edge: small adapters over plain boto3 clients, and ClientError -> named errors.

Clients are created lazily by cached factories (`get_sagemaker()` ...), never at import, so a
test or the local engine can swap the endpoint (moto, a local emulator) before first use, and a
cold start pays only for the clients a handler touches. No decisions here: an adapter does one
call and translates its errors.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

from workflow.errors import AwsRequestRejected, CapacityUnavailable, TransientAwsError, WorkflowError
from workflow.notifications import Notification
from workflow.observation import FindingsDocument, parse_findings

THROTTLING = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
    "PriorRequestNotComplete",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalFailure",
    "InternalError",
    "InternalServerError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
}
CAPACITY = {"ResourceLimitExceeded", "CapacityError", "InsufficientCapacity"}

# Standard retry mode already retries throttling a few times inside one invocation; what is
# left over is raised as TransientAwsError for the state machine's longer backoff.
_CONFIG = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=30)


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def translate(error: Exception, doing: str) -> WorkflowError:
    """A botocore failure as the named error the state machine retries or catches."""
    if isinstance(error, ClientError):
        code = error_code(error)
        message = error.response.get("Error", {}).get("Message", "")
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        text = f"{doing}: {code}: {message}"
        if code in CAPACITY:
            return CapacityUnavailable(text)
        if code in THROTTLING or status >= 500:
            return TransientAwsError(text)
        return AwsRequestRejected(text)
    if isinstance(error, ConnectionError | HTTPClientError):
        return TransientAwsError(f"{doing}: {error}")
    return AwsRequestRejected(f"{doing}: {error}")


# --------------------------------------------------------------------------------------------
# Lazily created clients
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def get_sagemaker() -> Any:
    return boto3.client("sagemaker", config=_CONFIG)


@lru_cache(maxsize=1)
def get_s3() -> Any:
    return boto3.client("s3", config=_CONFIG)


@lru_cache(maxsize=1)
def get_sns() -> Any:
    return boto3.client("sns", config=_CONFIG)


# --------------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------------


def _already_over(error: ClientError) -> bool:
    """SageMaker rejects a stop of a job that is no longer running; for us that is success."""
    message = error.response.get("Error", {}).get("Message", "").lower()
    return error_code(error) == "ValidationException" and any(
        word in message for word in ("status", "completed", "stopped", "failed", "stopping")
    )


class TrainingJobs:
    def __init__(self, client: Any) -> None:
        self.client = client

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        """Create the job; returns its description when the same attempt already created it."""
        try:
            self.client.create_training_job(**request)
            return {}
        except ClientError as error:
            if error_code(error) == "ResourceInUse":
                # A retried launch: the name is per attempt, so the job exists if it is ours.
                existing = self.describe(request["TrainingJobName"])
                ours = (
                    existing.get("CheckpointConfig", {}).get("S3Uri") == request["CheckpointConfig"]["S3Uri"]
                )
                if ours:
                    return existing
            raise translate(error, f"CreateTrainingJob {request['TrainingJobName']}") from error
        except BotoCoreError as error:
            raise translate(error, f"CreateTrainingJob {request['TrainingJobName']}") from error

    def describe(self, name: str) -> dict[str, Any]:
        try:
            return self.client.describe_training_job(TrainingJobName=name)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"DescribeTrainingJob {name}") from error

    def stop(self, name: str) -> bool:
        """Stop a training job; True if this call stopped it, False if it was already over."""
        try:
            self.client.stop_training_job(TrainingJobName=name)
            return True
        except ClientError as error:
            if _already_over(error):
                return False
            raise translate(error, f"StopTrainingJob {name}") from error
        except BotoCoreError as error:
            raise translate(error, f"StopTrainingJob {name}") from error

    def stop_processing_job(self, name: str) -> bool:
        try:
            self.client.stop_processing_job(ProcessingJobName=name)
            return True
        except ClientError as error:
            if _already_over(error):
                return False
            raise translate(error, f"StopProcessingJob {name}") from error
        except BotoCoreError as error:
            raise translate(error, f"StopProcessingJob {name}") from error


def split_s3_uri(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


class Artifacts:
    """Reads what a training job leaves in its checkpoint prefix."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def findings(self, checkpoint_uri: str) -> tuple[FindingsDocument | None, str | None]:
        """(document, None), (None, None) when there is no file, or (None, why) when unreadable."""
        bucket, prefix = split_s3_uri(checkpoint_uri)
        key = f"{prefix.rstrip('/')}/findings.json"
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error_code(error) in ("NoSuchKey", "404", "NotFound"):
                return None, None
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        except BotoCoreError as error:
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        try:
            return parse_findings(body), None
        except ValueError as error:
            return None, str(error)

    def checkpoint_keys(self, checkpoint_uri: str) -> list[str]:
        bucket, prefix = split_s3_uri(checkpoint_uri)
        keys: list[str] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            # Checkpoints sit directly under the prefix; tensors/ below it are not listed.
            for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix.rstrip('/')}/checkpoint-"):
                keys.extend(item["Key"] for item in page.get("Contents", []))
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"ListObjectsV2 s3://{bucket}/{prefix}") from error
        return keys


class Notifier:
    def __init__(self, client: Any, topic_arn: str) -> None:
        self.client = client
        self.topic_arn = topic_arn

    def publish(self, notification: Notification) -> str:
        try:
            response = self.client.publish(**notification.publish_kwargs(self.topic_arn))
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"Publish {notification.event_type}") from error
        return str(response.get("MessageId", ""))
