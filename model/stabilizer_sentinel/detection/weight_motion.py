"""Whether the network's weights are moving: a flat loss over moving weights is a search, over still ones a stall.

A loss that has not fallen in the learning check's patience (100 steps at least) is stopped as NotLearning on
its way, and the remedy raises the rate. That answers a rate far too low: the network's weights barely move
(Adam at 5e-7 moves each weight at most 5e-5 in 100 steps, a thousandth of its size). It does not answer a
network whose weights move as far as a healthy run's while its loss stays flat: a recurrent network that must
carry a token across a dozen steps sits at its chance level for 110 steps and then falls to 0.002 (stop 66's
verdict hunt, an LSTM at Adam's 3e-3 stopped at step 99), as a sparse parity sits at chance for 300. No rule
of the loss tells that run from one that never learns until it has; its weights tell it from a stall. So a
run whose sampled weights moved by more than ``MOVING`` of their size since the learning check's first window
is left to run, and its end judges it.

The weights are sampled, not copied: up to ``SAMPLE`` values spread evenly over each of the first ``TENSORS``
parameters that train, read at the first window's close (``mark``) and again when the check asks (``moved``:
one synchronisation, at a window's close past the patience of a run that has not learned). Not for tensor
subclasses (a ``DTensor``, whose reshaping is a collective) or parameters not yet materialised (a lazy
module's).

This module must not change gradients or weights: it reads detached copies under ``no_grad``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

SAMPLE = 256  # values read per parameter, spread evenly over it
TENSORS = 512  # parameters read at most: the first ones, in the network's order
# A relative move (the norm of the sampled weights' change over their norm) above which the weights are moving:
# ten times a rate a hundred times too low moves Adam's weights in 100 steps, a tenth of what a healthy rate does.
MOVING = 0.01


class WeightMotion:
    """The network's sampled weights at a mark, and how far they have moved since."""

    def __init__(self, module: Any) -> None:
        self._module = weakref.ref(module)
        self._marked: torch.Tensor | None = None

    def mark(self) -> None:
        """Read the weights from which ``moved`` measures."""
        self._marked = self._sample()

    def moved(self) -> float | None:
        """The norm of the sampled weights' change since ``mark``, over their norm then; None without a mark, a
        network or weights of the same shape as then."""
        now = self._sample() if self._marked is not None else None
        if now is None or self._marked is None or now.shape != self._marked.shape:
            return None
        size = float(self._marked.norm())  # one synchronisation on an accelerator, with the next
        return float((now - self._marked).norm()) / size if size > 0 else None

    def _sample(self) -> torch.Tensor | None:
        module = self._module()
        if module is None:
            return None
        parts = []
        with torch.no_grad():
            for parameter in module.parameters():
                if len(parts) == TENSORS:
                    break
                if (not parameter.requires_grad or type(parameter) not in (torch.nn.Parameter, torch.Tensor)
                        or parameter.numel() == 0):  # a subclass: a DTensor, a lazy module's placeholder
                    continue
                flat = parameter.detach().reshape(-1)
                stride = max(1, flat.numel() // SAMPLE)
                parts.append(flat[::stride][:SAMPLE].double().to(parts[0].device if parts else flat.device))
        return torch.cat(parts) if parts else None
