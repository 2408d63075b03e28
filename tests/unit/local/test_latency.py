"""The latency model speaks of this workflow: its figures follow the settings they model."""

from __future__ import annotations

from stabilizer import latency
from stabilizer.bench_latency import table
from stabilizer.local.training_job import SAGEMAKER_STOP_GRACE_SECONDS


def test_the_model_uses_the_workflows_own_settings():
    from workflow.state import ExecutionInput

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
