"""What an attempt's tensor store says, read through the rule engine's Trial API: loss and total
gradient norm per saved step, the first step where a gradient went non-finite and in which
layers, and each layer's gradient norm at a step. It reads tensor stores; it draws nothing
(``stabilizer.reports.plots`` does) and changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Curves:
    """Loss and total gradient norm per saved step of one attempt (NaN where not finite)."""

    loss_steps: list[int]
    loss: list[float]
    grad_steps: list[int]
    grad_norm: list[float]

    @property
    def loss_series(self) -> list[tuple[int, float]]:
        return list(zip(self.loss_steps, self.loss, strict=True))

    @property
    def grad_series(self) -> list[tuple[int, float]]:
        return list(zip(self.grad_steps, self.grad_norm, strict=True))


def curves(trial: Any) -> Curves:
    """``losses/loss`` and the norm over all ``gradients/*`` tensors at each TRAIN step they were saved."""
    import numpy as np

    loss_steps, loss = [], []
    if trial.has_tensor("losses/loss"):
        tensor = trial.tensor("losses/loss")
        for step in tensor.steps(mode="TRAIN"):
            loss_steps.append(step)
            loss.append(float(np.asarray(tensor.value(step, mode="TRAIN")).reshape(-1)[0]))
    names = trial.tensor_names(collection="gradients", mode="TRAIN")
    grad_steps, grad_norm = [], []
    for step in trial.steps(mode="TRAIN"):
        present = trial.tensor_names(collection="gradients", mode="TRAIN", step=step)
        if not present or len(present) < len(names):
            continue  # a step where only some gradients were saved has no total norm
        total = 0.0
        for name in present:
            value = np.asarray(trial.tensor(name).value(step, mode="TRAIN"), dtype=np.float64)
            total += float(np.sum(value * value))
        grad_steps.append(step)
        grad_norm.append(math.sqrt(total) if math.isfinite(total) else float("nan"))
    return Curves(loss_steps, loss, grad_steps, grad_norm)


@dataclass
class NonFinite:
    """The first saved step at which some gradient was not finite, and which ones (network order)."""

    step: int
    layers: list[str]
    total_layers: int


def first_nonfinite(trial: Any, collection: str = "gradients") -> NonFinite | None:
    import numpy as np

    names = trial.tensor_names(collection=collection, mode="TRAIN")
    for step in trial.steps(mode="TRAIN"):
        bad = []
        for name in trial.tensor_names(collection=collection, mode="TRAIN", step=step):
            if not np.all(np.isfinite(trial.tensor(name).value(step, mode="TRAIN"))):
                bad.append(name.split("/", 1)[1])
        if bad:
            return NonFinite(step=step, layers=bad, total_layers=len(names))
    return None


def layer_norms(trial: Any, step: int, collection: str = "gradients", biases: bool = False) -> dict[str, float]:
    """Norm of each tensor of a collection at one step, in network order (NaN/inf kept as such).

    Biases are left out unless asked for: their norms are orders of magnitude below the weights'
    and interleaving them hides the trend across layers.
    """
    import numpy as np

    out = {}
    for name in trial.tensor_names(collection=collection, mode="TRAIN", step=step):
        if not biases and name.endswith("bias"):
            continue
        value = np.asarray(trial.tensor(name).value(step, mode="TRAIN"), dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            out[name.split("/", 1)[1]] = float(np.sqrt(np.sum(value * value)))
    return out
