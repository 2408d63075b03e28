"""Detection quality on a labelled set of short real runs of model/train.py on the offline data.

Every run gets the same rule list (all built-in rules, Debugger's defaults) and the same capture
settings. Each pathological run must be flagged by its rule; no rule may fire on the healthy run.
The exploding reference run must be stopped by the sentinel at the first step whose gradient is
non-finite, found independently from an unmonitored run of the same recipe.

Runs use a ResNet-8 where the recipe allows (the reference run is the ResNet-20 of the design), so
the tier takes a few minutes on two cores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import JobDirs, model_module, run_train, step_lines

_data = model_module("data")
read_channel, write_channel = _data.read_channel, _data.write_channel

pytestmark = [pytest.mark.slow, pytest.mark.long]  # the detection corpus: `make test-all`

RULES = [
    {"name": "ExplodingTensor"},
    {"name": "VanishingGradient"},
    {"name": "LossNotDecreasing"},
    {"name": "Overfit"},
    {"name": "WeightUpdateRatio"},
    # The misprediction check judges the held-out predictions of the last evaluation: the healthy
    # ResNet-8 after three epochs still mispredicts most of one class, which the default 0.7 reports;
    # 1.0 leaves that check out here and keeps the training-imbalance check.
    {"name": "ClassImbalance", "parameters": {"threshold_misprediction": "1.0"}},
    {"name": "DeadRelu"},
]
CAPTURE = {"labels": {"save_interval": 1}}
SMALL = ["--depth", "8"]


def monitored(action: str = "notify") -> list[str]:
    return ["--sentinel_rules", json.dumps(RULES), "--sentinel_action", action, "--capture", json.dumps(CAPTURE)]


def findings(job_dirs) -> list[dict]:
    path = job_dirs.checkpoints / "findings.json"
    return json.loads(path.read_text())["findings"] if path.exists() else []


def derived_channel(root: Path, source: Path, *, scale: float = 1.0, shift: float = 0.0, keep=None) -> Path:
    x, y = read_channel(source)
    if keep is not None:
        x, y = x[keep], y[keep]
    return write_channel(root, (x * scale + shift).astype(np.float32), y)


def test_healthy_run_with_batch_norm_fires_no_rule(job_dirs, digits_channels):
    result = run_train([*SMALL, "--add_batch_norm", "1", "--num_epochs", "3", *monitored()],
                       job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    assert findings(job_dirs) == []
    assert json.loads((job_dirs.model / "metrics.json").read_text())["test_accuracy"] >= 0.5


def first_non_finite_step(job_dirs, digits_channels) -> int:
    """The reference recipe, not stopped: where does the gradient norm first go non-finite?

    The sentinel's finite check runs whatever the rules; `notify` lets the run go on past it.
    """
    result = run_train(["--max_steps", "12", "--log_every", "1", "--sentinel_action", "notify"],
                       job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    norms = [(int(row["step"]), float(row["grad_norm"])) for row in step_lines(result.stdout)]
    return next(step for step, norm in norms if not math.isfinite(norm))


def test_exploding_reference_run_stops_at_the_first_non_finite_gradient(tmp_path, digits_channels):


    expected = first_non_finite_step(JobDirs(tmp_path / "unmonitored"), digits_channels)
    job = JobDirs(tmp_path / "monitored")
    result = run_train(["--max_steps", "12", "--log_every", "1", "--checkpoint_every", "1", *monitored("stop")],
                       job.env(digits_channels))
    assert result.returncode == 86, result.stdout + result.stderr
    assert job.failure.read_text().startswith("RuleStop: ExplodingTensor at step")
    (finding,) = findings(job)
    assert finding["rule"] == "ExplodingTensor" and finding["step"] == expected
    assert finding["phase"] == "warmup" and finding["value"] in ("nan", "inf")
    assert finding["evidence"]["first_nonfinite_layer"]
    assert finding["tensor"] == f"gradients/{finding['evidence']['first_nonfinite_layer']}"
    # It stopped at that step: no step was logged from it on, and the newest checkpoint is the one
    # written after the step before it, with finite weights.
    assert max(int(row["step"]) for row in step_lines(result.stdout)) == expected - 1
    newest = sorted(job.checkpoints.glob("checkpoint-*.pt"))[-1]
    assert newest.name == f"checkpoint-{expected:08d}.pt"
    state = torch.load(newest, map_location="cpu", weights_only=True)
    assert all(torch.isfinite(value).all() for value in state["model"].values())


def test_vanishing_run_is_flagged_by_vanishing_gradient(tmp_path, job_dirs, digits_channels):
    # Inputs scaled to ~1e-5 of their range (normalised three times over): the network is close to
    # linear around zero, so every kernel's gradient shrinks with the input.
    channels = {"train": derived_channel(tmp_path / "train", digits_channels["train"], scale=1 / 255**2),
                "test": derived_channel(tmp_path / "test", digits_channels["test"], scale=1 / 255**2)}
    result = run_train([*SMALL, "--max_steps", "12", *monitored()], job_dirs.env(channels))
    assert result.returncode == 0, result.stderr
    assert "VanishingGradient" in {f["rule"] for f in findings(job_dirs)}


def test_plateau_run_is_flagged_by_loss_not_decreasing(job_dirs, digits_channels):
    result = run_train([*SMALL, "--add_batch_norm", "1", "--max_steps", "24", "--warmup_learning_rate", "0",
                        "--learning_rate", "0", *monitored()], job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    assert "LossNotDecreasing" in {f["rule"] for f in findings(job_dirs)}


def test_overfit_run_on_a_tiny_training_set_is_flagged_by_overfit(tmp_path, job_dirs, digits_channels):
    keep = np.random.default_rng(0).permutation(len(read_channel(digits_channels["train"])[1]))[:40]
    channels = {"train": derived_channel(tmp_path / "train", digits_channels["train"], keep=keep),
                "test": digits_channels["test"]}
    result = run_train([*SMALL, "--add_batch_norm", "1", "--batch_size", "8", "--num_epochs", "12",
                        "--warmup_learning_rate", "0.05", "--learning_rate", "0.05", *monitored()],
                       job_dirs.env(channels))
    assert result.returncode == 0, result.stderr
    overfit = [f for f in findings(job_dirs) if f["rule"] == "Overfit"]
    assert overfit and overfit[0]["value"] > 0.1


def test_class_imbalanced_run_is_flagged_by_class_imbalance(tmp_path, job_dirs, digits_channels):
    _, y = read_channel(digits_channels["train"])
    keep = np.concatenate([np.where(y == 0)[0], *[np.where(y == c)[0][:10] for c in range(1, 10)]])
    keep = np.random.default_rng(0).permutation(keep)
    channels = {"train": derived_channel(tmp_path / "train", digits_channels["train"], keep=keep),
                "test": digits_channels["test"]}
    result = run_train([*SMALL, "--add_batch_norm", "1", "--num_epochs", "3", *monitored()], job_dirs.env(channels))
    assert result.returncode == 0, result.stderr
    imbalance = [f for f in findings(job_dirs) if f["rule"] == "ClassImbalance"]
    assert imbalance and imbalance[0]["value"] > 10
