"""Errors the state machine catches by name (docs/contracts.md, section 4).

The Lambda runtime reports an exception's class name as the Step Functions error name, so these
class names are part of the contract: do not rename them. This module must not import boto3;
translating a botocore `ClientError` into one of these lives in `stabilizer_workflow.aws`.
"""

from __future__ import annotations


class WorkflowError(Exception):
    """Base class; never raised itself."""


class InvalidInput(WorkflowError):  # noqa: N818 - the name is the contract
    """The execution input is wrong; the message names the field and what was expected."""


class TransientAwsError(WorkflowError):
    """Throttling, 5xx or a timeout: the same call is expected to work when retried."""


class CapacityUnavailable(WorkflowError):  # noqa: N818 - the name is the contract
    """SageMaker has no capacity for the request now (CapacityError, InsufficientCapacity): it comes back
    by itself, so the state machine retries with a long back-off. A used-up account quota
    (ResourceLimitExceeded) is ServiceQuotaExceeded instead."""


class AwsRequestRejected(WorkflowError):  # noqa: N818 - the name is the contract
    """AWS refused the request (validation, access denied, ...): retrying will not help."""


class StateCorrupted(WorkflowError):  # noqa: N818 - the name is the contract
    """The state payload does not validate against the state model."""


class MisconfiguredEnvironment(WorkflowError):  # noqa: N818 - the name is the contract
    """A deployment-level environment variable is missing or malformed (a deployment bug)."""


class TrainingDataMissing(WorkflowError):  # noqa: N818 - the name is the contract
    """A channel of the stack's bucket holds no object: the message says what to upload where."""


class AccessDenied(AwsRequestRejected):
    """AWS answered 403: the function's role may not do this (or, for an S3 object, may not list
    its prefix, so a missing object reads as 403 too). Never taken for "not there yet"."""


class ServiceQuotaExceeded(WorkflowError):  # noqa: N818 - the name is the contract
    """SageMaker's ResourceLimitExceeded: an account quota is used up. Waiting does not raise a
    quota, so it is not retried; the message names the quota and how to raise it."""
