"""Whether the network's weights are moving: a flat loss over moving weights is a search, over still ones a stall.

A loss that has not fallen in the learning check's patience (100 steps at least) is stopped as NotLearning on
its way, and the remedy raises the rate. That answers a rate far too low: the network's weights barely move
(Adam at 5e-7 moved a small language model's sampled weights 0.001 % of their size in 100 steps). It does not answer a
network whose weights move as far as a healthy run's while its loss stays flat: a recurrent network that must
carry a token across a dozen steps sits at its chance level for 110 steps and then falls to 0.002 (stop 66's
verdict hunt, an LSTM at Adam's 3e-3 stopped at step 99), as a sparse parity sits at chance for 300. No rule
of the loss tells that run from one that never learns until it has; its weights tell it from a stall. So a
run whose sampled weights moved by more than ``MOVING`` of their size since the learning check's first window
is left to run, and its end judges it.

The weights are sampled, not copied: up to ``SAMPLE`` values spread evenly over each of the first ``TENSORS``
parameters that train, read at the first window's close (``mark``) and again when the check asks (``moved``:
one synchronisation, at a window's close past the patience of a run that has not learned). The weights
measured are those that trained at the mark: a trunk frozen then and unfrozen later (a fine-tune's schedule)
neither dilutes nor changes what is measured, and the unfrozen run's head, moving as before, keeps it a search
(stop 66's second hunt found such runs stopped four steps after their unfreeze, when the parameters read changed).
Not for tensor subclasses (a ``DTensor``, whose reshaping is a collective) or parameters not yet materialised (a
lazy module's).

This module must not change gradients or weights: it reads detached copies under ``no_grad``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

SAMPLE = 256  # values read per parameter, spread evenly over it
TENSORS = 512  # parameters read at most: the first ones, in the network's order
# A relative move (the norm of the sampled weights' change over their norm) above which the weights are moving.
# Measured in 100 steps of a small language model on labels that carry nothing: Adam at 5e-7 0.001 %, at 5e-5
# 0.13 %, at 3e-3 9 %; plain SGD at 0.01 0.16 %, at 0.1 1.2 %.
MOVING = 0.01
# A relative move within the learning check's first window (five steps) above which a rate threw the network from its
# start: weights replaced by more than themselves. A small language model's in four steps of Adam: at its own rate
# 1e-3 2 %, at 1e-2 15 %, at 0.1 150 % (its loss still fell), at 1 1,570 % (its loss seven times its first step).
THROWN = 1.0


class WeightMotion:
    """The network's sampled weights at a mark, and how far they have moved since."""

    def __init__(self, module: Any) -> None:
        self._module = weakref.ref(module)
        # (the parameter, held weakly; the stride its values were read at; those values) of each parameter that
        # trained at the mark: those are the weights whose motion is measured.
        self._marked: list[tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = []

    def mark(self) -> None:
        """Read the weights from which ``moved`` measures: those that train now."""
        module = self._module()
        self._marked = []
        if module is None:
            return
        with torch.no_grad():
            for parameter in module.parameters():
                if len(self._marked) == TENSORS:
                    break
                if (parameter.requires_grad and type(parameter) in (torch.nn.Parameter, torch.Tensor)
                        and parameter.numel() > 0):  # not a subclass: a DTensor, a lazy module's placeholder
                    stride = max(1, parameter.numel() // SAMPLE)
                    self._marked.append((weakref.ref(parameter), stride, _read(parameter, stride).clone()))

    def moved(self) -> float | None:
        """The norm of the change since ``mark`` of the weights that trained then (whether they train now or not:
        a trunk unfrozen later is no part of it, nor one frozen since of what it moved before), over their norm
        then; None without a mark, or once none of them is left."""
        then, now = [], []
        with torch.no_grad():
            for held, stride, values in self._marked:
                parameter = held()
                current = None if parameter is None else _read(parameter, stride)
                if current is not None and current.shape == values.shape:
                    then.append(values)
                    now.append(current.to(values.device))
        if not then:
            return None
        before = torch.cat(then)
        size = float(before.norm())  # one synchronisation on an accelerator, with the next
        return float((torch.cat(now) - before).norm()) / size if size > 0 else None


def _read(parameter: torch.Tensor, stride: int) -> torch.Tensor:
    """At most ``SAMPLE`` values of a parameter, every ``stride``-th of it, detached, in double precision; a
    complex one's real and imaginary parts side by side (cast to a real type, its imaginary part was dropped,
    with a warning that a script turning warnings into errors raised: stop 77's harm hunt)."""
    values = parameter.detach().reshape(-1)[::stride][:SAMPLE]
    if values.is_complex():
        values = torch.view_as_real(values.resolve_conj()).reshape(-1)
    return values.double()
