"""The script's learning-rate schedulers, read where the learning check must know whether the rate it sees now is a
warm-up's: a constant warm-up (PyTorch's ``ConstantLR``, alone, chained, or first in a ``SequentialLR``) holds the
rate at a fraction of the run's for its steps, and the loss may not move there. The learning check learns a warm-up
from a rising rate (stabilizer_sentinel.detection.loss_statistics, ``PhaseTracker``), but a constant one rises only
as it ends: a run whose warm-up is longer than the patience was stopped as not learning before it (stop 87's verdict
hunt: a digits network under ``ConstantLR(factor=0.01, total_iters=150)``, stopped at step 99, unwatched 0.954
accurate). The schedulers are found once, when first asked (``gc.get_referrers``: a scheduler holds its optimizer,
and nothing the watcher reaches holds a scheduler), and read from their attributes: nothing is stepped or copied.
Other schedules (a rate set by hand, a ``LambdaLR``) are left to the rate's rise.
"""

from __future__ import annotations

import bisect
import gc
import weakref
from typing import Any

import torch
from torch.optim.lr_scheduler import ChainedScheduler, ConstantLR, LinearLR, LRScheduler, SequentialLR


class Schedules:
    """The schedulers of one optimizer, found at the first question (``held_low``)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = weakref.ref(optimizer)
        self._found: list[weakref.ref[LRScheduler]] | None = None

    def of(self, optimizer: torch.optim.Optimizer) -> bool:
        return self._optimizer() is optimizer

    def held_low(self) -> bool:
        """Whether a scheduler of the optimizer holds its rate below what it will raise it to in a later step of the
        same schedule: a constant warm-up under way (``ConstantLR`` with a factor below 1, before its last step), or
        a linear one (``LinearLR`` rising)."""
        if self._found is None:
            optimizer = self._optimizer()
            self._found = [] if optimizer is None else [weakref.ref(found) for found in schedulers_of(optimizer)]
        return any(scheduler is not None and _held_low(scheduler) for scheduler in (ref() for ref in self._found))


def schedulers_of(optimizer: torch.optim.Optimizer) -> list[LRScheduler]:
    """The schedulers that step ``optimizer``, those a ``SequentialLR`` or ``ChainedScheduler`` steps left out (they
    are read through it: one whose turn is over keeps the count it had)."""
    found: list[LRScheduler] = []
    for holder in gc.get_referrers(optimizer):
        if isinstance(holder, LRScheduler):
            found.append(holder)
        elif isinstance(holder, dict):  # the attributes of a scheduler whose ``__dict__`` was made
            found += [owner for owner in gc.get_referrers(holder)
                      if isinstance(owner, LRScheduler) and _attributes(owner) is holder]
    inside = {id(child) for scheduler in found for child in _children(scheduler)}
    unique = {id(scheduler): scheduler for scheduler in found if getattr(scheduler, "optimizer", None) is optimizer}
    return [scheduler for key, scheduler in unique.items() if key not in inside]


def _attributes(owner: Any) -> Any:
    try:
        return object.__getattribute__(owner, "__dict__")
    except AttributeError:
        return None


def _children(scheduler: LRScheduler) -> list[LRScheduler]:
    if isinstance(scheduler, SequentialLR | ChainedScheduler):
        return list(getattr(scheduler, "_schedulers", ()))
    return []


def _held_low(scheduler: LRScheduler) -> bool:
    """Read from the attributes PyTorch's schedulers keep (a version without one reads as nothing held low)."""
    step, last = getattr(scheduler, "last_epoch", 0), getattr(scheduler, "total_iters", 0)
    if isinstance(scheduler, ConstantLR):
        return getattr(scheduler, "factor", 1.0) < 1.0 and step < last
    if isinstance(scheduler, LinearLR):
        return getattr(scheduler, "start_factor", 1.0) < getattr(scheduler, "end_factor", 1.0) and step < last
    if isinstance(scheduler, SequentialLR):
        children = list(getattr(scheduler, "_schedulers", ()))
        current = bisect.bisect_right(list(getattr(scheduler, "_milestones", ())), step)
        return current < len(children) and _held_low(children[current])
    if isinstance(scheduler, ChainedScheduler):
        return any(_held_low(child) for child in getattr(scheduler, "_schedulers", ()))
    return False
