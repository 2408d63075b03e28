"""The latency model speaks of this workflow: its figures follow the settings they model."""

from __future__ import annotations

import pytest

from stabilizer.bench import latency_model as latency
from stabilizer.bench.latency import table
from stabilizer.local.training_job import SAGEMAKER_STOP_GRACE_SECONDS


def test_the_model_uses_the_workflows_own_settings():
    from stabilizer_workflow.execution_input import ExecutionInput

    assert ExecutionInput().wait_seconds == latency.WAIT_SECONDS
    assert latency.STOP_GRACE.seconds == SAGEMAKER_STOP_GRACE_SECONDS
    sample, cold, warm = latency.ways()
    # The sample waits for a check, then a second full one after the stop; stabilizer waits for neither.
    assert sample.seconds - cold.seconds >= latency.POLL_DELAY.seconds + latency.NEXT_CHECK.seconds
    assert cold.seconds - warm.seconds == latency.COLD_START.seconds - latency.WARM_START.seconds
    assert all(part.figure.source for way in (sample, cold, warm) for part in way.parts)


def test_the_benchmark_prints_every_part_and_the_ratios():
    text = table(latency.ways())
    for way in latency.ways():
        assert way.name in text
        for part in way.parts:
            assert part.name in text
    assert text.splitlines()[-3].endswith("1.0x")


def test_a_job_end_event_that_wakes_nothing_costs_the_model_a_check():
    woken = latency.WakeMeasurement(True, 0.2, 300)
    missed = latency.WakeMeasurement(False, 300.4, 300)
    _, cold_woken, _ = latency.ways(woken)
    _, cold_missed, warm_missed = latency.ways(missed)
    assert cold_woken.seconds == latency.ways()[1].seconds
    names = [part.name for part in cold_missed.parts]
    assert "job-end event to the watch function" not in names
    assert cold_missed.seconds - cold_woken.seconds == pytest.approx(
        latency.POLL_DELAY.seconds - latency.EVENT_DELIVERY.seconds - latency.LAMBDA_COLD.seconds)
    assert "NOT woken" in table([cold_missed, warm_missed])


def test_the_wake_is_read_from_the_executions_history():
    import datetime as dt

    from stabilizer.bench.latency import wake_from_history

    end = dt.datetime(2026, 11, 25, 9, 0, tzinfo=dt.UTC)

    def at(seconds: float, kind: str, name: str | None = None) -> dict:
        event = {"type": kind, "timestamp": end + dt.timedelta(seconds=seconds)}
        if name:
            event["stateEnteredEventDetails"] = {"name": name}
        return event

    check = at(300.5, "TaskStateEntered", "CheckJobAndRules")
    timed_out = [at(-20, "TaskStateEntered", "CheckJobAndRules"), at(300, "TaskTimedOut"), check]
    woken = [at(0.1, "TaskSucceeded"), at(0.3, "TaskStateEntered", "CheckJobAndRules")]
    assert wake_from_history(timed_out, end, 300) == latency.WakeMeasurement(False, 300.5, 300)
    assert wake_from_history(woken, end, 300) == latency.WakeMeasurement(True, 0.3, 300)
