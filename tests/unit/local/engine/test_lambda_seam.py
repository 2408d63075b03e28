"""The seam between moto's ASL interpreter and in-process handlers, on a tiny definition: errors
raised by a handler reach Retry and Catch by their class name, Wait takes its seconds from the
payload, Choice routes, and Fail takes its error and cause from the payload."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from moto import mock_aws

from stabilizer.local.engine.lambda_seam import LocalLambdas, function_name_of
from tests.unit.local.support import aws_env_fixture  # noqa: F401 fixture

ROLE = "arn:aws:iam::123456789012:role/states"


class FlakyError(Exception):
    pass


class BoomError(Exception):
    pass


DEFINITION = {
    "StartAt": "Step",
    "States": {
        "Step": {
            "Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {"FunctionName": "${StepArn}", "Payload.$": "$"},
            "OutputPath": "$.Payload",
            "Retry": [{"ErrorEquals": ["FlakyError"], "IntervalSeconds": 1, "MaxAttempts": 2, "BackoffRate": 1}],
            "Catch": [{"ErrorEquals": ["BoomError"], "ResultPath": "$.error", "Next": "Failed"}],
            "Next": "Decide",
        },
        "Decide": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.count", "NumericLessThan": 5, "Next": "Pause"}],
            "Default": "Done",
        },
        "Pause": {"Type": "Wait", "SecondsPath": "$.wait", "Next": "Step"},
        "Done": {"Type": "Succeed"},
        "Failed": {"Type": "Fail", "ErrorPath": "$.error.Error", "CausePath": "$.error.Cause"},
    },
}


def run(handler: Any, aws_env: None) -> tuple[dict[str, Any], list[dict[str, Any]], float, LocalLambdas]:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        lambdas = LocalLambdas("us-east-1", "123456789012")
        arn = lambdas.register("step", handler)
        with lambdas.installed():
            sfn = boto3.client("stepfunctions", region_name="us-east-1")
            definition = json.dumps(DEFINITION).replace("${StepArn}", arn)
            machine = sfn.create_state_machine(name="seam", definition=definition, roleArn=ROLE)
            started = time.monotonic()
            execution = sfn.start_execution(stateMachineArn=machine["stateMachineArn"], input="{}")
            while (described := sfn.describe_execution(executionArn=execution["executionArn"]))["status"] == "RUNNING":
                assert time.monotonic() - started < 60
                time.sleep(0.05)
            seconds = time.monotonic() - started
            history = sfn.get_execution_history(executionArn=execution["executionArn"])["events"]
    return described, history, seconds, lambdas


def test_retry_catch_wait_choice_and_fail_through_the_seam(aws_env: None):
    calls = {"n": 0}

    def step(event: dict[str, Any], context: Any) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise FlakyError("first call flakes")
        count = event.get("count", 0) + 1
        if count >= 3:
            raise BoomError(f"count reached {count}")
        assert context.function_name == "step"
        return {**event, "count": count, "wait": 1}

    described, history, seconds, lambdas = run(step, aws_env)

    assert described["status"] == "FAILED"
    assert described["error"] == "BoomError"
    cause = json.loads(described["cause"])
    assert cause["errorType"] == "BoomError"
    assert cause["errorMessage"] == "count reached 3"
    failures = [e["taskFailedEventDetails"]["error"] for e in history if e["type"] == "TaskFailed"]
    assert failures == ["FlakyError", "BoomError"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    assert entered == ["Step", "Decide", "Pause", "Step", "Decide", "Pause", "Step", "Failed"]
    # One retry interval and two waits of one second each, in real time.
    assert seconds >= 3
    assert [(i.error_type, i.event.get("count")) for i in lambdas.invocations] == [
        ("FlakyError", None),
        (None, None),
        (None, 1),
        ("BoomError", 2),
    ]


def test_other_functions_are_left_to_moto(aws_env: None):
    lambdas = LocalLambdas("us-east-1", "123456789012")
    lambdas.register("mine", lambda event, context: event)
    assert lambdas.serves("arn:aws:lambda:us-east-1:123456789012:function:mine")
    assert lambdas.serves("mine")
    assert not lambdas.serves("arn:aws:lambda:us-east-1:123456789012:function:theirs")
    assert function_name_of("arn:aws:lambda:us-east-1:123456789012:function:mine:$LATEST") == "mine"
