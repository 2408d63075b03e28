"""Steps with a loss and gradients exactly zero before the run began to learn are no evidence; after it, they are."""

from __future__ import annotations

import torch

from stabilizer_sentinel.detection.sentinel import build_monitoring
from tests.unit.sentinel.tinynet import tiny_net


def _sentinel(tmp_path):
    _, sentinel = build_monitoring(tiny_net(), sentinel_rules="[]", sentinel_action="notify", capture=None,
                                   checkpoint_dir=tmp_path, tensor_dir=tmp_path / "tensors")
    return sentinel


def _step(sentinel, step: int, loss: float, norm: float) -> None:
    sentinel.after_backward(step, epoch=0, phase="main", learning_rate=0.1, loss=torch.tensor(loss),
                            grad_norm=torch.tensor(norm))


def test_zero_steps_before_the_run_began_are_not_counted_and_later_ones_are(tmp_path):
    # A masked mean over batches with no labelled sample: exactly 0, and so are its gradients.
    sentinel = _sentinel(tmp_path)
    for step in range(3):
        _step(sentinel, step, 0.0, 0.0)
    assert list(sentinel.loss_history) == [] and sentinel.steps_idle == 3
    _step(sentinel, 3, 0.5, 1.2)
    # Once it began, a zero is the run's: a discriminator saturated to a loss that underflows.
    _step(sentinel, 4, 0.0, 0.0)
    assert list(sentinel.loss_history) == [(3, 0.5), (4, 0.0)] and sentinel.steps_idle == 3
    sentinel.close()


def test_a_zero_loss_with_gradients_is_counted_from_the_first_step(tmp_path):
    sentinel = _sentinel(tmp_path)
    _step(sentinel, 0, 0.0, 0.5)  # a loss at its minimum with gradients is no idle step
    assert list(sentinel.loss_history) == [(0, 0.0)]
    sentinel.close()
