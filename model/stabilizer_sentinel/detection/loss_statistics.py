"""Running statistics of a training run's loss and learning rate, read by the sentinel's own checks.

The learning and divergence checks (``stabilizer_sentinel.detection.health``) take their thresholds from these
numbers instead of from constants: how noisy one step's loss is, whether the loss is trending
down, and whether the run is still warming up. Each costs O(1) per step (amortised) and bounded
memory, whatever the length of the run.

This module must not touch the model, the optimizer or files, and must not import torch.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from statistics import NormalDist

# Second differences kept for the noise estimate: enough for a stable median, few enough that
# the estimate follows the noise as it shrinks while the loss falls.
NOISE_SAMPLES = 64
# For independent normal noise of standard deviation s, x[t+1] - 2 x[t] + x[t-1] is normal with
# standard deviation sqrt(6) s; the mean of its absolute value, leaving out the largest eighth, is
# this many times s (``trimmed_mean_abs``).
TRIM = 0.125
_TRIMMED_MEAN_ABS_SECOND_DIFFERENCE = 1.5432
# A spike touches three second differences; a spike and the step after it (the step recovering from
# it, a line search thrown out and back) touch four. Once there are ``SPIKE_SAMPLES`` of them, at least
# that many are left out, however few an eighth is (an LBFGS run thrown to 135 and to 10.5 at its tenth
# and eleventh steps, 0.05 to 0.8 around them, read 0.59 with three left out and 0.23 with four).
SPIKE_DIFFERENCES = 4
SPIKE_SAMPLES = 16


def trimmed_mean_abs(kept: float) -> float:
    """The mean of |x[t+1] - 2 x[t] + x[t-1]| over the lowest ``kept`` fraction of them, in units of the
    noise's standard deviation s: sqrt(6) s times E[|Z| : |Z| below its ``kept`` quantile]."""
    edge = NormalDist().inv_cdf((1.0 + kept) / 2.0)
    unit = NormalDist()
    return math.sqrt(6.0) * 2.0 * (unit.pdf(0.0) - unit.pdf(edge)) / kept


def trimmed_deviation(differences: Sequence[float]) -> float:
    """The noise's standard deviation read from absolute second differences (at least one): the mean of them
    without the largest ``TRIM`` (and without ``SPIKE_DIFFERENCES`` at least, once there are ``SPIKE_SAMPLES``),
    in units of what that mean is for independent normal noise (``trimmed_mean_abs``)."""
    ordered = sorted(differences)
    dropped = int(len(ordered) * TRIM)
    if len(ordered) >= SPIKE_SAMPLES and dropped < SPIKE_DIFFERENCES:
        dropped = SPIKE_DIFFERENCES
    kept = ordered[: len(ordered) - dropped]
    unit = _TRIMMED_MEAN_ABS_SECOND_DIFFERENCE if dropped == int(len(ordered) * TRIM) \
        else trimmed_mean_abs(len(kept) / len(ordered))
    return sum(kept) / len(kept) / unit


class NoiseEstimate:
    """The standard deviation of one step's loss around its trend, robust to spikes and to the trend.

    Read from second differences (a linear trend cancels, so a falling or rising loss is not taken
    for noise) through the mean of their absolute values without the largest eighth (a spike
    touches three of them, so a few outliers among ``NOISE_SAMPLES`` are left out; a trimmed mean
    wanders less than a median on few samples). None until three finite losses were seen.
    """

    def __init__(self, samples: int = NOISE_SAMPLES) -> None:
        self._diffs: deque[float] = deque(maxlen=samples)
        self._levels: deque[float] = deque(maxlen=samples)  # the loss each difference is centred on
        self._previous: tuple[float, ...] = ()
        self._sigma: float | None = None
        self._stale = False

    def add(self, loss: float) -> None:
        if len(self._previous) == 2:
            before, last = self._previous
            self._diffs.append(abs(loss - 2.0 * last + before))
            self._levels.append(last)
            self._stale = True
            self._previous = (last, loss)
        else:
            self._previous = (*self._previous, loss)

    @property
    def samples(self) -> int:
        return len(self._diffs)

    @property
    def sigma(self) -> float | None:
        """The estimate, widened while it rests on few samples (by ``1 + 8 / samples``: 1.3 times at
        27, 1.125 at 64), so that a handful of steps that happen to agree is not taken for a quiet run."""
        if self._stale:  # recomputed only when asked (about once a window), over at most NOISE_SAMPLES
            self._sigma = trimmed_deviation(self._diffs) * (1.0 + 8.0 / len(self._diffs))
            self._stale = False
        return self._sigma

    @property
    def level(self) -> float | None:
        """The median loss of the steps the estimate is read from (where the loss was while it spread
        that much); None before the first difference."""
        return statistics.median(self._levels) if self._levels else None


class Trend:
    """Least-squares line through (step, loss), updated online (Welford's co-moments)."""

    def __init__(self) -> None:
        self.count = 0
        self._mean_step = 0.0
        self._mean_loss = 0.0
        self._sxx = 0.0
        self._sxy = 0.0
        self.first_step: int | None = None
        self.last_step: int | None = None

    def add(self, step: int, loss: float) -> None:
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        self.count += 1
        delta = step - self._mean_step
        self._mean_step += delta / self.count
        self._mean_loss += (loss - self._mean_loss) / self.count
        self._sxx += delta * (step - self._mean_step)
        self._sxy += delta * (loss - self._mean_loss)

    @property
    def slope(self) -> float | None:
        return self._sxy / self._sxx if self.count >= 2 and self._sxx > 0 else None

    def slope_error(self, sigma: float) -> float | None:
        """Standard error of the slope for independent noise of standard deviation ``sigma``."""
        return sigma / math.sqrt(self._sxx) if self.count >= 2 and self._sxx > 0 else None

    def level_at_end(self) -> float | None:
        """The line's value at the last step: the loss now, with the noise of every step averaged out."""
        slope = self.slope
        if slope is None or self.last_step is None:
            return None
        return self._mean_loss + slope * (self.last_step - self._mean_step)


def untrained_level(first_window: list[float], spreads: float, jump_spreads: float | None = None,
                    thrown_spreads: float | None = None) -> tuple[float, float | None]:
    """Where a run's loss started, and the level of an explosion within its first window (None where there was
    none): the mean of the first window, or its first step's loss when the loss exploded within that window.

    The mean of the first steps is the start a learning check compares against; but a rate too high
    for the network can throw the loss thousands of times above its start within those steps (a
    spike, then a fall back to chance), and their mean would then call the fall back "learning".
    When the median of the window's other steps is more than ``spreads`` times the first step's
    magnitude above it (the divergence bound's "ten times where it started", measured from the one
    step no update has touched yet), the loss exploded: the first step alone is then the untrained
    network's level. The median, so that one hard batch among them (a fine-tune's spiky batch, ten
    to forty times the rest) is not taken for an explosion, while a loss that swings between ten
    and five hundred times its start is. One step ``jump_spreads`` magnitudes above the first is an
    explosion too, as it is after the first window (the divergence check's jump): thrown to
    thousands for a step or two and back, the loss has no start in the window's mean.

    ``thrown_spreads`` is given where the network's weights moved by more than their own size within the
    window (``weight_motion.THROWN``): a rate that did that threw the network from where it started, and a
    median of the other steps that many magnitudes above the first is an explosion too (an LM written by
    hand at a thousand times its rate went 5.8, 10.7, 82, 33, 50: seven times its first step, its weights
    moved 16 times their size). Without that motion an easy first batch is no explosion: a regression's
    batch of one can score a fifth of the rest. The level returned is the first step + the multiple
    that found the explosion times its magnitude.
    """
    first = first_window[0]
    rest = first_window[1:]
    if not rest:
        return first, None
    middle = statistics.median(rest)
    for multiple in (spreads, thrown_spreads):
        if multiple is not None and middle > first + multiple * abs(first):
            return first, first + multiple * abs(first)
    if jump_spreads is not None and max(rest) > first + jump_spreads * abs(first):
        return first, first + spreads * abs(first)
    return sum(first_window) / len(first_window), None


WARMUP = "warmup"
MAIN = "main"


class PhaseTracker:
    """Counts warm-up and main-phase steps, from the script's word or else from the learning rate.

    A step the script labels ``"warmup"`` or ``"main"`` counts as it says. For an unlabelled step
    the learning rate decides: a rate above every rate before it (by more than ``rise``, relative)
    means the run has not reached its peak rate yet, so that step and the unlabelled main-phase
    steps counted since the previous peak are warm-up (a linear warm-up, the first part of a
    one-cycle schedule, a constant low warm-up rate followed by a jump). A flat or decaying rate is
    the main phase. Without a learning rate an unlabelled step is main phase.
    """

    def __init__(self, *, infer: bool = True, rise: float = 1e-3) -> None:
        self.infer = infer
        self.rise = rise
        self.warmup_steps = 0
        self.main_steps = 0
        self._peak: float | None = None
        self._since_peak = 0  # unlabelled main-phase steps since the last peak, reclassified at a new one

    def observe(self, phase: str | None, learning_rate: float | None) -> str:
        """Count one step; its phase as far as is known now."""
        if phase in (WARMUP, MAIN):
            if phase == WARMUP:
                self.warmup_steps += 1
            else:
                self.main_steps += 1
            return phase
        if not self.infer or learning_rate is None or not math.isfinite(learning_rate):
            self.main_steps += 1
            return MAIN
        rising = self._peak is not None and learning_rate > self._peak * (1.0 + self.rise)
        if self._peak is None or learning_rate > self._peak:
            self._peak = learning_rate
        if rising:
            self.main_steps -= self._since_peak
            self.warmup_steps += self._since_peak + 1
            self._since_peak = 0
            return WARMUP
        self.main_steps += 1
        self._since_peak += 1
        return MAIN
