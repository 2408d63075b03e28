"""The project's own definition and handlers in the local engine, with the stand-in training
script: a job's end wakes the parked execution at once (the local stand-in for EventBridge's
"SageMaker Training Job State Change" rule), so a run is not paced by `wait_seconds`."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from stabilizer.local.engine.deployment import Project
from stabilizer.local.engine.engine import LocalEngine

pytestmark = pytest.mark.slow  # its jobs run as processes

FIXTURES = Path(__file__).parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[4]


def _stand_in_project(tmp_path: Path) -> Project:
    for channel, n in (("train", 8), ("test", 4)):
        directory = tmp_path / "data" / channel
        directory.mkdir(parents=True)
        np.save(directory / "x.npy", np.zeros((n, 32, 32, 3), dtype=np.float32))
        np.save(directory / "y.npy", np.arange(n) % 10)
    project = Project.discover(ROOT)
    return Project(project.root, project.definition, project.lambdas, FIXTURES / "fake_model")


def test_the_jobs_end_wakes_the_execution_long_before_wait_seconds(tmp_path: Path):
    project = _stand_in_project(tmp_path)
    with LocalEngine(tmp_path / "run", tmp_path / "data", project=project) as engine:
        started = time.monotonic()
        # wait_seconds 300: only the job's end event can make this run finish in seconds.
        record = engine.run({"wait_seconds": 300}, name="wake-1")
        seconds = time.monotonic() - started
        history = engine.history(record.execution_arn)

    assert record.status == "SUCCEEDED", (record.error, record.cause)
    assert record.states[:3] == ["ValidateInput", "LaunchTrainingJob", "AwaitJobChange"]
    assert record.states[-3:] == ["CheckJobAndRules", "DecideNextStep", "TrainingSucceeded"]
    awaited = [e["type"] for e in history if e["type"] in ("TaskSucceeded", "TaskTimedOut", "TaskSubmitted")]
    assert "TaskTimedOut" not in awaited
    assert seconds < 120
    assert [a.status for a in record.attempts] == ["Completed"]


def test_a_parked_check_that_times_out_before_its_task_was_scheduled_does_not_end_the_run(tmp_path, monkeypatch):
    """On a loaded machine the interpreter's task thread reached the parked task's scheduling after its
    one-second timeout, and the history could no longer be read: the run ended ``error TypeError``
    (tests/asl/test_history_shape.py has the mechanism). The first parked task is made that late here."""
    from tests.asl.test_history_shape import _late_first_scheduling

    delayed = _late_first_scheduling(monkeypatch, seconds=1.6)
    project = _stand_in_project(tmp_path)
    with LocalEngine(tmp_path / "run", tmp_path / "data", project=project) as engine:
        record = engine.run({"wait_seconds": 1}, name="late-1")
        history = engine.history(record.execution_arn)  # what the follower, the report and run.json read
    assert delayed.is_set()
    assert (record.status, record.error) == ("SUCCEEDED", None), record.cause
    assert "TaskTimedOut" in [e["type"] for e in history]
