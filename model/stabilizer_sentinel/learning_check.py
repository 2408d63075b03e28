"""The sentinel's learning and divergence checks: thresholds from the run's own statistics.

``LearningCheck`` reads one loss (and the learning rate) per step and finds three things:

* **NotLearning**: the loss has not fallen below where the run started. "Fallen" means windows
  below the mean of the first window by more than both ``min_decrease`` of its magnitude and
  ``confidence`` standard errors of the difference of two window means (the per-step noise comes
  from the run, ``NoiseEstimate``), or a least-squares line through the run's steps that fell by
  ``confidence`` standard errors and ends below the start, ``CONFIRM_WINDOWS`` windows in a row.
  The check gives up on a run only after ``patience`` main-phase steps: by default the longest of
  ``patience_windows`` windows, ``warmup_multiple`` times the warm-up the run took, and
  ``run_fraction`` of the run when its length (``run_steps``) is known. Warm-up steps do not
  count, and when the script does not say which steps are warm-up the learning rate does
  (``PhaseTracker``). Even then it waits while the noise could still hide a fall, or while the
  loss rises (the divergence bound's business). A completed run that never learned is found at
  its end.
* **Diverging**: ``persistence`` consecutive steps above the bound ``baseline + spreads * scale``.
  The baseline is the first window's mean (the lineage's, for a resumed run); the scale is the
  largest of the loss's magnitude there, the range it has fallen since, and ``noise_spreads``
  times the per-step noise. For a positive loss far from zero that is the classic "ten times
  where it started"; for a loss that is negative or near zero (a log-likelihood, a fine-tune from
  a trained state) the range and the noise set it, never a ratio. One or two steps above the
  bound are hard batches of a noisy run; three in a row are a trend, and so is one step
  ``jump_spreads`` scales above the baseline (an explosion, caught before it overflows).
* **LossNotDecreasing** (a plateau after learning), only when ``plateau_patience`` is set.

The job's rule list overrides every default: an entry named ``NotLearning`` or ``Diverging``
(``stabilizer_sentinel.rules.checks``) carries the parameters; docs/rules.md lists them with their reasons.

This module must not touch the model, the optimizer or files: it watches numbers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from stabilizer_contract.catalogue import DIVERGING, NOT_LEARNING
from stabilizer_sentinel.loss_statistics import NoiseEstimate, PhaseTracker, Trend
from stabilizer_sentinel.rules import RuleFinding

PLATEAU = "LossNotDecreasing"
VANISHING = "VanishingGradient"
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


@dataclass
class LearningCheck:
    # -- NotLearning: whether the loss fell, and how long to wait for it
    window: int = 5  # steps per window mean: one batch is too noisy, a whole epoch too slow
    min_decrease: float = 0.05  # a fall below the start must also be this fraction of its magnitude
    confidence: float = 3.0  # standard errors a fall (or a slope) must exceed to be more than noise
    patience: int | None = None  # main-phase steps to learn in; None: derived (patience_steps)
    patience_windows: int = 6  # at least this many windows: the noise of a few windows is no verdict
    warmup_multiple: float = 1.0  # at least this times the warm-up: a gentle warm-up predicts a slow start
    run_fraction: float = 0.1  # at least this fraction of run_steps, when the run's length is known
    run_steps: int | None = None  # the run's length in steps, when the job knows it
    infer_phase: bool = True  # read the warm-up from a rising learning rate when the script does not say
    lr_rise: float = 1e-3  # a rate this fraction above every rate before it is rising (warm-up)
    # -- Diverging: the bound baseline + spreads * scale, held for persistence steps
    spreads: float = 9.0  # 9 scales above a positive start is ten times it, the classic bound
    noise_spreads: float = 3.0  # the scale is at least this many per-step noise deviations
    persistence: int = 3  # steps in a row above the bound: one or two are hard batches, three a trend
    jump_spreads: float = 90.0  # one step this many scales above the baseline is diverging at once
    rising: float = 0.5  # a loss this fraction of the scale above its best is climbing, not flat
    baseline: float | None = None  # the bound's reference; None: the mean of the first window
    scale: float | None = None  # the bound's scale; None: derived from the run
    # -- plateau after learning (Debugger's LossNotDecreasing name); off unless plateau_patience is set
    plateau_decrease: float = 0.01
    plateau_patience: int | None = None

    def __post_init__(self) -> None:
        self._sum = 0.0
        self._count = 0
        self._first: tuple[int, float] | None = None  # (last step of the first window, its mean)
        self._best: tuple[int, float] | None = None  # plateau reference: the best window, by plateau_decrease
        self._lowest: float | None = None  # the lowest window mean
        self._last: tuple[int, float] | None = None
        self._learned_at: int | None = None
        self._below = 0  # consecutive windows below the start by the margin
        self._phase = PhaseTracker(infer=self.infer_phase, rise=self.lr_rise)
        self._noise = NoiseEstimate()
        self._lineage_noise: float | None = None
        self._trend = Trend()
        self._recent: deque[float] = deque(maxlen=self.window)
        self._around: deque[float] = deque(maxlen=max(CENTRE_STEPS, self.window))
        self._centre: float | None = None
        self._window_noise: float | None = None
        self._bound: float | None = None
        self._scale = 0.0
        self._above = 0
        self._fired = False
        self._refresh_bound()

    @classmethod
    def configured(cls, rules: Iterable[Any]) -> LearningCheck:
        """The check with the parameters of the rule list's ``NotLearning`` and ``Diverging`` entries."""
        names = {f.name for f in fields(cls)}
        settings: dict[str, Any] = {}
        for rule in rules:
            if getattr(rule, "name", None) in (NOT_LEARNING, DIVERGING):
                settings.update({k: v for k, v in rule.parameters.items() if k in names})
        return cls(**settings)

    # -- what others read
    @property
    def learned(self) -> bool:
        return self._learned_at is not None

    @property
    def start_loss(self) -> float | None:
        """The mean loss of the lineage's first window: where training started; None before it closes."""
        return None if self._first is None else self._first[1]

    @property
    def best_loss(self) -> float | None:
        """The lowest window mean seen (the lineage's, for a resumed run); None before a window closes."""
        return self._lowest

    @property
    def scale_of_loss(self) -> float | None:
        """The scale the divergence bound is measured in (see ``_refresh_bound``); None until known."""
        return self._scale if self._scale > 0 else None

    @property
    def noise(self) -> float | None:
        """The per-step noise of the loss (a standard deviation), as estimated so far."""
        return self._noise.sigma if self._noise.sigma is not None else self._lineage_noise

    @property
    def warmup_steps(self) -> int:
        return self._phase.warmup_steps

    @property
    def main_steps(self) -> int:
        return self._phase.main_steps

    def patience_steps(self) -> int:
        """Main-phase steps the run may take to learn (the configured ``patience``, else derived)."""
        if self.patience is not None:
            return self.patience
        parts = [self.patience_windows * self.window, math.ceil(self.warmup_multiple * self.warmup_steps)]
        if self.run_steps:
            parts.append(math.ceil(self.run_fraction * self.run_steps))
        return max(parts)

    def climbing(self) -> bool:
        """Whether the loss of the last window of steps is well above the best so far (``rising``)."""
        if self._lowest is None or not self._recent or self._scale <= 0:
            return False
        level = sum(self._recent) / len(self._recent)
        return level - self._lowest > self.rising * self._scale

    # -- resume
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to be judged against the start of its lineage, not its own first steps."""
        return {"first": self._first, "main_steps": self.main_steps, "lowest": self._lowest, "noise": self.noise}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Judge this run against its lineage's first window. Whether it learned is not carried over:
        a run resumed from a state already on its way to diverging must show, in its own windows,
        a loss below where the lineage started."""
        first = state.get("first")
        self._first = self._best = None if first is None else (int(first[0]), float(first[1]))
        lowest = state.get("lowest")
        self._lowest = float(lowest) if lowest is not None else self.start_loss
        noise = state.get("noise")
        self._lineage_noise = float(noise) if noise is not None else None
        self._phase.main_steps = int(state.get("main_steps", 0))
        self._refresh_bound()

    # -- per step
    def observe(
        self, step: int, loss: float, phase: str | None, learning_rate: float | None = None
    ) -> RuleFinding | None:
        """Record one training step's loss; a finding when the run is found diverging or not learning."""
        self._phase.observe(phase, learning_rate)
        if self._fired or not math.isfinite(loss):
            return None  # a non-finite loss is the finite check's business
        if self._bound is not None:
            self._above = self._above + 1 if loss > self._bound else 0
            base = self._bound - self.spreads * self._scale
            if loss > base + self.jump_spreads * self._scale:  # no batch is that far off; an explosion is
                message = (f"the loss {loss:.4g} jumped above {base + self.jump_spreads * self._scale:.4g}, "
                           f"{self.jump_spreads:g} x the loss's scale above the start ({self._bound_reason()})")
                return self._fire(DIVERGING, step, message, loss)
            if self._above >= self.persistence:
                message = (f"the loss {loss:.4g} has been above the divergence bound {self._bound:.4g} for "
                           f"{self._above} steps ({self._bound_reason()})")
                return self._fire(DIVERGING, step, message, loss)
        self._noise.add(loss)
        self._trend.add(step, self._clipped(loss))
        self._recent.append(loss)
        self._around.append(loss)
        self._sum += loss
        self._count += 1
        if self._count < self.window:
            return None
        mean = self._sum / self._count
        self._sum, self._count = 0.0, 0
        self._centre = statistics.median(self._around)  # robust to a burst of spikes among the last steps
        self._window_noise = self.noise
        self._close_window(step, mean)
        return self._judge(step, at_end=False)

    def at_end(self, step: int) -> RuleFinding | None:
        """The verdict on a run that completed: it must have learned (needs two windows).

        For a resumed run the first window is its lineage's (``load_state_dict``), so a short
        relaunch is judged too, on windows of its own.
        """
        if self._fired or self._first is None or self._last is None or self._last[0] == self._first[0]:
            return None
        if self._learned_at is None and self._window_below(self._last[1]):
            self._learned_at = self._last[0]  # the run ended below its start: no later window can confirm it
        return self._judge(step, at_end=True)

    def arbitrate(self, step: int, findings: list[RuleFinding]) -> list[RuleFinding]:
        """VanishingGradient is never the finding while the loss climbs: it becomes Diverging.

        Tiny gradients under a loss that rises are not a signal too weak to learn from (the remedy
        for which is a higher rate) but a run leaving training behind (a saturated output, a
        log-likelihood running away); answering it with a higher learning rate makes it worse.
        """
        vanishing = [f for f in findings if f.rule == VANISHING]
        if not vanishing:
            return findings
        if not (self.climbing() or any(f.rule == DIVERGING for f in findings)):
            return findings
        kept = [f for f in findings if f.rule != VANISHING]
        if not self._fired:
            level = sum(self._recent) / len(self._recent)
            message = (f"the loss is climbing ({level:.4g} over the last {len(self._recent)} steps, best "
                       f"{self._lowest:.4g}) while {vanishing[0].message}: diverging, not vanishing "
                       f"({self._bound_reason()})")
            kept.insert(0, self._fire(DIVERGING, step, message, level))
        return kept

    # -- internals
    def _close_window(self, step: int, mean: float) -> None:
        self._last = (step, mean)
        self._lowest = mean if self._lowest is None else min(self._lowest, mean)
        if self._first is None:
            self._first = self._best = (step, mean)
        else:
            assert self._best is not None
            if self._learned_at is None and self._has_learned(mean):
                self._learned_at = step
            if mean <= self._best[1] - self.plateau_decrease * abs(self._best[1]):
                self._best = (step, mean)
        self._refresh_bound()

    def _window_below(self, mean: float) -> bool:
        """Whether a window mean is below the start by ``min_decrease`` of its magnitude and by
        ``confidence`` standard errors of the difference of two means of ``window`` steps.

        A run too short for its noise to be measured (fewer than ``RELIABLE_NOISE`` steps: it can be
        judged only at its end) is judged by ``min_decrease`` alone.
        """
        start = self.start_loss
        assert start is not None
        floor = self.min_decrease * abs(start)
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
        start = self.start_loss
        assert start is not None
        sigma = self.noise or 0.0
        fall = self._trend_fall(sigma)
        level = self._trend.level_at_end()
        line = (fall is not None and level is not None and fall[0] > self.confidence * fall[1]
                and fall[0] > self.min_decrease * abs(start) and level < start)
        if not (line or self._window_below(mean)):
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

        It should when its loss rose by more than the noise (a run on its way to diverging: the
        bound stops it, and the remedies answer that with a lower rate, where "never learned"
        would end it with none); while this process has too few steps of its own to measure its
        noise or draw its line (a run resumed late in its patience); and when the noise could
        still hide a fall of ``min_decrease`` (the upper confidence limit of the line's fall
        reaches it): a noisy run shows its progress later, and a run whose noise never lets it is
        judged at its end.
        """
        sigma = self.noise or 0.0
        floor = self.min_decrease * abs(first)
        if last - first > max(floor, self.confidence * sigma * math.sqrt(2.0 / self.window)):
            return True
        fall = self._trend_fall(sigma)
        if fall is None or self._noise.samples < RELIABLE_NOISE:
            return True
        return fall[0] + self.confidence * fall[1] >= floor > 0

    def _clipped(self, loss: float) -> float:
        """The loss for the trend line: within ``OUTLIER`` noise deviations of the recent median.

        A batch far worse than the rest (a hard example in a tiny batch) would tilt the line more
        than a hundred ordinary steps; the window means and the bound still see it whole.
        """
        sigma = self._window_noise  # as of the last window: the estimate is not recomputed every step
        if self._centre is None or not sigma:
            return loss
        return min(max(loss, self._centre - OUTLIER * sigma), self._centre + OUTLIER * sigma)

    def _refresh_bound(self) -> None:
        base = self.baseline if self.baseline is not None else self.start_loss
        if base is None:
            self._bound, self._scale = None, 0.0
            return
        if self.scale is not None:
            self._scale = self.scale
        else:
            fallen = base - self._lowest if self._lowest is not None else 0.0
            self._scale = max(abs(base), fallen, self.noise_spreads * (self.noise or 0.0))
        self._bound = base + self.spreads * self._scale if self._scale > 0 else None

    def _bound_reason(self) -> str:
        base = self.baseline if self.baseline is not None else self.start_loss
        where = "the configured baseline" if self.baseline is not None else "the mean of the first window"
        return f"{where} {base:.4g} + {self.spreads:g} x the loss's scale {self._scale:.4g}"

    def _judge(self, step: int, *, at_end: bool) -> RuleFinding | None:
        if self._first is None or self._last is None or self._best is None:
            return None
        first_step, first = self._first
        last_step, last = self._last
        patience = self.patience_steps()
        if self._learned_at is None and (at_end or self.main_steps >= patience):
            if not at_end and self._undecided(first, last):
                return None
            change = last - first
            when = ("by the end of the run" if at_end
                    else f"in {self.main_steps} steps after warm-up (patience {patience})")
            message = (
                f"the loss never learned {when}: mean {first:.4g} over the steps to {first_step}, "
                f"{last:.4g} over the steps to {last_step} ({change:+.4g}; a fall of at least "
                f"{self.min_decrease * 100:g}% of the start and {self.confidence:g} standard errors of "
                f"the noise {self.noise or 0.0:.3g} per step was required)"
            )
            return self._fire(NOT_LEARNING, step, message, last)
        best_step, best = self._best
        if (self.plateau_patience is not None and self._learned_at is not None and not at_end
                and last_step - best_step >= self.plateau_patience):
            message = (
                f"the loss plateaued: best mean {best:.4g} at step {best_step}, no improvement of "
                f"{self.plateau_decrease * 100:g}% in the {last_step - best_step} steps since (now {last:.4g})"
            )
            return self._fire(PLATEAU, step, message, last)
        return None

    def _fire(self, rule: str, step: int, message: str, value: float) -> RuleFinding:
        self._fired = True
        return RuleFinding(rule, step, "losses/loss", value, message)
