"""The definition file on its own: valid ASL, placeholders, and the error handling every Task needs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEFINITION = Path(__file__).resolve().parents[2] / "statemachine" / "stabilizer.asl.json"
TRANSIENT = {"TransientAwsError", "Lambda.ServiceException", "Lambda.AWSLambdaException",
             "Lambda.SdkClientException", "Lambda.TooManyRequestsException"}


@pytest.fixture(scope="module")
def definition() -> dict:
    return json.loads(DEFINITION.read_text())


def _tasks(definition: dict) -> dict[str, dict]:
    return {name: s for name, s in definition["States"].items() if s["Type"] == "Task"}


def test_statelint_accepts_the_definition():
    statelint = Path(sys.executable).with_name("statelint")
    result = subprocess.run([str(statelint), str(DEFINITION)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_placeholders_are_the_ones_cdk_and_the_local_engine_fill():
    placeholders = set(re.findall(r"\$\{(\w+)\}", DEFINITION.read_text()))
    assert placeholders == {"TrainFunctionArn", "MonitorFunctionArn", "TopicArn"}


def test_execution_has_a_timeout_and_jsonpath(definition):
    assert definition["QueryLanguage"] == "JSONPath"
    assert 3600 <= definition["TimeoutSeconds"] <= 86400


def test_every_lambda_task_retries_transient_errors_and_capacity_errors_longer(definition):
    lambda_tasks = {n: s for n, s in _tasks(definition).items() if s["Resource"].endswith("lambda:invoke")}
    assert set(lambda_tasks) == {"ValidateInput", "LaunchTrainingJob", "CheckJobAndRules", "StopJobAndNotify"}
    for name, task in lambda_tasks.items():
        by_error = {error: retrier for retrier in task["Retry"] for error in retrier["ErrorEquals"]}
        assert set(by_error) >= TRANSIENT, name
        transient, capacity = by_error["TransientAwsError"], by_error["CapacityUnavailable"]
        assert transient["BackoffRate"] > 1 and transient["MaxAttempts"] >= 3, name
        assert capacity["IntervalSeconds"] > transient["MaxDelaySeconds"], name
        assert capacity["MaxDelaySeconds"] > transient["MaxDelaySeconds"], name


def test_every_task_catches_everything_and_keeps_the_error(definition):
    for name, task in _tasks(definition).items():
        catch_all = [c for c in task["Catch"] if c["ErrorEquals"] == ["States.ALL"]]
        assert catch_all, name
        assert task["Catch"][-1] is catch_all[0], f"{name}: States.ALL must be the last catcher"
        assert catch_all[0]["ResultPath"] != "$", f"{name}: the catch must not replace the state"


def test_failures_end_with_the_original_error(definition):
    fail = definition["States"]["FailWithOriginalError"]
    assert (fail["ErrorPath"], fail["CausePath"]) == ("$.error.Error", "$.error.Cause")
    for name in ("LaunchTrainingJob", "CheckJobAndRules"):
        assert definition["States"][name]["Catch"][-1] == {
            "ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "StopJobAndNotify"
        }


def test_every_state_is_reachable(definition):
    states = definition["States"]
    seen, todo = set(), [definition["StartAt"]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        state = states[name]
        todo += [state[k] for k in ("Next", "Default") if k in state]
        todo += [c["Next"] for c in state.get("Choices", []) + state.get("Catch", [])]
    assert seen == set(states)
