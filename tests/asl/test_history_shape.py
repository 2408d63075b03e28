"""The execution history stays readable when a parked task times out before its own thread scheduled it.

On a loaded machine the interpreter's task thread can reach the parked watch task's scheduling only
after the state's one-second timeout fired; its late ``TaskScheduled`` event then held the task's
parameters as ``timeoutInSeconds``, and every later ``GetExecutionHistory`` failed to serialise
(a public-scripts run ended ``error TypeError`` that way). stabilizer.local.engine.history_events keeps the
event in its documented shape; the local engine and this harness install it.
"""

from __future__ import annotations

import threading
import time

from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
    StateTaskService,
)

from stabilizer.local.engine import history_events
from tests.asl.harness import ok, sleeps
from tests.asl.test_paths import COMPLETED, LAUNCHED, PREPARED, WATCHING


def _late_first_scheduling(monkeypatch, seconds: float) -> threading.Event:
    """The first parked task's thread reaches its scheduling ``seconds`` late, as under load."""
    original = StateTaskService._before_eval_execution
    delayed = threading.Event()

    def late(self, env, resource_runtime_part, raw_parameters, state_credentials):
        if not delayed.is_set() and isinstance(raw_parameters, dict) and "token" in str(raw_parameters):
            delayed.set()
            time.sleep(seconds)
        return original(self, env=env, resource_runtime_part=resource_runtime_part,
                        raw_parameters=raw_parameters, state_credentials=state_credentials)

    monkeypatch.setattr(StateTaskService, "_before_eval_execution", late)
    return delayed


def test_a_parked_task_timed_out_before_it_was_scheduled_leaves_a_readable_history(workflow, monkeypatch):
    delayed = _late_first_scheduling(monkeypatch, seconds=1.6)
    parked = {**LAUNCHED, "wait_seconds": 1}
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[ok(parked)],
        check=[ok({**WATCHING, "wait_seconds": 1}), ok({**COMPLETED, "wait_seconds": 1})],
        parked=[sleeps()] * 4,
    )
    assert delayed.is_set()
    assert outcome.status == "SUCCEEDED"
    assert any(e["type"] == "TaskTimedOut" for e in outcome.events)  # the timeout was taken, as Step Functions would
    scheduled = [e["taskScheduledEventDetails"] for e in outcome.events if "taskScheduledEventDetails" in e]
    assert scheduled and all(isinstance(d.get("timeoutInSeconds", 0), int) for d in scheduled)


def test_only_an_integer_field_that_is_not_one_is_left_out():
    details = {"taskScheduledEventDetails": {"resource": "invoke", "timeoutInSeconds": {"FunctionName": "f"},
                                             "heartbeatInSeconds": 30, "parameters": "{}"}}
    assert history_events.well_formed(details) == {
        "taskScheduledEventDetails": {"resource": "invoke", "heartbeatInSeconds": 30, "parameters": "{}"}}
    kept = {"lambdaFunctionScheduledEventDetails": {"resource": "f", "timeoutInSeconds": 60}}
    assert history_events.well_formed(kept) == kept
    assert history_events.well_formed(None) is None
