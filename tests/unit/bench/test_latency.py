"""The latency model speaks of this workflow: its figures follow the settings they model."""

from __future__ import annotations

import pytest

from stabilizer.bench import latency_model as latency
from stabilizer.bench.latency import table
from stabilizer.local.emulator.training_job import SAGEMAKER_STOP_GRACE_SECONDS


def test_the_model_uses_the_workflows_own_settings():
    from stabilizer_workflow.execution.execution_input import ExecutionInput

    assert ExecutionInput().wait_seconds == latency.WAIT_SECONDS
    assert latency.STOP_GRACE.seconds == SAGEMAKER_STOP_GRACE_SECONDS
    sample, cold, warm, in_job = latency.ways()
    # The sample waits for a check, then a second full one after the stop; stabilizer waits for neither.
    assert sample.seconds - cold.seconds >= latency.POLL_DELAY.seconds + latency.NEXT_CHECK.seconds
    assert cold.seconds - warm.seconds == latency.COLD_START.seconds - latency.WARM_START.seconds
    assert all(part.figure.source for way in (sample, cold, warm, in_job) for part in way.parts)


def test_the_in_job_way_is_the_sentinel_the_copy_and_the_probe_steps_and_no_instance():
    from stabilizer_sentinel.recovery.recovery import FACTORS, PROBE_STEPS

    in_job = latency.in_job_way(0.04)
    names = [part.name for part in in_job.parts]
    assert names[0] == "explosion seen by the sentinel" and not any("instance" in name for name in names)
    assert in_job.parts[-1].figure.seconds == pytest.approx(len(FACTORS) * PROBE_STEPS * latency.STEP.seconds)
    assert "measured locally on the quickstart: 0.04 s" in in_job.parts[-1].figure.source
    assert in_job.seconds < latency.ways()[2].seconds  # sooner than a relaunch onto a warm pool


def test_the_benchmark_prints_every_part_and_the_ratios():
    text = table(latency.ways())
    for way in latency.ways():
        assert way.name in text
        for part in way.parts:
            assert part.name in text
    assert text.splitlines()[-4].endswith("1.0x")  # the sample's row, the base of every ratio


def test_a_job_end_event_that_wakes_nothing_costs_the_model_a_check():
    woken = latency.WakeMeasurement(True, 0.2, 300)
    missed = latency.WakeMeasurement(False, 300.4, 300)
    _, cold_woken, _, _ = latency.ways(woken)
    _, cold_missed, warm_missed, _ = latency.ways(missed)
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


def _ended(status: str, error: str | None, cause: str | None = None):
    from stabilizer.reports.records import RunRecord

    return RunRecord(execution_arn="arn:aws:states:us-east-1:123456789012:execution:m:e", name="e", input={},
                     status=status, error=error, cause=cause)


def test_a_measuring_run_too_short_to_judge_learning_still_measures_the_wake():
    from stabilizer.bench.latency import measuring_problem

    unverified = _ended("FAILED", "TrainingNotRecovered", "attempt 1 completed: too few steps (outcome unverified)")
    assert measuring_problem(unverified, ["Completed"]) is None
    assert measuring_problem(_ended("SUCCEEDED", None), ["Completed"]) is None


def test_a_measuring_run_without_one_completed_job_says_why_in_one_line():
    from stabilizer.bench.latency import measuring_problem

    stopped = measuring_problem(_ended("FAILED", "TrainingNotRecovered", "NotLearning at step 11"), ["Stopped"])
    assert stopped is not None and "job(s) Stopped" in stopped and "NotLearning at step 11" in stopped
    cause = '{"errorType": "InvalidInput", "errorMessage": "run_spec.max_steps: expected > 0", "stackTrace": []}'
    refused = measuring_problem(_ended("FAILED", "InvalidInput", cause), [])
    assert refused is not None and "\n" not in refused
    assert "InvalidInput: run_spec.max_steps: expected > 0" in refused and "stackTrace" not in refused
