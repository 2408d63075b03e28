"""The reference phenomenon on the offline data: it explodes without batch norm, trains with it."""

import json
import math

import pytest

from tests.helpers import run_train, step_lines

pytestmark = pytest.mark.slow


def test_without_batch_norm_gradients_go_non_finite_within_10_steps(job_dirs, digits_channels):
    # The sentinel's finite check runs whatever the rules; `notify` lets the run go on past it.
    result = run_train(["--add_batch_norm", "0", "--warmup_learning_rate", "0.1", "--learning_rate", "0.1",
                        "--max_steps", "10", "--log_every", "1", "--seed", "0", "--sentinel_action", "notify"],
                       job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    norms = [float(row["grad_norm"]) for row in step_lines(result.stdout)]
    first_non_finite = next(i for i, value in enumerate(norms) if not math.isfinite(value))
    assert first_non_finite < 10


def test_with_batch_norm_three_epochs_reach_useful_accuracy(job_dirs, digits_channels):
    result = run_train(["--add_batch_norm", "1", "--num_epochs", "3", "--log_every", "1", "--seed", "0"],
                       job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    assert all(math.isfinite(float(row["loss"])) for row in step_lines(result.stdout))
    metrics = json.loads((job_dirs.model / "metrics.json").read_text())
    assert metrics["steps"] == 36
    assert metrics["test_accuracy"] >= 0.6
