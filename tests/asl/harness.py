"""Run the real ASL definition in moto's Step Functions interpreter with scripted Lambda answers.

The seam is the AWS edge: moto's Lambda `Invoke` (the Docker-free backend) is replaced by a
script that answers each `action` with a payload, or with a function error whose `errorType` is
the exception name, exactly as the Lambda service reports an unhandled exception
(`X-Amz-Function-Error: Unhandled`, body `{"errorType", "errorMessage", "stackTrace"}`). The
interpreter then does what Step Functions does with it: names the error, matches Retry and Catch.

Retry back-off sleeps are recorded instead of slept, so a path with a 60 s capacity back-off
runs in milliseconds and the tests can assert the intervals the definition asked for.

`AwaitJobChange` invokes the watch function with a task token (`.waitForTaskToken`). Its scripted
answers are given as `parked=[...]`: `wakes()` (the default when none is scripted) sends the token
back as the watch function does when the job has ended; `sleeps()` keeps it, so the task times out
after the state's `wait_seconds`; `raises(...)` fails the invocation.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFINITION = REPO_ROOT / "statemachine" / "stabilizer.asl.json"
REGION = "us-east-1"
ACCOUNT = "123456789012"
PLACEHOLDERS = REPO_ROOT / "statemachine" / "placeholders.json"
TRAIN_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:stabilizer-train"
MONITOR_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:stabilizer-monitor"
WATCH_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:stabilizer-watch"


@dataclass(frozen=True)
class Reply:
    """One scripted Lambda answer: a payload, or a raised error named `error_type`."""

    payload: Any = None
    error_type: str | None = None
    message: str = ""
    wake: bool = False  # AwaitJobChange only: send the task token back
    # Computed from the event instead of scripted: the project's own decision code answers.
    compute: Callable[[dict], Any] | None = None


def ok(payload: Any) -> Reply:
    return Reply(payload=payload)


def computed(decide: Callable[[dict], Any]) -> Reply:
    """An answer the project's own code computes from the event (the real prepare, launch, check)."""
    return Reply(compute=decide)


def raises(error_type: str, message: str) -> Reply:
    return Reply(error_type=error_type, message=message)


def wakes() -> Reply:
    return Reply(payload={"parked": False}, wake=True)


def sleeps() -> Reply:
    return Reply(payload={"parked": True})


@dataclass
class Call:
    function: str
    event: dict


@dataclass
class Outcome:
    status: str
    error: str | None
    cause: str | None
    output: Any
    states: list[str]
    events: list[dict]
    calls: list[Call]
    retry_sleeps: list[float]
    notifications: list[dict]

    def actions(self) -> list[str]:
        return [call.event["action"] for call in self.calls]

    def events_of(self, action: str) -> list[dict]:
        return [call.event for call in self.calls if call.event["action"] == action]


@dataclass
class LambdaScript:
    """Answers per action, consumed in order; an unscripted call is answered with an error."""

    replies: dict[str, list[Reply]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    unscripted: list[str] = field(default_factory=list)

    def answer(self, function: str, body: bytes | str, response_headers: dict) -> bytes:
        event = json.loads(body)
        self.calls.append(Call(function, event))
        queue = self.replies.get(event.get("action"), [])
        if not queue and event.get("action") == "await":
            queue = [wakes()]
        if not queue:
            self.unscripted.append(event.get("action"))
            reply = raises("UnscriptedCall", f"no scripted reply for action {event.get('action')!r}")
        else:
            reply = queue.pop(0)
        if reply.wake:
            token = event["token"]
            # As the watch function does, from another thread: SendTaskSuccess with the token.
            threading.Thread(target=_send_task_success, args=(token,), daemon=True).start()
        if reply.error_type:
            response_headers["x-amz-function-error"] = "Unhandled"
            body = {"errorType": reply.error_type, "errorMessage": reply.message, "stackTrace": []}
            return json.dumps(body).encode()
        payload = reply.compute(event) if reply.compute is not None else reply.payload
        return json.dumps(payload).encode()


def _send_task_success(token: str) -> None:
    time.sleep(0.05)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    sfn.send_task_success(taskToken=token, output=json.dumps({"status": "Stopped"}))


def substituted_definition() -> str:
    """The definition with its placeholders filled through statemachine/placeholders.json, as CDK
    and the local engine fill them."""
    text = DEFINITION.read_text()
    values = {
        "partition": "aws",
        "train_function_arn": TRAIN_ARN,
        "monitor_function_arn": MONITOR_ARN,
        "watch_function_arn": WATCH_ARN,
        "topic_arn": f"arn:aws:sns:{REGION}:{ACCOUNT}:stabilizer",
    }
    for name, key in json.loads(PLACEHOLDERS.read_text())["placeholders"].items():
        text = text.replace("${" + name + "}", values[key])
    assert "${" not in text, "the definition has a placeholder the tests do not fill"
    return text


class Workflow:
    """Starts executions of the real definition and collects what happened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.script = LambdaScript()
        self.retry_sleeps: list[float] = []
        self.runs = 0
        self.machine: str | None = None
        script = self.script

        def invoke(self, function_name, *args):
            # LambdaSimpleBackend.invoke(function_name, qualifier, body, headers, response_headers)
            _qualifier, body, _headers, response_headers = args
            return script.answer(function_name, body, response_headers)

        monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)

        class RecordingClock:
            @staticmethod
            def sleep(seconds: float) -> None:
                self_outer.retry_sleeps.append(seconds)

        self_outer = self
        monkeypatch.setattr(retrier_decl, "time", RecordingClock)

    def run(self, execution_input: dict | None = None, **replies: list[Reply]) -> Outcome:
        for action, queue in replies.items():
            self.script.replies["await" if action == "parked" else action] = list(queue)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        sns = boto3.client("sns", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        topic_arn = sns.create_topic(Name="stabilizer")["TopicArn"]
        queue_url = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        sns.subscribe(
            TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        if self.machine is None:
            self.machine = sfn.create_state_machine(
                name="stabilizer",
                definition=substituted_definition(),
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/stabilizer-state-machine",
            )["stateMachineArn"]
        self.runs += 1
        execution = sfn.start_execution(
            stateMachineArn=self.machine, name=f"exec-{self.runs}", input=json.dumps(execution_input or {})
        )["executionArn"]
        deadline = time.monotonic() + 60
        while True:
            described = sfn.describe_execution(executionArn=execution)
            if described["status"] != "RUNNING":
                break
            assert time.monotonic() < deadline, "execution still running after 60 s"
            time.sleep(0.05)
        events = sfn.get_execution_history(executionArn=execution, maxResults=1000)["events"]
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
        assert not self.script.unscripted, f"unscripted Lambda calls: {self.script.unscripted}"
        return Outcome(
            status=described["status"],
            error=described.get("error"),
            cause=described.get("cause"),
            output=json.loads(described["output"]) if described.get("output") else None,
            states=[e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e],
            events=events,
            calls=list(self.script.calls),
            retry_sleeps=list(self.retry_sleeps),
            notifications=[json.loads(m["Body"]) for m in messages],
        )
