"""The reference phenomenon on the offline data: it explodes without batch norm.

That it trains with batch norm is local mode's default run (tests/e2e/test_local_mode.py: learned
in 12 steps) and the detection tier's healthy run (tests/detection/test_detection.py: test
accuracy after three epochs, ResNet-8); its three epochs at depth 20 are a figure of
docs/figures.md, measured by `python train.py --add_batch_norm 1 --num_epochs 3`.
"""

import math

import pytest

from tests.helpers import run_train, step_lines

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_without_batch_norm_gradients_go_non_finite_within_10_steps(job_dirs, digits_channels):
    # The sentinel's finite check runs whatever the rules; `notify` lets the run go on past it.
    result = run_train(["--add_batch_norm", "0", "--warmup_learning_rate", "0.1", "--learning_rate", "0.1",
                        "--max_steps", "10", "--log_every", "1", "--seed", "0", "--sentinel_action", "notify"],
                       job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    norms = [float(row["grad_norm"]) for row in step_lines(result.stdout)]
    first_non_finite = next(i for i, value in enumerate(norms) if not math.isfinite(value))
    assert first_non_finite < 10
