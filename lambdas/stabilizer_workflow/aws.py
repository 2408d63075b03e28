"""The AWS edge: small adapters over plain boto3 clients, and ClientError -> named errors.

Clients are created lazily by cached factories (`get_sagemaker()` ...), never at import, so a
test or the local engine can swap the endpoint (moto, a local emulator) before first use, and a
cold start pays only for the clients a handler touches. boto3 itself is imported by the first
factory called, not with this module: the handlers' import stays light, and what needs only
the domain (a rejected input, a test of a decision) never loads the SDK. botocore's exceptions
(a few small modules) are imported here, for the `except` clauses. No decisions here: an
adapter does one call and translates its errors.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from functools import lru_cache
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

from stabilizer_workflow.errors import (
    AccessDenied,
    AwsRequestRejected,
    CapacityUnavailable,
    ServiceQuotaExceeded,
    TransientAwsError,
    WorkflowError,
)
from stabilizer_workflow.hang_settings import PROGRESS_FILE
from stabilizer_workflow.notifications import Notification
from stabilizer_workflow.observation import FindingsDocument, parse_findings
from stabilizer_workflow.service_limits import quota_advice

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
# Capacity that comes back by itself: retried with the state machine's long back-off.
CAPACITY = {"CapacityError", "InsufficientCapacity", "InsufficientCapacityError"}
# An account quota: SageMaker's CreateTrainingJob answers ResourceLimitExceeded ("The account-level
# service limit '<quota>' is N Instances ..."; SageMaker API reference, Common Errors and
# CreateTrainingJob Errors). Not retried: waiting does not raise a quota.
QUOTA = {"ResourceLimitExceeded"}
# S3's answers for an object that is not there. A 403 is not one of them: S3 answers 403 for a
# missing object only when the caller may not list the prefix (S3 API reference, GetObject,
# "Permissions"), and the functions' roles may list theirs (docs/contracts.md, "What the Lambdas may do (IAM)").
NOT_THERE = {"NoSuchKey", "404", "NotFound"}
DENIED = {"AccessDenied", "AccessDeniedException", "403", "Forbidden"}

# Standard retry mode already retries throttling a few times inside one invocation; what is
# left over is raised as TransientAwsError for the state machine's longer backoff.
MAX_ATTEMPTS = 3  # botocore's max_attempts counts the first try
CONNECT_TIMEOUT_SECONDS = 3
READ_TIMEOUT_SECONDS = 10
# botocore's standard mode waits rand(0,1) * min(2 ** (attempt - 1), 20) s between tries
# (throttling scale 1 s), raised to a server's x-amz-retry-after by at most 5 s more
# (botocore/retries/standard.py, ExponentialBackoff).
_MAX_BACKOFF_SECONDS = 20
_RETRY_AFTER_EXTRA_SECONDS = 5
# Time kept back at the deadline for the handler's own work after its last call (publishing the
# decision is itself a call, checked like the others).
DEADLINE_SAFETY_SECONDS = 5


def worst_case_call_seconds() -> float:
    """The longest one AWS call can take with this configuration, every try timing out.

    Each try may wait `connect_timeout` to connect and `read_timeout` for the response (a read
    that keeps trickling bytes can take longer; the AWS APIs called here answer in one response).
    """
    tries = MAX_ATTEMPTS * (CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS)
    waits = sum(
        min(2 ** (attempt - 1), _MAX_BACKOFF_SECONDS) + _RETRY_AFTER_EXTRA_SECONDS
        for attempt in range(1, MAX_ATTEMPTS)
    )
    return float(tries + waits)


class _Invocation:
    """The running invocation's deadline (time.monotonic()), or None outside a Lambda invocation."""

    deadline: float | None = None


def invocation_deadline(context: Any) -> None:
    """Start an invocation whose Lambda `context` says how long it has left.

    From then on, a call that could not finish before the deadline is not started: it raises
    TransientAwsError, which the state machine retries, instead of the function being killed by
    its timeout (reported as Lambda.Unknown, with whatever the invocation did half done).
    """
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    _Invocation.deadline = None if remaining is None else time.monotonic() + remaining() / 1000


def _check_deadline(event_name: str = "", **_: Any) -> None:
    if _Invocation.deadline is None:
        return
    left = _Invocation.deadline - time.monotonic()
    if left < worst_case_call_seconds() + DEADLINE_SAFETY_SECONDS:
        operation = event_name.rsplit(".", 1)[-1]
        raise TransientAwsError(
            f"{operation}: not started, {left:.0f} s left in this invocation and one call may take "
            f"{worst_case_call_seconds():.0f} s; the state machine retries the step"
        )


@lru_cache(maxsize=1)
def client_config() -> Any:
    """The botocore Config of every client: standard retries, bounded connect and read waits."""
    from botocore.config import Config

    return Config(
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
    )


def _client(service: str) -> Any:
    import boto3  # here, not at the top: see the module docstring

    client = boto3.client(service, config=client_config())
    client.meta.events.register_first("before-call.*.*", _check_deadline)
    return client


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def translate(error: Exception, doing: str) -> WorkflowError:
    """A botocore failure as the named error the state machine retries or catches."""
    if isinstance(error, ClientError):
        return _client_error(error, doing)
    if isinstance(error, ConnectionError | HTTPClientError):
        return TransientAwsError(f"{doing}: {error}")
    return AwsRequestRejected(f"{doing}: {error}")


def _client_error(error: ClientError, doing: str) -> WorkflowError:
    code = error_code(error)
    message = error.response.get("Error", {}).get("Message", "")
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    text = f"{doing}: {code}: {message}"
    if code in QUOTA:
        return ServiceQuotaExceeded(f"{text}. {quota_advice(message)}")
    if code in CAPACITY:
        return CapacityUnavailable(text)
    if code in THROTTLING or status >= 500:
        return TransientAwsError(text)
    if code in DENIED or status == 403:
        return AccessDenied(f"{text} (HTTP 403: this function's role may not do this)")
    return AwsRequestRejected(text)


# --------------------------------------------------------------------------------------------
# Lazily created clients
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def get_sagemaker() -> Any:
    return _client("sagemaker")


@lru_cache(maxsize=1)
def get_s3() -> Any:
    return _client("s3")


@lru_cache(maxsize=1)
def get_sns() -> Any:
    return _client("sns")


@lru_cache(maxsize=1)
def get_stepfunctions() -> Any:
    return _client("stepfunctions")


# --------------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------------


def _already_over(error: ClientError) -> bool:
    """SageMaker rejects a stop of a job that is no longer running; for us that is success."""
    message = error.response.get("Error", {}).get("Message", "").lower()
    return error_code(error) == "ValidationException" and any(
        word in message for word in ("status", "completed", "stopped", "failed", "stopping")
    )


def _no_such_job(error: ClientError) -> bool:
    """SageMaker answers a describe of an unknown job with ValidationException "Requested resource
    not found." (ResourceNotFound in some APIs)."""
    message = error.response.get("Error", {}).get("Message", "").lower()
    return error_code(error) == "ResourceNotFound" or (
        error_code(error) == "ValidationException" and "not found" in message
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

    def find(self, name: str) -> dict[str, Any] | None:
        """The job's description, or None when SageMaker has no job of that name (yet)."""
        try:
            return self.client.describe_training_job(TrainingJobName=name)
        except ClientError as error:
            if _no_such_job(error):
                return None
            raise translate(error, f"DescribeTrainingJob {name}") from error
        except BotoCoreError as error:
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

    def running(self, name_prefix: str) -> list[dict[str, Any]]:
        """Descriptions of the InProgress training jobs whose name starts with `name_prefix`."""
        names: list[str] = []
        try:
            paginator = self.client.get_paginator("list_training_jobs")
            for page in paginator.paginate(NameContains=name_prefix, StatusEquals="InProgress"):
                names.extend(
                    s["TrainingJobName"] for s in page.get("TrainingJobSummaries", [])
                    if s["TrainingJobName"].startswith(name_prefix)
                )
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"ListTrainingJobs {name_prefix}*") from error
        return [self.describe(name) for name in names]

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
        """(document, None), (None, None) when there is no file yet (404), or (None, why) when
        unreadable; a 403 raises AccessDenied, never read as "no file yet"."""
        bucket, prefix = split_s3_uri(checkpoint_uri)
        key = f"{prefix.rstrip('/')}/findings.json"
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error_code(error) in NOT_THERE:
                return None, None
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        except BotoCoreError as error:
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        try:
            return parse_findings(body), None
        except ValueError as error:
            return None, str(error)

    def progress_time(self, checkpoint_uri: str) -> datetime | None:
        """When the job's progress.json last changed (its LastModified), or None when it has none yet."""
        bucket, prefix = split_s3_uri(checkpoint_uri)
        key = f"{prefix.rstrip('/')}/{PROGRESS_FILE}"
        try:
            return self.client.head_object(Bucket=bucket, Key=key)["LastModified"]
        except ClientError as error:
            if error_code(error) in NOT_THERE:
                return None
            raise translate(error, f"HeadObject s3://{bucket}/{key}") from error
        except BotoCoreError as error:
            raise translate(error, f"HeadObject s3://{bucket}/{key}") from error

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


    def has_objects(self, uri: str) -> bool:
        """Whether any object lies under an S3 prefix (one ListObjectsV2 of one key)."""
        bucket, prefix = split_s3_uri(uri)
        try:
            listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"ListObjectsV2 s3://{bucket}/{prefix}") from error
        return bool(listed.get("KeyCount") or listed.get("Contents"))


def empty_channels(request: dict[str, Any], bucket: str, artifacts: Artifacts) -> list[tuple[str, str]]:
    """(channel, S3 URI) of the request's channels in `bucket` with no object under them.

    SageMaker would fail such a job minutes later ("No S3 objects found under S3 URL"); a freshly
    deployed stack has no data yet. Channels in other buckets are the user's to check (this
    stack's roles may not list them).
    """
    empty = []
    for channel in request.get("InputDataConfig", []):
        uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
        if split_s3_uri(uri)[0] == bucket and not artifacts.has_objects(uri):
            empty.append((channel["ChannelName"], uri))
    return empty


def missing_data_message(empty: list[tuple[str, str]]) -> str:
    where = "; ".join(f"channel {name}: nothing under {uri}" for name, uri in empty)
    return (
        f"{where}. Upload the training data before starting an execution: x.npy and y.npy under "
        f"each channel's prefix (docs/contracts.md, section 1), for the reference problem "
        f"`cd model && python data.py cifar10 --out ../data` then "
        f"`aws s3 cp ../data/<channel>/ <prefix> --recursive` (README, Deploy to AWS, Data)"
    )


class TaskTokens:
    """The task token of a parked execution, kept in S3 beside the attempt it waits for."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def put(self, uri: str, token: str, job_name: str) -> None:
        bucket, key = split_s3_uri(uri)
        body = json.dumps({"token": token, "job_name": job_name}).encode()
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"PutObject s3://{bucket}/{key}") from error

    def read(self, uri: str) -> str | None:
        """The token kept at `uri`; None when there is none (404) or it is unreadable; a 403 raises AccessDenied."""
        bucket, key = split_s3_uri(uri)
        try:
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error_code(error) in NOT_THERE:
                return None
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        except BotoCoreError as error:
            raise translate(error, f"GetObject s3://{bucket}/{key}") from error
        try:
            return str(json.loads(body)["token"])
        except (ValueError, KeyError, TypeError):
            return None

    def forget(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        try:
            self.client.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"DeleteObject s3://{bucket}/{key}") from error


# SendTaskSuccess answers these when the execution no longer waits for that token (it timed out
# into the regular check, ended, or the token was already used): nothing left to wake.
_TOKEN_GONE = {"TaskTimedOut", "TaskDoesNotExist", "InvalidToken", "ExecutionDoesNotExist"}


class Executions:
    def __init__(self, client: Any) -> None:
        self.client = client

    def wake(self, token: str, output: dict[str, Any]) -> bool:
        """Send a parked execution its task token; False when it no longer waits for it."""
        try:
            self.client.send_task_success(taskToken=token, output=json.dumps(output))
            return True
        except ClientError as error:
            if error_code(error) in _TOKEN_GONE:
                return False
            raise translate(error, "SendTaskSuccess") from error
        except BotoCoreError as error:
            raise translate(error, "SendTaskSuccess") from error

    def describe(self, arn: str) -> dict[str, Any]:
        try:
            return self.client.describe_execution(executionArn=arn)
        except (ClientError, BotoCoreError) as error:
            raise translate(error, f"DescribeExecution {arn}") from error

    def status(self, arn: str) -> str:
        """RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED or PENDING_REDRIVE."""
        return str(self.describe(arn).get("status", ""))


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
