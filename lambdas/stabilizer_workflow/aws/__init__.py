"""The AWS edge shared by the adapters: client configuration, the invocation's deadline, and
ClientError -> named errors. One adapter per service sits beside it in this package: `sagemaker`
(training jobs), `s3` (artifacts, data channels, task tokens), `stepfunctions` (executions), `sns`
(notifications), `cloudwatch` (the jobs' metric streams).

Clients are created lazily by cached factories (`get_sagemaker()` ...), never at import, so a
test or the local engine can swap the endpoint (moto, a local emulator) before first use, and a
cold start pays only for the clients a handler touches. boto3 itself is imported by the first
factory called, not with this module: the handlers' import stays light, and what needs only
the domain (a rejected input, a test of a decision) never loads the SDK. botocore's exceptions
(a few small modules) are imported here and in the adapters, for the `except` clauses. No
decisions here: an adapter does one call and translates its errors.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from stabilizer_workflow.errors import (
    AccessDenied,
    AwsRequestRejected,
    CapacityUnavailable,
    ServiceQuotaExceeded,
    TransientAwsError,
    WorkflowError,
)
from stabilizer_workflow.execution.service_limits import quota_advice

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
    its timeout (reported as Lambda.Unknown or Sandbox.Timedout, with whatever the invocation did
    half done).
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


def new_client(service: str) -> Any:
    """A client of `service` with this module's configuration and deadline check; each adapter
    module's cached factory calls it once."""
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
