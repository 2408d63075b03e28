"""Every AWS call of local mode, judged by the synthesized stack's IAM policies; strict mode refuses.

moto enforces no IAM, so local mode and the moto tests would pass calls AWS denies. This module
records each call a principal of the stack makes (the three functions, the state machine's
service integrations, and the training job's own S3 calls as its execution role) with its IAM
requests (stabilizer.local.iam.iam_requests), and evaluates each against that principal's policies
in the synthesized template (stabilizer.local.iam.stack_policies). In strict mode a denied call
raises the `ClientError` AWS would (`AccessDenied`, HTTP 403, with the message shape of IAM's
"is not authorized to perform ... because no identity-based policy allows ..."), before it
reaches moto, so `stabilizer run --local --strict` fails where AWS would.

Which principal makes a call: a client tagged with `tag_client()` (the state machine's own
clients, the training job's S3 client) is that principal's; otherwise the principal of the
innermost `acting_as()` block of this thread (the local engine wraps each handler invocation in
one); calls outside both (the engine setting up its bucket, following executions) are the
operator's and are neither recorded nor judged.

The evaluator. IAM's identity-policy logic within one account is: an explicit Deny in any
statement that matches wins; else an Allow that matches allows; else the request is implicitly
denied (IAM User Guide, "Policy evaluation logic", "Determining whether a request is allowed or
denied within an account"). A statement matches when its Action (or NotAction), Resource (or
NotResource) and every Condition operator match. The matching is principalmapper's
(`principalmapper.querying.local_policy_simulation.policy_has_matching_statement`, NCC Group's
Principal Mapper, a local re-implementation of IAM's evaluation used in security reviews):
wildcards `*` and `?` in actions and ARNs, NotAction/NotResource, String*/Arn*/Numeric*/Bool/
Null/IpAddress/Date operators with IfExists and ForAnyValue/ForAllValues, policy variables.
Chosen over moto's enforcement, which does not fit: moto 5.2.5 (`moto/iam/access_control.py`)
knows only StringEquals, turns a failed condition on an Allow into an explicit Deny, ignores
NotResource, does not escape `.` in patterns and checks most services against resource `*`.
Known gap of principalmapper: it matches resource ARNs case-insensitively, where S3 keys are
case-sensitive; this stack's patterns do not depend on case. principalmapper 1.1.5 imports
`collections.Mapping`, gone since Python 3.10; the two aliases it needs are restored before it
is imported (`_evaluator()`), nothing else of it is changed.

Only identity policies are evaluated: the stack sets no permissions boundary, no SCP is known
here, and its bucket policy only denies non-TLS requests (enforce_ssl), which boto3 never makes.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from unittest import mock

from stabilizer.local.iam.iam_requests import IamRequest, Where, job_requests, requests_for
from stabilizer.local.iam.stack_policies import EXECUTION_ROLE, PrincipalPolicies

_PRINCIPAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("stabilizer_principal", default=None)
_TAG = "_stabilizer_principal"


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str  # "allowed", "explicit deny", "no identity-based policy allows"


@dataclass(frozen=True)
class Call:
    """One IAM request of one call, and its verdict."""

    principal: str
    operation: str  # "s3.ListObjectsV2", or "job.<what>" for what a training job does as its role
    request: IamRequest
    verdict: Verdict

    def row(self) -> tuple[str, str, str, str]:
        context = ", ".join(f"{k}={v}" for k, v in sorted(self.request.context.items()))
        resource = self.request.resource + (f" [{context}]" if context else "")
        return self.principal, self.request.action, resource, "allowed" if self.verdict.allowed else "DENIED"


@cache
def _evaluator() -> Callable[..., bool]:
    import collections
    import collections.abc

    for name in ("Mapping", "MutableMapping"):  # principalmapper 1.1.5 imports them from collections
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
    try:
        from principalmapper.querying.local_policy_simulation import policy_has_matching_statement
    except ImportError as error:
        raise RuntimeError(
            f"judging calls by the stack's IAM policies needs principalmapper ({error}); install the `dev` extra"
        ) from None
    return policy_has_matching_statement


def evaluator_problem() -> str | None:
    """Why the evaluator cannot be loaded (its package is missing), or None."""
    try:
        _evaluator()
    except RuntimeError as error:
        return str(error)
    return None


def evaluate(documents: list[dict[str, Any]], request: IamRequest) -> Verdict:
    """IAM's decision for one request against identity policies: explicit deny, allow, implicit deny."""
    matches = _evaluator()  # first: it makes principalmapper importable
    from principalmapper.util.case_insensitive_dict import CaseInsensitiveDict

    context = CaseInsensitiveDict(dict(request.context))
    if any(matches(d, "Deny", request.action, request.resource, context) for d in documents):
        return Verdict(False, "explicit deny in an identity-based policy")
    if any(matches(d, "Allow", request.action, request.resource, context) for d in documents):
        return Verdict(True, "allowed")
    return Verdict(False, "no identity-based policy allows")


def access_denied(principal: PrincipalPolicies, request: IamRequest, verdict: Verdict, operation: str) -> Any:
    """The ClientError AWS answers with (IAM's AccessDenied message; S3 and SageMaker say it alike)."""
    from botocore.exceptions import ClientError

    role = principal.role_arn.rsplit("/", 1)[-1]
    account = principal.role_arn.split(":")[4]
    message = (
        f"User: arn:aws:sts::{account}:assumed-role/{role}/{principal.principal} is not authorized to perform: "
        f"{request.action} on resource: {request.resource} because {verdict.why} the {request.action} action"
        if verdict.why.startswith("no ")
        else f"User: arn:aws:sts::{account}:assumed-role/{role}/{principal.principal} is not authorized to "
        f"perform: {request.action} on resource: {request.resource} with an {verdict.why}"
    )
    code = "AccessDenied" if operation.startswith("s3.") else "AccessDeniedException"
    return ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 403}},
        operation.split(".", 1)[-1],
    )


def tag_client(client: Any, principal: str) -> Any:
    """Every call of `client` is `principal`'s, whatever `acting_as` says."""
    setattr(client, _TAG, principal)
    return client


@contextlib.contextmanager
def acting_as(principal: str) -> Iterator[None]:
    """Calls of untagged clients in this block (on this thread) are `principal`'s."""
    token = _PRINCIPAL.set(principal)
    try:
        yield
    finally:
        _PRINCIPAL.reset(token)


@dataclass
class AccessChecker:
    """Records and judges the calls of the stack's principals; refuses denied ones when `strict`."""

    policies: dict[str, PrincipalPolicies]
    where: Where
    strict: bool = False
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def judge(self, principal: str, operation: str, requests: list[IamRequest]) -> list[Call]:
        policies = self.policies.get(principal)
        judged = []
        for request in requests:
            verdict = (
                evaluate(policies.documents, request) if policies else Verdict(False, "no such principal")
            )
            judged.append(Call(principal, operation, request, verdict))
        with self._lock:
            self.calls.extend(judged)
        return judged

    def check_call(self, principal: str, service: str, operation: str, params: dict[str, Any]) -> None:
        name = f"{service}.{operation}"
        judged = self.judge(principal, name, requests_for(service, operation, params, self.where))
        if service == "sagemaker" and operation == "CreateTrainingJob":
            # SageMaker then acts as the execution role: judged now, refused by the job (job_refusal).
            self.judge(EXECUTION_ROLE, "job.CreateTrainingJob", job_requests(params, self.where))
        denied = next((c for c in judged if not c.verdict.allowed), None)
        if self.strict and denied is not None:
            raise access_denied(self.policies[principal], denied.request, denied.verdict, name)

    def job_refusal(self, request: dict[str, Any]) -> str | None:
        """Strict mode: why SageMaker could not run this job as its role (a FailureReason), or None."""
        if not self.strict:
            return None
        role = self.policies.get(EXECUTION_ROLE)
        for item in job_requests(request, self.where):
            verdict = evaluate(role.documents, item) if role else Verdict(False, "no such principal")
            if not verdict.allowed:
                what = "the training image" if item.action.startswith("ecr:") else "an output path"
                return (
                    f"ClientError: AccessDenied: the execution role cannot {item.action} on {item.resource} "
                    f"({what}; {verdict.why})"
                )
        return None

    def denied(self) -> list[Call]:
        return [c for c in self.calls if not c.verdict.allowed]

    def unmapped(self) -> list[Call]:
        return [c for c in self.calls if not c.request.mapped]

    def table(self) -> list[tuple[str, str, str, str]]:
        """Distinct (principal, action, resource [context], verdict) rows, in first-seen order."""
        return list(dict.fromkeys(c.row() for c in self.calls))

    @contextlib.contextmanager
    def installed(self) -> Iterator[AccessChecker]:
        """Judge every botocore call of a principal while installed (all clients, all threads)."""
        from botocore.client import BaseClient

        original = BaseClient._make_api_call
        checker = self

        def make_api_call(client: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
            principal = getattr(client, _TAG, None) or _PRINCIPAL.get()
            if principal is not None:
                service = client.meta.service_model.service_name
                checker.check_call(principal, service, operation_name, api_params)
            return original(client, operation_name, api_params)

        with mock.patch.object(BaseClient, "_make_api_call", make_api_call):
            yield self


@contextlib.contextmanager
def state_machine_clients(principal: str) -> Iterator[None]:
    """Tag the clients moto's Step Functions interpreter makes for its service integrations."""
    import importlib
    import sys

    # The modules of the integrations the definition uses; each imported the factory by name.
    for module in (
        "moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils",
        "moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sns",
    ):
        importlib.import_module(module)
    from moto.stepfunctions.parser.asl.utils import boto_client

    original = boto_client.boto_client_for

    def tagged(*args: Any, **kwargs: Any) -> Any:
        return tag_client(original(*args, **kwargs), principal)

    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if name.startswith("moto.stepfunctions.parser") and getattr(module, "boto_client_for", None) is original:
                stack.enter_context(mock.patch.object(module, "boto_client_for", tagged))
        yield
