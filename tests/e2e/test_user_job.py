"""A job of one's own, end to end in local mode: a user's script (tests/e2e/fixtures/regression_job,
hyperparameters `lr`, `steps`, `clip`, `seed`; a `points` channel) run from its directory.

With `lr` 1.6 it diverges; the sentinel, delivered as the `stabilizer` channel and configured by
the `sagemaker_stabilizer` hyperparameter, stops it. With a `learning_rate` knob declared on `lr`
the default policy halves it and the second attempt converges; with no knob declared the
execution ends for a person, saying which knob to declare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stabilizer.local.engine.deployment import Project
from stabilizer.local.engine.engine import LocalEngine
from stabilizer.reports.records import RunRecord

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIR = Path(__file__).resolve().parent / "fixtures" / "regression_job"
LEARNING_RATE_KNOB = {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 10.0}


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4096 points of y = w.x with unit-variance inputs: the loss's curvature is about 2."""
    out = tmp_path_factory.mktemp("points")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 4)).astype("float32")
    np.save(out / "x.npy", x)
    np.save(out / "y.npy", (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")).astype("float32"))
    return out


def user_job(points: Path, knobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "wait_seconds": 1,
        "job": {
            "source": str(SCRIPT_DIR),
            "entry_point": "fit.py",
            "hyperparameters": {"lr": 1.6, "steps": 60, "clip": 0.0, "seed": 0},
            "channels": {"points": str(points)},
            "metric_definitions": [{"Name": "train:loss", "Regex": r"mse=(\S+)"}],
            "loss_metric": "train:loss",
            "knobs": knobs,
        },
    }


def run(execution_input: dict[str, Any], data: Path, run_dir: Path, name: str) -> tuple[RunRecord, Any]:
    with LocalEngine(run_dir, data, project=Project.discover(ROOT)) as engine:
        record = engine.run(execution_input, name=name)
        requests = [job.request for job in engine.sagemaker.jobs.values()]
        logs = [job.log_path.read_text() for job in engine.sagemaker.jobs.values()]
    return record, requests, logs


@pytest.mark.long
def test_user_job_explodes_and_recovers_through_its_learning_rate_knob(
    digits_channels: dict[str, Path], points: Path, tmp_path: Path
):
    record, requests, logs = run(
        user_job(points, {"learning_rate": LEARNING_RATE_KNOB}),
        digits_channels["train"].parent,
        tmp_path / "runs",
        "e2e-user-job",
    )
    state = record.state or {}
    assert record.status == "SUCCEEDED", (record.error, record.cause, state.get("reason"))
    first, second = state["attempts"]
    # The diverging run was stopped (by the sentinel, exit 86, or by the monitor, which sees the
    # findings within one poll and may stop it first); the knob's hyperparameter, and only it, changed.
    assert first["status"] in ("Failed", "Stopped")
    if first["status"] == "Failed":
        assert "RuleStop:" in first["failure_reason"]
    # Its loss reached ten times its start before it overflowed: stopped as diverging.
    assert first["finding"]["rule"] == "Diverging"
    assert first["decision"]["remedy"] == "lower_lr"
    # A constant rate that exploded: no lower rate is known stable, so a quarter of it.
    assert first["decision"]["changes"] == {"lr": [1.6, pytest.approx(0.4)]}
    assert second["status"] == "Completed"
    assert second["run_spec"] == {"lr": pytest.approx(0.4), "steps": 60, "clip": 0.0, "seed": 0}
    # The request launched the user's script with the user's hyperparameters and channel, plus
    # the library channel on PYTHONPATH and the configuration hyperparameter.
    request = requests[0]
    hps = request["HyperParameters"]
    assert json.loads(hps["sagemaker_program"]) == "fit.py"
    assert {k: json.loads(v) for k, v in hps.items() if not k.startswith("sagemaker_")} == {
        "lr": 1.6,
        "steps": 60,
        "clip": 0.0,
        "seed": 0,
    }
    assert json.loads(hps["sagemaker_stabilizer"])["knobs"] == {"learning_rate": "lr"}
    assert {c["ChannelName"] for c in request["InputDataConfig"]} == {"points", "stabilizer"}
    assert request["Environment"]["PYTHONPATH"] == (
        "/opt/ml/input/data/stabilizer:/opt/ml/input/data/stabilizer/stabilizer_sentinel/autostart"
    )
    # The script itself saw the configuration and stopped or finished as the state says.
    assert 'knobs declared: {"learning_rate": "lr"}' in logs[0]
    assert "finished mse=" not in logs[0]
    assert "finished mse=" in logs[1]
    relaunch = [n for n in record.notifications if n.attributes.get("event_type") == "relaunching"]
    assert relaunch and "lr 1.6->0.4" in relaunch[0].subject


def test_user_job_without_knobs_is_stopped_and_left_to_a_person(
    digits_channels: dict[str, Path], points: Path, tmp_path: Path
):
    record, _, _ = run(user_job(points, {}), digits_channels["train"].parent, tmp_path / "runs", "e2e-no-knobs")
    state = record.state or {}
    assert record.status == "FAILED"
    assert record.error == "TrainingNotRecovered"
    # Its loss diverged and nothing it declared can fix that: the outcome says what is known.
    assert state["outcome"] == "diverged"
    assert len(state["attempts"]) == 1
    assert state["attempts"][0]["finding"]["rule"] == "Diverging"
    assert "no declared knob can remedy Diverging; declare a `learning_rate` knob" in state["reason"]
    ended = [n for n in record.notifications if n.attributes.get("event_type") == "diverged"]
    assert ended and "declare a `learning_rate` knob" in ended[0].message
