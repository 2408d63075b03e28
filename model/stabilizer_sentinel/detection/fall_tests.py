"""Whether a loss fell: the window and line tests of the learning check (``LearningCheck`` mixes this in).

A window mean counts as a fall below the start when it is below by ``min_decrease`` of the start's
magnitude (of its height above the loss's floor, where one is known: ``_margin``) and by ``confidence``
standard errors of the difference of two window means; so does a
least-squares line through the run's steps that fell by as much and ends below the start, but only
``CONFIRM_WINDOWS`` windows in a row confirm that a run learned. The noise every test is measured
against is the run's own (stabilizer_sentinel.detection.loss_statistics.NoiseEstimate).

This module must not touch the model, the optimizer or files: it reads numbers the check keeps.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from stabilizer_sentinel.detection.loss_statistics import NoiseEstimate, Trend

# A step's loss further than this many noise deviations from the median of the recent steps is an
# outlier to the trend line: beyond 4 deviations a normal batch falls once in 16 000 steps.
OUTLIER = 4.0
# The trend line's centre is the median of this many recent steps: a window of five can hold three spikes.
CENTRE_STEPS = 25
# Windows in a row that must show the fall (at a run's end the last alone will do): with normal noise,
# 3 in a row come once in 800 windows of a flat run even when its first window was 3 errors high.
CONFIRM_WINDOWS = 3
# Second differences the noise estimate must rest on before a window counts towards having learned:
# an estimate from fewer is too often far off.
RELIABLE_NOISE = 24
# A line that fell by more than its noise, at a pace that reaches ``min_decrease`` within this many times
# the steps it spans, is a run learning slowly (plain SGD on a digits MLP fell 0.038 in its first 30 steps,
# a third of its 5 %, and learned 2.30 to 1.66 by step 280): the patience judges runs that do not move.
SLOW_REACH = 5


class FallTests:
    """The learning check's tests of a fall; the attributes are ``LearningCheck``'s."""

    window: int
    min_decrease: float
    confidence: float
    patience_windows: int
    noise: float | None
    learning_start: float | None
    _noise: NoiseEstimate
    _trend: Trend
    _below: int
    _exploded: float | None
    _centre: float | None
    _window_noise: float | None
    _around: deque[float]
    _recent: deque[float]
    _tail: deque[float]
    chance: Any
    term: Any
    _lowest: float | None
    _last: tuple[int, float] | None
    _scale: float
    rising: float

    def climbing(self) -> bool:
        """Whether the loss of the last window of steps is well above the best so far (``rising``)."""
        if self._lowest is None or not self._recent or self._scale <= 0:
            return False
        level = sum(self._recent) / len(self._recent)
        return level - self._lowest > self.rising * self._scale

    def _window_below(self, mean: float, start: float | None = None) -> bool:
        """Whether a window mean is below the start (``start``, else ``_reference()``) by ``min_decrease``
        of its magnitude and by ``confidence`` standard errors of the difference of two means of
        ``window`` steps.

        A run too short for its noise to be measured (fewer than ``RELIABLE_NOISE`` steps: it can be
        judged only at its end) is judged by ``min_decrease`` alone.
        """
        start = self._reference() if start is None else start
        floor = self._margin(start)
        if self._noise.samples < RELIABLE_NOISE:
            return start - mean > floor
        sigma = self.noise or 0.0
        return start - mean > max(floor, self.confidence * sigma * math.sqrt(2.0 / self.window))

    def _has_learned(self, mean: float) -> bool:
        """Whether the window just closed confirms that the run learned.

        A window counts when its mean is below the start (``_window_below``), or when the line
        through every step of this process (whose noise shrinks as the run grows) fell by more than
        ``confidence`` standard errors and ``min_decrease`` and ends below the start. Every window is
        compared with the same first one, and the line is tested again at every window, so one lucky
        window is not enough: ``CONFIRM_WINDOWS`` in a row are, once the noise they are measured
        against rests on ``RELIABLE_NOISE`` steps.
        """
        start = self.learning_start
        assert start is not None
        sigma = self.noise or 0.0
        fall = self._trend_fall(sigma)
        level = self._trend.level_at_end()
        floor = self._margin(start)
        # A line that fell from above the chance level to it is the prior being learned: no evidence.
        line = (fall is not None and level is not None and fall[0] > self.confidence * fall[1]
                and fall[0] > floor and level < start and (self._exploded is None or start - mean > floor)
                and self._reference() == start)
        if not (line or self._window_below(mean) or self._tail_below_chance()):
            self._below = 0
        elif self._noise.samples >= RELIABLE_NOISE:
            self._below += 1
        return self._below >= CONFIRM_WINDOWS

    def _trend_fall(self, sigma: float) -> tuple[float, float] | None:
        """How far the least-squares line fell over this process's steps, and its standard error;
        None before ``patience_windows`` windows of steps (a line through a few steps is noise)."""
        trend = self._trend
        slope, error = trend.slope, trend.slope_error(sigma)
        if trend.count < self.patience_windows * self.window or slope is None or error is None:
            return None
        span = (trend.last_step or 0) - (trend.first_step or 0)
        return -slope * span, error * span

    def _undecided(self, first: float, last: float) -> bool:
        """Whether a run that has not learned by its patience should still be left to run.

        It should when its loss rose by more than the noise: a run on its way to diverging, which the
        bound stops or its end judges, and the remedies answer with a lower rate, where "never
        learned" would end it with none (not merely well above its best: a run thrown up in its first
        steps could then fall back below a start its climb had inflated, and be called learned); when a
        window of it was once below the start by more than the noise (it learned, though no three
        windows in a row confirmed it yet: "never learned" would be false, and a loss that went back
        up is the divergence checks' business); while
        this process has too few steps of its own to measure its noise or draw its line (a run
        resumed late in its patience); when the noise could still hide a fall of
        ``min_decrease`` (the upper confidence limit of the line's fall reaches it): a noisy run
        shows its progress later, and a run whose noise never lets it is judged at its end; and when
        the line fell by more than ``confidence`` standard errors at a pace that reaches
        ``min_decrease`` within ``SLOW_REACH`` times its span (a slow start; a crawl a hundred times
        too slow to get there is still judged).
        """
        if last - first > self._significant(first):
            return True
        if self._lowest is not None and self._window_below(self._lowest):
            return True  # it fell below its start by more than the noise once: it learns, or it went back up
        sigma = self.noise or 0.0
        floor = self._margin(first)
        fall = self._trend_fall(sigma)
        if fall is None or self._noise.samples < RELIABLE_NOISE:
            return True
        if fall[0] > self.confidence * fall[1] and SLOW_REACH * fall[0] >= floor > 0:
            return True  # falling beyond the noise, on pace to clear the margin: learning slowly
        return fall[0] + self.confidence * fall[1] >= floor > 0

    def _floor(self) -> float | None:
        """The least loss any prediction scores, where it is known and not 0: a binary cross-entropy's alone, on
        soft targets (stabilizer_sentinel.detection.chance_level, ``ChanceLevel.floor``, read by the term's
        level); else None."""
        term = self.term
        if term is None or term.off or not term.alone:
            return None
        return term.floor()

    def _margin(self, start: float) -> float:
        """The least fall below ``start`` that counts: ``min_decrease`` of its height above the loss's floor
        where one is known (``_floor``), else of its magnitude. A loss on soft targets can fall no further than
        their entropy, and a student distilled from a teacher's softened probabilities starts 2 % above it."""
        floor = self._floor()
        return self.min_decrease * (abs(start) if floor is None else max(start - floor, 0.0))

    def _chance(self) -> float | None:
        return self.chance.level() if self.chance is not None else None

    def _reference(self) -> float:
        """What a fall is measured from: the start, or the chance level when the start is above it (a
        fall to the chance level is the labels' prior or the targets' mean learned, not the inputs)."""
        start = self.learning_start
        assert start is not None
        chance = self._chance()
        return start if chance is None else min(start, chance)

    def _tail_below_chance(self) -> bool:
        """Whether the mean of the last ``patience_windows`` windows of steps is below the chance level by
        ``min_decrease`` of it and ``confidence`` standard errors of that mean: no input-blind prediction
        scores that, so the run learned from its inputs, however little it fell from its start. The
        level is known exactly, so only the mean's own error counts, over the span the check already
        waits before it judges a run."""
        chance = self._chance()
        if chance is None or len(self._tail) < (self._tail.maxlen or 0):
            return False
        tail = list(self._tail)
        error = statistics.pstdev(tail) / math.sqrt(len(tail))
        return chance - statistics.fmean(tail) > max(self.min_decrease * abs(chance), self.confidence * error)

    def _ended_above_chance(self) -> bool:
        """Whether the mean of the last ``window`` steps is above the chance level by ``min_decrease`` of it
        and ``confidence`` standard errors of the difference: that mean's (its steps' own spread, as
        ``_tail_below_chance`` reads its span's: a run noise cannot yet be measured on, or one whose noise an
        early explosion inflated, is judged by what it did last) and the level's, estimated from the
        targets seen so far (``ChanceLevel.error``: a short run has seen a few dozen). Worse than that is
        worse than the best prediction that ignores the inputs."""
        chance = self._chance()
        last = list(self._tail)[-self.window:]
        if chance is None or len(last) < 2:
            return False
        spread = statistics.pstdev(last) / math.sqrt(len(last))
        level_error = getattr(self.chance, "error", lambda: 0.0)()
        error = math.hypot(spread, level_error)
        return statistics.fmean(last) - chance > max(self.min_decrease * abs(chance), self.confidence * error)

    def _floor_words(self) -> str:
        """Where the loss has a floor (``_floor``), how the least fall was measured from it."""
        floor = self._floor()
        return f"'s height above the loss's floor {floor:.4g} (its soft targets' own entropy)" if floor else ""

    def _chance_words(self) -> str:
        chance = self._chance()
        reason = getattr(self.chance, "reason", None)
        if chance is None and reason:
            return (f"; no chance level (the loss of a prediction that ignores the inputs) is known, as {reason}: "
                    f"the verdict rests on the fall from the start")
        if chance is not None and self._ended_above_chance():
            return (f"; its last steps ended above the loss {chance:.4g} of a prediction that ignores the inputs "
                    f"(the labels' prior or the targets' mean): whatever its fall, it learned nothing beyond that")
        if chance is None or self.learning_start is None or chance >= self.learning_start:
            return ""
        return (f"; it started above the loss {chance:.4g} of a prediction that ignores the inputs (the "
                f"labels' prior or the targets' mean), and a fall to that is no learning")

    def fell_beyond_noise(self) -> bool:
        """Whether the last window is below where the run started (``_reference``: the start, or the chance
        level where that is lower) by more than ``confidence`` standard errors of the difference of two
        window means: the noise alone, whatever the loss's magnitude. A run that never learned by the
        check's margin may still have: a loss on a large constant offset falls far beyond its noise and never
        by 5 % of its magnitude (1000 + a cross-entropy: 2.2 against a noise of 0.07 per step)."""
        if self._last is None or self.learning_start is None:
            return False
        sigma = self.noise or 0.0
        return self._reference() - self._last[1] > self.confidence * sigma * math.sqrt(2.0 / self.window)

    def _significant(self, start: float) -> float:
        """A change of two window means larger than this is more than noise: ``min_decrease`` of the start
        and ``confidence`` standard errors of the difference."""
        sigma = self.noise or 0.0
        return max(self.min_decrease * abs(start), self.confidence * sigma * math.sqrt(2.0 / self.window))

    def _clipped(self, loss: float) -> float:
        """The loss for the trend line: within ``OUTLIER`` noise deviations of the recent median.

        A batch far worse than the rest (a hard example in a tiny batch) would tilt the line more
        than a hundred ordinary steps; the window means and the bound still see it whole.
        """
        sigma = self._window_noise  # as of the last window: the estimate is not recomputed every step
        if self._centre is None or not sigma:
            return loss
        return min(max(loss, self._centre - OUTLIER * sigma), self._centre + OUTLIER * sigma)
