"""The definition file on its own: valid ASL, placeholders, and the error handling every Task needs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEFINITION = Path(__file__).resolve().parents[2] / "statemachine" / "stabilizer.asl.json"
PLACEHOLDERS = DEFINITION.with_name("placeholders.json")
TRANSIENT = {"TransientAwsError", "Lambda.ServiceException", "Lambda.AWSLambdaException",
             "Lambda.SdkClientException", "Lambda.TooManyRequestsException",
             # A function timeout or out-of-memory (Step Functions developer guide, "Handle Lambda
             # service exceptions"); every Lambda step is safe to run again.
             "Lambda.Unknown"}


@pytest.fixture(scope="module")
def definition() -> dict:
    return json.loads(DEFINITION.read_text())


def _tasks(definition: dict) -> dict[str, dict]:
    return {name: s for name, s in definition["States"].items() if s["Type"] == "Task"}


@pytest.mark.slow
def test_statelint_accepts_the_definition():
    statelint = Path(sys.executable).with_name("statelint")
    result = subprocess.run([str(statelint), str(DEFINITION)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_placeholders_are_the_ones_cdk_and_the_local_engine_fill():
    placeholders = set(re.findall(r"\$\{(\w+)\}", DEFINITION.read_text()))
    mapped = json.loads(PLACEHOLDERS.read_text())["placeholders"]
    assert placeholders == set(mapped)
    assert {"Partition", "TrainFunctionArn", "MonitorFunctionArn", "WatchFunctionArn", "TopicArn"} == placeholders


def test_no_partition_is_written_in_the_definition():
    # arn:aws: would fail every execution in aws-cn and aws-us-gov; the partition is a placeholder.
    text = DEFINITION.read_text()
    assert "arn:aws" not in text
    resources = [s["Resource"] for s in json.loads(text)["States"].values() if "Resource" in s]
    assert resources and all(r.startswith("arn:${Partition}:states:::") for r in resources)


def test_execution_has_the_timeout_the_input_checks_against(definition):
    from stabilizer_workflow.execution.service_limits import EXECUTION_TIMEOUT_SECONDS

    assert definition["QueryLanguage"] == "JSONPath"
    # The Lambdas reject inputs whose limits could outlive it (workflow/service_limits.py).
    assert definition["TimeoutSeconds"] == EXECUTION_TIMEOUT_SECONDS


def test_every_lambda_task_retries_transient_errors_and_capacity_errors_longer(definition):
    lambda_tasks = {n: s for n, s in _tasks(definition).items() if ":lambda:invoke" in s["Resource"]}
    assert set(lambda_tasks) == {
        "ValidateInput", "LaunchTrainingJob", "StopJobOfFailedLaunch", "AwaitJobChange", "CheckJobAndRules",
        "StopJobAndNotify",
    }
    for name, task in lambda_tasks.items():
        by_error = {error: retrier for retrier in task["Retry"] for error in retrier["ErrorEquals"]}
        assert set(by_error) >= TRANSIENT, name
        transient = by_error["TransientAwsError"]
        assert transient["BackoffRate"] > 1 and transient["MaxAttempts"] >= 3, name
        if name in ("AwaitJobChange", "StopJobOfFailedLaunch"):
            continue  # the watch function creates nothing, so it never meets a capacity limit
        capacity = by_error["CapacityUnavailable"]
        assert capacity["IntervalSeconds"] > transient["MaxDelaySeconds"], name
        assert capacity["MaxDelaySeconds"] > transient["MaxDelaySeconds"], name


def test_every_task_catches_everything_and_keeps_the_error(definition):
    for name, task in _tasks(definition).items():
        catch_all = [c for c in task["Catch"] if c["ErrorEquals"] == ["States.ALL"]]
        assert catch_all, name
        assert all("States.Timeout" not in r["ErrorEquals"] for r in task["Retry"]), name
        assert task["Catch"][-1] is catch_all[0], f"{name}: States.ALL must be the last catcher"
        assert catch_all[0]["ResultPath"] != "$", f"{name}: the catch must not replace the state"


def test_failures_end_with_the_original_error(definition):
    fail = definition["States"]["FailWithOriginalError"]
    assert (fail["ErrorPath"], fail["CausePath"]) == ("$.error.Error", "$.error.Cause")
    catches = {"LaunchTrainingJob": "StopJobOfFailedLaunch", "CheckJobAndRules": "StopJobAndNotify"}
    for name, after in catches.items():
        assert definition["States"][name]["Catch"][-1] == {
            "ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": after
        }
    # Stopping the failed launch's job keeps $.error and goes on to the same failure path.
    stop = definition["States"]["StopJobOfFailedLaunch"]
    assert stop["ResultPath"] is None and stop["Next"] == "StopJobAndNotify"
    assert stop["Catch"][-1]["Next"] == "StopJobAndNotify" and stop["Catch"][-1]["ResultPath"] != "$.error"


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
