"""What the two clients (stabilizer.client.aws_client.AwsClient, stabilizer.client.local_client.LocalClient)
share: the view of an execution, the questions both answer, and the Step Functions and S3 reads
behind the answers.

Both sides answer the same questions about an execution: start one, describe it (status, the
state payload and its attempts), its history, the notifications it sent, the findings of an
attempt and where that attempt's tensor store is (a local directory or an ``s3://`` prefix, both
readable by the rule engine's Trial API).

The client observes and starts executions; it never changes what the workflow decides.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from stabilizer.client.inputs import check_execution_name
from stabilizer.reports.records import Notification

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"})


@dataclass
class ExecutionView:
    """What an execution is doing or did."""

    arn: str
    name: str
    status: str
    input: dict[str, Any]
    state: dict[str, Any] | None = None
    error: str | None = None
    cause: str | None = None
    start_date: Any = None
    stop_date: Any = None

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return list((self.state or {}).get("attempts") or [])

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


class Client(Protocol):
    def start(
        self, execution_input: dict[str, Any] | None = None, name: str | None = None, *, job: Any = None,
        inputs: Any = None, knobs: dict[str, Any] | None = None, **job_options: Any,
    ) -> str: ...
    def describe(self, execution_arn: str) -> ExecutionView: ...
    def history(self, execution_arn: str) -> list[dict[str, Any]]: ...
    def notifications(self, execution_arn: str) -> list[Notification]: ...
    def findings(self, execution_arn: str, attempt: int) -> dict[str, Any] | None: ...
    def tensor_store(self, execution_arn: str, attempt: int) -> str: ...
    def open_tensor_store(self, execution_arn: str, attempt: int) -> Any: ...
    def wait(self, execution_arn: str, timeout: float = 3600, poll_seconds: float = 5) -> ExecutionView: ...


def latest_state(events: list[dict[str, Any]], output: str | None = None) -> dict[str, Any] | None:
    """The newest state payload in an execution's history (or its output, once it succeeded)."""
    from stabilizer.local.engine.execution_follower import state_payload

    if output:
        found = state_payload(output)
        if found is not None:
            return found
    for event in reversed(events):
        details = event.get("stateExitedEventDetails") or event.get("executionSucceededEventDetails")
        if details and details.get("output"):
            found = state_payload(details["output"])
            if found is not None:
                return found
    return None


def published_by_state_machine(events: list[dict[str, Any]]) -> list[Notification]:
    """The SNS messages the definition publishes itself (sns:publish tasks), from the history."""
    notes = []
    start = events[0]["timestamp"] if events else None
    for event in events:
        details = event.get("taskScheduledEventDetails")
        if not details or details.get("resourceType") != "sns" or details.get("resource") != "publish":
            continue
        parameters = json.loads(details.get("parameters") or "{}")
        message = parameters.get("Message", "")
        received = (event["timestamp"] - start).total_seconds() if start else 0.0
        notes.append(
            Notification(
                subject=parameters.get("Subject", ""),
                message=message if isinstance(message, str) else json.dumps(message),
                received=received,
                attributes={"source": "state machine"},
            )
        )
    return notes


def _trial_factory() -> Any:
    """``stabilizer_sentinel.capture.trial.create_trial``: the in-job library's Trial API."""
    try:
        from stabilizer_sentinel.capture.trial import create_trial
    except ImportError as error:
        raise LookupError(f"the rule engine's Trial API is not available: {error}") from None
    return create_trial


def canonical_message(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text


class ExecutionClient:
    """What the two clients share: Step Functions and S3 reads through boto3 clients."""

    sfn: Any
    s3: Any
    bucket: str
    state_machine_arn: str

    def start(
        self, execution_input: dict[str, Any] | None = None, name: str | None = None, *, job: Any = None,
        inputs: Any = None, knobs: dict[str, Any] | None = None, **job_options: Any,
    ) -> str:
        """Start an execution. `job` may be a SageMaker Python SDK estimator or ModelTrainer (with
        the `inputs` you would give ``fit()``/``train()``) or a `job` dict; see stabilizer.client.sdk."""
        execution_input = self.with_job(execution_input, job, inputs, knobs, job_options)
        if name is None:
            name = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        check_execution_name(name)  # Step Functions' InvalidName, or a tag SageMaker refuses: before anything starts
        started = self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(execution_input or {})
        )
        return started["executionArn"]

    def with_job(
        self, execution_input: dict[str, Any] | None, job: Any, inputs: Any, knobs: Any, options: dict[str, Any]
    ) -> dict[str, Any]:
        """The execution input with its `job` section made from `job` (stabilizer.client.sdk)."""
        if job is None and inputs is None and knobs is None and not options:
            return execution_input or {}
        from stabilizer.client.sdk import execution_input_for

        return execution_input_for(execution_input, job, inputs, knobs=knobs, **options)

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"executionArn": execution_arn, "maxResults": 1000}
        while True:
            page = self.sfn.get_execution_history(**kwargs)
            events += page["events"]
            if not page.get("nextToken"):
                return events
            kwargs["nextToken"] = page["nextToken"]

    def describe(self, execution_arn: str) -> ExecutionView:
        described = self.sfn.describe_execution(executionArn=execution_arn)
        output = described.get("output")
        state = latest_state([] if output else self.history(execution_arn), output)
        return ExecutionView(
            arn=execution_arn,
            name=described["name"],
            status=described["status"],
            input=json.loads(described.get("input") or "{}"),
            state=state,
            error=described.get("error"),
            cause=described.get("cause"),
            start_date=described.get("startDate"),
            stop_date=described.get("stopDate"),
        )

    def attempt_prefix(self, execution_arn: str, attempt: int) -> str:
        """``s3://<bucket>/executions/<name>/attempt-<n>`` (docs/contracts.md, S3 layout)."""
        name = execution_arn.rsplit(":", 1)[1]
        return f"s3://{self.bucket}/executions/{name}/attempt-{attempt}"

    def findings(self, execution_arn: str, attempt: int) -> dict[str, Any] | None:
        """The attempt's findings.json (its findings and the summary of what the sentinel saw), or
        None when the job left none (it was never watched)."""
        key = f"{self.attempt_prefix(execution_arn, attempt)}/checkpoints/findings.json".split("/", 3)[3]
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return json.loads(body)

    def open_tensor_store(self, execution_arn: str, attempt: int) -> Any:
        """The attempt's tensors through the rule engine's Trial API (``tensor_names``, ``steps``, ...)."""
        create_trial = _trial_factory()
        location = self.tensor_store(execution_arn, attempt)
        return create_trial(location, client=self.s3) if location.startswith("s3://") else create_trial(location)

    def wait(self, execution_arn: str, timeout: float = 3600, poll_seconds: float = 5) -> ExecutionView:
        deadline = time.monotonic() + timeout
        while True:
            view = self.describe(execution_arn)
            if view.done or time.monotonic() > deadline:
                return view
            time.sleep(poll_seconds)
