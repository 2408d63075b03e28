"""Whether a loss repeats batch for batch, and how far it fell cycle for cycle: the same batches in the same order.

A script that takes its batches in a fixed order (slices ``X[i:i + batch]`` in turn, an unshuffled ``DataLoader``,
a time series cut in chunks) gives each batch a loss level of its own that comes back every epoch. The learning
check's per-step noise (second differences of neighbouring steps: ``loss_statistics.NoiseEstimate``) reads those
steady differences as noise, and its windows of five steps hold different batches, so a healthy run's fall can
stay within that noise to its end: stop 78's regression over ten slices in order (Huber loss, Adam, 40 to 300
steps, seeds 0 and 1; its test loss half a guess's) was found never to have learned at each of the eight, its
cycle means 0.468, 0.417, ... 0.375 at 80 steps against a per-step noise of 0.265.

Where the losses repeat with a period of ``P`` steps (the second differences ``P`` steps apart are at most
``REPEATS`` of those one step apart: the batches' levels cancel in them, the noise does not), any ``P`` steps in
a row hold every batch once, so the mean of the last ``P`` steps against the first ``P`` measures the fall with the
batches' levels cancelled, and the second differences ``P`` apart give its noise (``CycleFall``).

This module must not touch the model, the optimizer or files, and must not import torch.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from stabilizer_sentinel.detection.loss_statistics import trimmed_deviation

# The second differences one period apart must be at most this fraction of those one step apart (their trimmed
# mean absolute values, each in units of the per-step noise): for independent noise both estimate the same
# deviation, and on 30 or more differences each a third is far outside what chance gives (stop 78's simulation).
REPEATS = 1.0 / 3.0
# Cycles the losses must span before a period is read from them: two differences of differences need three.
LEAST_CYCLES = 3
# Losses kept from the start of a run (``LearningCheck``): the test reads a run's first cycle, so a run longer
# than this is not read by cycles at all (its line through the steps has long since measured its fall), and the
# search over periods stays a fraction of a second once, at the run's end.
KEPT = 1024
# The fewest second differences an estimate rests on (12 left after the trimming): at 12 in all, independent noise
# of 30 and of 40 steps read a period 3 and 4 times in 5,000 runs, at 14 once and 4 times.
LEAST_DIFFERENCES = 14


def _deviation(losses: Sequence[float], lag: int) -> float | None:
    """The per-step noise read from the second differences ``lag`` steps apart (``x[t + lag] - 2 x[t] + x[t - lag]``,
    ``loss_statistics.trimmed_deviation``); None on fewer than ``LEAST_DIFFERENCES``."""
    differences = [abs(losses[t + lag] - 2.0 * losses[t] + losses[t - lag]) for t in range(lag, len(losses) - lag)]
    return trimmed_deviation(differences) if len(differences) >= LEAST_DIFFERENCES else None


def _period(losses: Sequence[float], base: float) -> tuple[int, float] | None:
    """``period`` given the noise one step apart (``base``)."""
    for lag in range(2, len(losses) // LEAST_CYCLES + 1):
        deviation = _deviation(losses, lag)
        if deviation is None or deviation > REPEATS * base:
            continue
        twice = _deviation(losses, 2 * lag)  # a period repeats at twice itself too, where the run is long enough
        if twice is None or twice <= REPEATS * base:
            return lag, deviation
    return None


def period(losses: Sequence[float]) -> tuple[int, float] | None:
    """The least number of steps after which the losses repeat (``REPEATS``), over at least ``LEAST_CYCLES``
    cycles, and at twice that number too where the run is long enough to tell; and the per-step noise the
    differences one period apart read. None where they do not repeat."""
    base = _deviation(losses, 1)
    return _period(losses, base) if base is not None and base > 0 else None


@dataclass(frozen=True)
class CycleFall:
    """The first and the last ``period`` steps of a run whose losses repeat with that period, and the per-step noise
    with the batches' levels cancelled."""

    period: int
    first: float  # the mean loss of the first period's steps
    last: float  # the mean loss of the last period's steps
    noise: float
    per_step: float  # the noise as the neighbouring steps read it, for the words

    def error(self) -> float:
        """The standard error of one cycle's mean."""
        return self.noise / math.sqrt(self.period)


def cycle_fall(losses: Sequence[float]) -> CycleFall | None:
    """``CycleFall`` for losses that repeat (``period``), kept from a run's first step; None otherwise."""
    base = _deviation(losses, 1)
    found = _period(losses, base) if base is not None and base > 0 else None
    if found is None:
        return None
    lag, noise = found
    return CycleFall(lag, sum(losses[:lag]) / lag, sum(losses[-lag:]) / lag, noise, base)


class Kept:
    """A run's losses from its first step, up to ``KEPT`` of them, for ``cycle_fall`` at its end; and what that found
    where the run was judged by it (``found``: the fall, and the level it fell from)."""

    def __init__(self) -> None:
        self._losses = array("d")  # one more than KEPT marks a run longer than that
        self.found: tuple[CycleFall, float] | None = None

    def add(self, loss: float) -> None:
        if len(self._losses) <= KEPT:
            self._losses.append(loss)

    def fall(self) -> CycleFall | None:
        """``cycle_fall`` of every loss of the run; None for a run longer than ``KEPT`` steps."""
        return None if len(self._losses) > KEPT else cycle_fall(self._losses)
