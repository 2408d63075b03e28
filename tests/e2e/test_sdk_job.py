"""A notebook user's SageMaker Python SDK estimator, handed to the local client as it is, runs under
stabilizer end to end: the user's script (tests/e2e/fixtures/regression_job) diverges at `lr` 1.6,
is stopped, and is relaunched through the declared knob with the estimator's own hyperparameters,
image and metric definitions."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from stabilizer.client.local_client import LocalClient

pytestmark = [pytest.mark.slow, pytest.mark.long]
os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
sagemaker = pytest.importorskip("sagemaker")
SCRIPT_DIR = Path(__file__).resolve().parent / "fixtures" / "regression_job"
if not SCRIPT_DIR.is_dir():
    pytest.skip("the user-job fixture (tests/e2e/fixtures/regression_job) is not in this tree",
                allow_module_level=True)
pytest.importorskip("stabilizer.local.engine.staging", reason="local mode that runs a job of your own")


@pytest.fixture
def points(tmp_path: Path) -> Path:
    """y = w.x with unit-variance inputs: gradient descent diverges for lr above 1."""
    out = tmp_path / "points"
    out.mkdir()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 4)).astype("float32")
    np.save(out / "x.npy", x)
    np.save(out / "y.npy", (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")).astype("float32"))
    return out


def test_a_pytorch_estimator_runs_under_stabilizer_locally(digits_channels, points, tmp_path, monkeypatch):
    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    # As a notebook user writes it; a LocalSession builds it without an account.
    estimator = PyTorch(
        entry_point="fit.py",
        source_dir=str(SCRIPT_DIR),
        role="arn:aws:iam::123456789012:role/sagemaker-execution",
        framework_version="2.8.0",
        py_version="py312",
        instance_type="ml.m5.xlarge",
        instance_count=1,
        hyperparameters={"lr": 1.6, "steps": 60, "clip": 0.0, "seed": 0},
        metric_definitions=[{"Name": "train:loss", "Regex": r"mse=(\S+)"}],
        max_run=600,
        sagemaker_session=LocalSession(),
    )
    with LocalClient.open(tmp_path / "runs", data_dir=digits_channels["train"].parent) as client:
        arn = client.start(
            {"wait_seconds": 1},
            job=estimator,
            inputs={"points": f"file://{points}"},
            knobs={"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 10.0}},
            loss_metric="train:loss",
        )
        view = client.wait(arn, timeout=600)
        requests = [job.request for job in client.engine.sagemaker.jobs.values()]
    state = view.state or {}
    assert view.status == "SUCCEEDED", (view.error, view.cause, state.get("reason"))
    first, second = state["attempts"]
    assert first["finding"]["rule"] == "Diverging"  # its loss reached ten times its start before overflowing
    assert first["run_spec"]["lr"] == 1.6 and second["run_spec"]["lr"] < 1.6
    assert {k: v for k, v in second["run_spec"].items() if k != "lr"} == {"steps": 60, "clip": 0.0, "seed": 0}
    # The estimator's image, as fit() would name it in the local engine's region, on every attempt.
    assert {r["AlgorithmSpecification"]["TrainingImage"] for r in requests} == {
        estimator.training_image_uri(region="us-east-1")}
    assert all(r["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge" for r in requests)
