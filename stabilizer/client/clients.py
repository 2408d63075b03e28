"""One client for notebooks and scripts, in front of AWS or of the local engine.

Both sides answer the same questions about an execution: start one, describe it (status, the
state payload and its attempts), its history, the notifications it sent, the findings of an
attempt and where that attempt's tensor store is (a local directory or an ``s3://`` prefix, both
readable by the rule engine's Trial API).

- ``AwsClient`` finds the deployed stack's resources from its CloudFormation outputs
  (``StateMachineArn``, ``BucketName``, ``TopicArn``) and uses boto3. SNS keeps no copy of what it
  sent, so notifications come from an SQS queue subscribed to the topic (``subscribe_mailbox``
  creates one) plus the messages the state machine publishes itself, read from the history.
- ``LocalClient`` drives a running ``LocalEngine``.

The client observes and starts executions; it never changes what the workflow decides.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stabilizer.client.mailbox import Mailbox
from stabilizer.reports.records import Notification, RunRecord

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
    from stabilizer.local.execution_follower import state_payload

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
    """``stabilizer_sentinel.trial.create_trial``: the in-job library's Trial API."""
    try:
        from stabilizer_sentinel.trial import create_trial
    except ImportError as error:
        raise LookupError(f"the rule engine's Trial API is not available: {error}") from None
    return create_trial


def _canonical(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text


class _Base:
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
        name = name or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
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


class AwsClient(_Base):
    """The deployed stack, through boto3."""

    def __init__(
        self,
        stack_name: str = "Stabilizer",
        *,
        session: Any = None,
        region_name: str | None = None,
        mailbox_queue_url: str | None = None,
        cloudformation: Any = None,
    ) -> None:
        import boto3

        self.session = session or boto3.session.Session(region_name=region_name)
        self.cloudformation = cloudformation or self.session.client("cloudformation")
        self.sfn = self.session.client("stepfunctions")
        self.s3 = self.session.client("s3")
        self.sqs = self.session.client("sqs")
        self.stack_name = stack_name
        outputs = self.stack_outputs(stack_name)
        missing = [k for k in ("StateMachineArn", "BucketName", "TopicArn") if k not in outputs]
        if missing:
            raise LookupError(f"stack {stack_name} has no output(s) {', '.join(missing)}; is it the stabilizer stack?")
        self.state_machine_arn = outputs["StateMachineArn"]
        self.bucket = outputs["BucketName"]
        self.topic_arn = outputs["TopicArn"]
        self.mailbox_queue_url = mailbox_queue_url
        self._mailbox = Mailbox(self.sqs, mailbox_queue_url) if mailbox_queue_url else None
        self._mailbox_started = time.monotonic()

    def with_job(
        self, execution_input: dict[str, Any] | None, job: Any, inputs: Any, knobs: Any, options: dict[str, Any]
    ) -> dict[str, Any]:
        """As on every client, plus: the image for this region, local source and channels uploaded."""
        if job is not None and not isinstance(job, dict):
            options = {"region": self.session.region_name, **options}
        result = super().with_job(execution_input, job, inputs, knobs, options)
        if isinstance(result.get("job"), dict):
            from stabilizer.client.sdk import upload_local_files

            result = {**result, "job": upload_local_files(result["job"], self.s3, self.bucket)}
        return result

    def stack_outputs(self, stack_name: str) -> dict[str, str]:
        stacks = self.cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}

    def subscribe_mailbox(self, queue_name: str | None = None) -> str:
        """Create an SQS queue subscribed to the topic, so notifications can be read back later."""
        name = queue_name or f"{self.stack_name}-mailbox"
        sqs = self.sqs
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "sns.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": self.topic_arn}},
                }
            ],
        }
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
        self.session.client("sns").subscribe(TopicArn=self.topic_arn, Protocol="sqs", Endpoint=arn)
        self.mailbox_queue_url = url
        self._mailbox = Mailbox(self.sqs, url)
        return url

    def notifications(self, execution_arn: str) -> list[Notification]:
        name = execution_arn.rsplit(":", 1)[1]
        mine = []
        if self._mailbox is not None:
            self._mailbox.drain()
            letters = self._mailbox.for_execution(name, execution_arn)
            mine = [letter.notification(since=self._mailbox_started) for letter in letters]
        # What the state machine publishes itself is in the history; it is in the mailbox too
        # when one is subscribed, and is then listed once.
        seen = {(n.subject, _canonical(n.message)) for n in mine}
        own = [
            n
            for n in published_by_state_machine(self.history(execution_arn))
            if (n.subject, _canonical(n.message)) not in seen
        ]
        return mine + own

    def tensor_store(self, execution_arn: str, attempt: int) -> str:
        return f"{self.attempt_prefix(execution_arn, attempt)}/checkpoints/tensors/"


@dataclass
class _Followed:
    record: RunRecord
    thread: threading.Thread
    done: threading.Event = field(default_factory=threading.Event)


class LocalClient(_Base):
    """A running local engine: ``LocalClient.open()`` starts one (close it, or use ``with``), or
    ``LocalClient(engine)`` wraps one already running."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._owns_engine = False
        self.sfn = engine.client("stepfunctions")
        self.s3 = engine.client("s3")
        self.bucket = engine.settings.bucket
        self.state_machine_arn = engine.state_machine_arn
        self._followed: dict[str, _Followed] = {}

    def start(
        self, execution_input: dict[str, Any] | None = None, name: str | None = None, *, job: Any = None,
        inputs: Any = None, knobs: dict[str, Any] | None = None, **job_options: Any,
    ) -> str:
        execution_input = self.with_job(execution_input, job, inputs, knobs, job_options)
        arn = self.engine.start_execution(execution_input, name)
        record = RunRecord(execution_arn=arn, name=arn.rsplit(":", 1)[1], input=execution_input)

        def follow() -> None:
            try:
                self.engine.follow(arn, execution_input, record=record)
            finally:
                self._followed[arn].done.set()

        thread = threading.Thread(target=follow, name=f"follow-{record.name}", daemon=True)
        self._followed[arn] = _Followed(record=record, thread=thread)
        thread.start()
        return arn

    @classmethod
    def open(
        cls, run_dir: str | Path = "runs/notebook", data_dir: str | Path | None = None, settings: Any = None
    ) -> LocalClient:
        """Start a local engine for a notebook: the offline digits unless ``data_dir`` is given."""
        from stabilizer.local.deployment import Project
        from stabilizer.local.engine import LocalEngine
        from stabilizer.local.offline_digits import ensure_offline_digits

        project = Project.discover()
        data = Path(data_dir) if data_dir else ensure_offline_digits(Path(run_dir) / "data" / "digits", project.model)
        engine = LocalEngine(Path(run_dir), data, project=project, settings=settings)
        engine.__enter__()
        client = cls(engine)
        client._owns_engine = True
        # A notebook kernel that exits without close() must not leave training processes behind.
        atexit.register(client.close)
        return client

    def close(self) -> None:
        """Stop the engine this client started (its running jobs get SIGTERM)."""
        if self._owns_engine:
            self.engine.close()
            self._owns_engine = False
            atexit.unregister(self.close)

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_job(
        self, execution_input: dict[str, Any] | None, job: Any, inputs: Any, knobs: Any, options: dict[str, Any]
    ) -> dict[str, Any]:
        """As on every client, plus: an image named by framework and version becomes the SDK's URI for
        the local engine's region (local jobs run on this machine; the URI only has to be the right one)."""
        from stabilizer.local.deployment import REGION

        if job is not None and not isinstance(job, dict):
            options = {"region": REGION, **options}
        result = super().with_job(execution_input, job, inputs, knobs, options)
        described = result.get("job")
        if isinstance(described, dict) and isinstance(described.get("image"), dict):
            from stabilizer.client.sdk import image_uri_for

            instance_type = described.get("instance_type") or self.engine.settings.instance_type
            result = {**result, "job": {**described, "image": image_uri_for(described["image"], instance_type, REGION)}}
        return result

    def record(self, execution_arn: str) -> RunRecord:
        """What the engine observed of an execution started here (attempts, metrics, notifications)."""
        return self._followed[execution_arn].record

    def notifications(self, execution_arn: str) -> list[Notification]:
        followed = self._followed.get(execution_arn)
        return list(followed.record.notifications) if followed else []

    def tensor_store(self, execution_arn: str, attempt: int) -> str:
        view = self.describe(execution_arn)
        numbered = {a.get("number"): a for a in view.attempts}
        job_name = (numbered.get(attempt) or {}).get("job_name")
        job = self.engine.sagemaker.jobs.get(job_name) if job_name else None
        if job is None:
            raise LookupError(f"{view.name} has no attempt {attempt}")
        return str(Path(job.checkpoint_dir) / "tensors")

    def wait(self, execution_arn: str, timeout: float = 3600, poll_seconds: float = 1) -> ExecutionView:
        followed = self._followed.get(execution_arn)
        if followed is not None:
            followed.done.wait(timeout)
        return super().wait(execution_arn, timeout=0 if followed else timeout, poll_seconds=poll_seconds)
