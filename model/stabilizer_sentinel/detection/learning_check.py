"""The sentinel's learning and divergence checks: thresholds from the run's own statistics.

``LearningCheck`` reads one loss (and the learning rate) per step and finds three things:

* **NotLearning**: the loss has not fallen below where the run started: the mean of the first
  window, or its first step's loss when the loss exploded within that window (``untrained_level``:
  a fall back from thousands to chance is no learning). "Fallen" means windows
  below that start by more than both ``min_decrease`` of its magnitude and
  ``confidence`` standard errors of the difference of two window means (the per-step noise comes
  from the run, ``NoiseEstimate``), or a least-squares line through the run's steps that fell by
  ``confidence`` standard errors and ends below the start, ``CONFIRM_WINDOWS`` windows in a row.
  The check gives up on a run only after ``patience`` main-phase steps: by default the longest of
  ``patience_windows`` windows, ``min_patience`` steps, ``warmup_multiple`` times the warm-up the run took, and
  ``run_fraction`` of the run when its length (``run_steps``) is known. Warm-up steps do not
  count, and when the script does not say which steps are warm-up the learning rate does
  (``PhaseTracker``). Even then it waits while the noise could still hide a fall, while the
  loss rises or climbs well above its best, or when a window of it was once below the start by more
  than the noise (the divergence checks' business). A completed run that never learned is found at
  its end: as NotLearning, or as Diverging when it ended above its start by more than the noise
  or still above the level of an explosion in its first window (a rate too high, not too low).
  A run that never learned is Diverging at its patience too when the mean of its last steps is
  above its quiet first window by more than the spread of each (a noise that grew with the loss
  would hide the rise), or when it spiked above the bound and never learned past the spike.
* **Diverging**: ``persistence`` consecutive steps above the bound ``baseline + spreads * scale``.
  The baseline is the first window's mean (the lineage's, for a resumed run); the scale is the
  largest of the loss's magnitude there, the range it has fallen since, and ``noise_spreads``
  times the per-step noise (read at a positive start's level: ``_noise_at``). For a positive loss
  far from zero that is the classic "ten times where it started"; for a loss that is negative or
  near zero (a log-likelihood, a fine-tune from a trained state) the range and the noise set it,
  never a ratio. One or two steps above the
  bound are hard batches of a noisy run; three in a row are a trend, and so is one step
  ``jump_spreads`` scales above the baseline (an explosion, caught before it overflows). Before the
  first window closes, a loss whose chance level is known is measured from its first step, in the
  larger of its magnitude and that level (``_first_window_finding``); after it too, where that window
  climbed (``_chance_cap``: its mean is no start).
  A run that never learned after its loss rose from its first step and fell back (a network a rate
  too high saturated, back at about chance) is Diverging too (``_rose_and_fell``).
  VanishingGradient is never the finding while the loss climbs, nor after a spike above the bound
  (or an explosion in the first window) that the run never learned past: it becomes Diverging. In a
  run whose loss learned it is a notice: told, and the run goes on (``arbitrate``).
* **LossNotDecreasing** (a plateau after learning), only when ``plateau_patience`` is set.

The job's rule list overrides every default: an entry named ``NotLearning`` or ``Diverging``
(``stabilizer_sentinel.rules.checks``) carries the parameters; docs/rules.md lists them with their reasons.

This module must not touch the model, the optimizer or files: it watches numbers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from stabilizer_contract.catalogue import DIVERGING, NOT_LEARNING
from stabilizer_sentinel.detection import (
    batch_cycle,
    batch_rows,
    chance_level,
    input_blind,
    loss_makeup,
    surrogate,
    weight_motion,
)
from stabilizer_sentinel.detection.fall_tests import CENTRE_STEPS, FallTests
from stabilizer_sentinel.detection.loss_statistics import NoiseEstimate, PhaseTracker, Trend, untrained_level
from stabilizer_sentinel.rules import RuleFinding

PLATEAU = "LossNotDecreasing"
# A window is back at the chance level when it is within this fraction of how far below that level the run had
# learned (``LearningCheck._relapsing``): nine tenths of it lost.
RELAPSE = 0.1
VANISHING = "VanishingGradient"
# A squared error no worse than this many times its targets' variance is no worse than a guess drawn from their own
# distribution (the variances of two independent draws add up): ``LearningCheck._spread_grew``.
GUESS = 2.0
# What a run judged afresh from a step keeps (``LearningCheck._begin_segment``): the listeners, the phase, whether
# it learned and whether its loss is judged at all.
SEGMENT_KEEPS = ("chance", "term", "makeup", "surrogate", "input_blind", "motion", "killed", "rivals", "_makeups",
                 "_segments", "_lineage_here", "_phase", "_learned_at", "_unjudged", "_blind", "_term_at_chance",
                 "_fired")
# How a finding names the term of known level a sum adds up (``LearningCheck._term_finding``), by its kind.
TERM_WORDS = {"cross_entropy": "cross-entropy", "squared_error": "squared-error",
              "binary_cross_entropy": "binary cross-entropy"}


@dataclass
class LearningCheck(FallTests):
    # -- NotLearning: whether the loss fell, and how long to wait for it
    window: int = 5  # steps per window mean: one batch is too noisy, a whole epoch too slow
    min_decrease: float = 0.05  # a fall below the start must also be this fraction of its magnitude
    confidence: float = 3.0  # standard errors a fall (or a slope) must exceed to be more than noise
    patience: int | None = None  # main-phase steps to learn in; None: derived (patience_steps)
    patience_windows: int = 6  # at least this many windows: the noise of a few windows is no verdict
    # ... and at least this many steps: a network at its chance level for its first tens of steps learns
    # later as often as not (RAdam's rectified start, plain SGD at a small rate on a digits MLP: flat for 30
    # steps, 2.30 to 1.6 by step 280), and a dead run stopped later costs steps where a live one stopped costs
    # the run.
    min_patience: int = 100
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
    # a first window whose weights moved more than their size (weight_motion.THROWN) exploded at this many
    thrown_spreads: float = 3.0
    # a run that learned and whose windows then stayed this many scales above the start for its patience lost it
    # (``_relapsing``, where no chance level is known)
    relapse_spreads: float = 1.0
    rising: float = 0.5  # a loss this fraction of the scale above its best is climbing, not flat
    baseline: float | None = None  # the bound's reference; None: the mean of the first window
    scale: float | None = None  # the bound's scale; None: derived from the run
    # -- plateau after learning (Debugger's LossNotDecreasing name); off unless plateau_patience is set
    plateau_decrease: float = 0.01
    plateau_patience: int | None = None
    # Whether the script's scheduler holds the rate at a warm-up's fraction now and raises it later (``Guard``:
    # stabilizer_sentinel.loops.schedules): a constant warm-up, not yet the main phase, whatever the rate says. A
    # listener, as ``rivals``; not a setting (no annotation: no field of the dataclass).
    held_low = None

    def __post_init__(self) -> None:
        self._sum, self._count = 0.0, 0
        self._first: tuple[int, float] | None = None  # (last step of the first window, its mean)
        self._first_spread: float | None = None  # the standard deviation of the first window's steps
        self._start: float | None = None  # where learning is measured from (loss_statistics.untrained_level)
        self._first_step: float | None = None  # this process's first loss: the network before its first update
        self._first_here = False  # the lineage's first window closed in this process (not a resumed run's)
        self._first_up: tuple[int, float, float | None] | None = None  # (step, loss, rate) first at twice that
        self._peak: float | None = None  # the highest window mean of this process
        self._early_above = 0  # consecutive first-window steps above the provisional bound
        self._spike: tuple[int, float] | None = None  # the first step above the divergence bound
        self._exploded: float | None = None  # the level of an explosion within the first window
        self._best: tuple[int, float] | None = None  # plateau reference: the best window, by plateau_decrease
        self._lowest: float | None = None  # the lowest window mean
        self._last: tuple[int, float] | None = None
        self._learned_at: int | None = None
        self._below = 0  # consecutive windows below the start by the margin
        self._relapsed: list[tuple[int, float]] = []  # consecutive windows back at the chance level (``_relapse``)
        self._phase = PhaseTracker(infer=self.infer_phase, rise=self.lr_rise)
        self._noise = NoiseEstimate()
        self._lineage_noise: float | None = None
        self._trend = Trend()
        self._recent: deque[float] = deque(maxlen=self.window)
        self._recent_rates: deque[float | None] = deque(maxlen=self.window)  # the rates of ``_recent``'s steps
        self._spike_rate: float | None = None  # the learning rate at the spike's step
        self._tail: deque[float] = deque(maxlen=self.patience_windows * self.window)
        # This process's losses from its first step: a run whose batches come in a fixed order is judged cycle for
        # cycle at its end (``_fell_by_cycles``). The rows of the latest steps' batches: a short one's loss is left out.
        self._cycles, self._rows = batch_cycle.Kept(), batch_rows.BatchRows()
        self.chance: chance_level.ChanceLevel | None = None  # the loss's chance level, where it can be read
        self.term: chance_level.TermLevel | None = None  # a sum's one term of known level (``_term_finding``)
        self._term_at_chance = False  # that term ended at its level: whatever the sum did, it did not learn
        self.makeup: loss_makeup.LossMakeup | None = None  # the terms the backward passes add up (``_begin_segment``)
        self._makeups: frozenset[frozenset[str]] = frozenset()  # the makeups of the loss seen so far
        self._segments: list[tuple[int, str]] = []  # (step, why) where the bound started afresh (``_begin_segment``)
        self._lineage_here = False  # this process closed the lineage's first window (``began_here``)
        self.surrogate: surrogate.Surrogate | None = None  # whether the loss is a surrogate's (``unjudged``)
        # Why the loss is not judged, once found (a surrogate's, read at a window's close; a term with no room
        # between its floor and its level, at the end: ``_term_finding``): nothing is judged after it.
        self._unjudged: str | None = None
        # Whether the network's output ignored its input, where the watcher reads its forward passes (the guard).
        self.input_blind: input_blind.InputBlind | None = None
        self._blind = False  # it ended input-blind (``at_end``): whatever the loss did, it did not learn
        # Whether the network's weights move, where the watcher reads them (``_moving``), and how far they had
        # moved where a run not learned by its patience was left to run for it.
        self.motion: weight_motion.WeightMotion | None = None
        self._left_moving: float | None = None
        # Whether steps too large killed the network, where the watcher can tell (``Sentinel._killed``: in-job
        # recovery holds the first copy): such a run is judged on its way, moving or not, and rolled back.
        self.killed: Callable[[], bool] | None = None
        # Whether another optimizer steps in the run (a GAN's second player, an actor's critic: ``Guard``): a loss
        # played against another's is not judged by how far it climbed back above its start (``_relapsing``).
        self.rivals: Callable[[], bool] | None = None
        self._around: deque[float] = deque(maxlen=max(CENTRE_STEPS, self.window))
        # The median of the latest steps, and the noise, as the last window closed (floats, None before).
        self._centre = self._window_noise = None
        self._bound: float | None = None
        self._level_read: float | None = None  # ``_ceiling()`` as the bound was last refreshed (``_chance_cap``)
        self._scale, self._above = 0.0, 0
        # The last steps' (step, loss, rate), for ``_held_above``.
        self._held: deque[tuple[int, float, float | None]] = deque(maxlen=self.persistence * self.window)
        # Whether a finding ended the check; why nothing is judged while a rate range test goes on (``swept``).
        self._fired, self._sweeping = False, None
        # A squared error's targets (``ChanceLevel.take_block``) of each of the last steps, and of the first window's
        # steps together (``_spread_grew``).
        self._targets: tuple[deque[Any], Any] = (deque(maxlen=max(self.window, self.persistence)), None)
        self._refresh_bound()

    @classmethod
    def configured(cls, rules: Iterable[Any]) -> LearningCheck:
        """The check with the parameters of the rule list's ``NotLearning`` and ``Diverging`` entries."""
        names = {f.name for f in fields(cls)}
        settings: dict[str, Any] = {}
        for rule in rules:
            if getattr(rule, "name", None) in (NOT_LEARNING, DIVERGING):
                settings.update({k: v for k, v in rule.parameters.items() if k in names})
        check = cls(**settings)
        check.chance = chance_level.listen(check)
        check.term = chance_level.listen_term(check, check.patience_windows)
        check.makeup = loss_makeup.listen(check)
        check.surrogate = surrogate.listen(check)
        return check

    # -- what others read
    @property
    def learned(self) -> bool:
        return self._learned_at is not None and not self._unjudged and not self._blind and not self._term_at_chance

    @property
    def began_here(self) -> bool:
        """Whether this process closed the lineage's first window: it trained from the lineage's start, not
        from a state a relaunch resumed."""
        return self._lineage_here

    @property
    def judgeable(self) -> bool:
        """Whether a window of losses closed after the first: a verdict needs two (``at_end``). Steps whose loss
        the check never took (a script logging it every tenth step, the log the only channel) do not count."""
        return self._first is not None and self._last is not None and self._last[0] != self._first[0]

    @property
    def blind(self) -> bool:
        """Whether the run's network was found input-blind (its verdict: stabilizer_sentinel.detection.input_blind)."""
        return self._blind

    @property
    def unjudged(self) -> str | None:
        """Why the loss is not judged (a policy gradient's surrogate: stabilizer_sentinel.detection.surrogate; a
        binary cross-entropy on targets whose own entropy is about its level: ``_term_finding``; a run that ended
        inside a rate range test past its blow-up: ``swept``), else None."""
        return self._unjudged or self._sweeping

    @property
    def start_loss(self) -> float | None:
        """The mean loss of the lineage's first window: where training started; None before it closes."""
        return None if self._first is None else self._first[1]

    @property
    def learning_start(self) -> float | None:
        """Where the loss started, for judging whether it learned: the first window's mean, or its
        first step's loss when the loss exploded within that window (``untrained_level``)."""
        return self._start if self._start is not None else self.start_loss

    @property
    def best_loss(self) -> float | None:
        """The lowest window mean seen (the lineage's, for a resumed run); None before a window closes."""
        return self._lowest

    @property
    def last_window_loss(self) -> float | None:
        """The mean loss of the last ``window`` steps checked: where the run ended, less noisy than its
        last step's loss; None before any step."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    @property
    def wrecked_at(self) -> int | None:
        """The step of a spike above the divergence bound (or an explosion in the first window), or of
        the first step of a rise the loss fell back from (``_rose_and_fell``), that the run never
        learned past: where its run-up began, whatever was found later; for a run that learned and lost
        it (``_relapse``), the first step of its first window back at the chance level; None without one."""
        wreck = self._wreck()
        if wreck is None:
            relapsed = len(self._relapsed) * self.window >= self.patience_steps()
            return self._relapsed[0][0] - self.window + 1 if relapsed else None
        return wreck[0]

    @property
    def wrecked_rate(self) -> float | None:
        """The learning rate at ``wrecked_at``'s step: the rate that wrecked the run, whatever it has
        decayed to by the step the run is judged at; None without one (or where it was not given)."""
        wreck = self._wreck()
        return None if wreck is None else wreck[2]

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
        parts = [self.patience_windows * self.window, self.min_patience,
                 math.ceil(self.warmup_multiple * self.warmup_steps)]
        if self.run_steps:
            parts.append(math.ceil(self.run_fraction * self.run_steps))
        return max(parts)

    # -- resume
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to be judged against the start of its lineage, not its own first steps."""
        return {"first": self._first, "main_steps": self.main_steps, "lowest": self._lowest, "noise": self.noise,
                "start": self._start, "spike": self._spike, "spike_rate": self._spike_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Judge this run against its lineage's first window. Whether it learned is not carried over:
        a run resumed from a state already on its way to diverging must show, in its own windows,
        a loss below where the lineage started."""
        first = state.get("first")
        self._first = self._best = None if first is None else (int(first[0]), float(first[1]))
        self._first_here = self._lineage_here = False
        start, spike = state.get("start"), state.get("spike")
        self._start = float(start) if start is not None else None
        self._spike = None if spike is None else (int(spike[0]), float(spike[1]))
        rate = state.get("spike_rate")
        self._spike_rate = float(rate) if rate is not None else None
        lowest = state.get("lowest")
        self._lowest = float(lowest) if lowest is not None else self.start_loss
        noise = state.get("noise")
        self._lineage_noise = float(noise) if noise is not None else None
        self._phase.main_steps = int(state.get("main_steps", 0))
        self._refresh_bound()

    # -- per step
    def observe(
        self, step: int, loss: float, phase: str | None, learning_rate: float | None = None, rows: int | None = None
    ) -> RuleFinding | None:
        """Record one training step's loss; a finding when the run is found diverging or not learning. ``rows``: the
        rows of the step's batch, where the watcher saw them; a short batch's loss is left out
        (stabilizer_sentinel.detection.batch_rows: a loss summed over its rows is smaller there)."""
        self._phase.observe(phase, learning_rate)
        self._targets[0].append(self._take_targets())
        if self._fired:
            return None
        self._new_makeup(step)
        if not math.isfinite(loss) or self._rows.short(rows):
            return None  # a non-finite loss is the finite check's business; a short batch's loss is no window's
        if self._first is None and not self._recent and self.motion is not None:
            self.motion.mark()  # the weights the first window starts from (``_thrown``)
        if self._first_step is None:
            self._first_step = loss
        elif self._first_up is None and loss - self._first_step > abs(self._first_step):
            self._first_up = (step, loss, learning_rate)
        if self._bound is None and self._first is None and self._recent:
            early = self._first_window_finding(step, loss, learning_rate)
            if early is not None:
                return early
        if self._bound is not None and not self._unjudged:  # a surrogate's loss is counted, never judged
            bounded = self._bound_finding(step, loss, learning_rate)
            if bounded is not None:
                return bounded
        self._noise.add(loss)
        if self._exploded is not None and loss > self._exploded:
            # The recovery from an explosion at the start is not learning: the line, and the median it
            # clips outliers around, start after it.
            self._trend, self._centre = Trend(), None
            self._around.clear()
        else:
            self._trend.add(step, self._clipped(loss))
            self._around.append(loss)
        self._recent.append(loss)
        self._recent_rates.append(learning_rate)
        self._tail.append(loss)
        self._cycles.add(loss)
        self._sum += loss
        self._count += 1
        if self._count < self.window:
            return None
        mean = self._sum / self._count
        self._sum, self._count = 0.0, 0
        self._centre = statistics.median(self._around) if self._around else None  # robust to a burst of spikes
        self._window_noise = self.noise
        self._close_window(step, mean)
        return self._blind_finding(step, at_end=False) or self._relapse(step) or self._judge(step, at_end=False)

    def _bound_finding(self, step: int, loss: float, learning_rate: float | None) -> RuleFinding | None:
        """Diverging, where the loss jumped far above the divergence bound, stayed above it ``persistence``
        steps, or its median held above the first step's chance bound (``_held_above``); else None."""
        cap = self._chance_cap(loss)
        bound = self._bound if cap is None else min(self._bound, cap[0])  # a first window that climbed
        self._above = self._above + 1 if loss > bound else 0
        if self._above and self._spike is None:
            self._spike, self._spike_rate = (step, loss), learning_rate
        base = self._bound - self.spreads * self._scale
        jumped = loss > base + self.jump_spreads * self._scale
        if (jumped or self._above >= self.persistence) and self._spread_grew(loss):
            self._begin_segment(step, "the spread of its squared error's targets grew with the loss")
            return None
        if jumped:  # no batch is that far off; an explosion is
            message = (f"the loss {loss:.4g} jumped above {base + self.jump_spreads * self._scale:.4g} "
                       f"({self._bound_reason(self.jump_spreads)})")
            return self._fire(DIVERGING, step, message, loss)
        if self._above >= self.persistence:
            level = (f", the loss {cap[3]:.4g} of a prediction that ignores the inputs" if cap is not None
                     and self._level_read is not None else "")
            reason = self._bound_reason() if cap is None or bound == self._bound else (
                f"its first step {cap[1]:.4g} + {self.spreads:g} x the loss's scale {cap[2]:.4g}, the largest of "
                f"that step's magnitude{level} and {self.noise_spreads:g} per-step noise deviations; the first "
                f"window's mean {base:.4g} is no baseline above that bound")
            message = (f"the loss {loss:.4g} has been above the divergence bound {bound:.4g} for "
                       f"{self._above} steps ({reason})")
            return self._fire(DIVERGING, step, message, loss)
        held = self._held_above(step, loss, learning_rate)
        return None if held is None else self._fire(DIVERGING, step, held, loss)

    def _take_targets(self) -> Any:
        """A squared error's targets since the last step (``ChanceLevel.take_block``); None for another loss."""
        take = getattr(self.chance, "take_block", None)  # a level given by hand reads no targets
        return take() if take is not None else None

    def _spread_grew(self, loss: float) -> bool:
        """Whether a squared error above the bound rose with its targets' spread, not against it: the mean of its
        steps above the bound (the last ``persistence`` at most, ``loss`` the last) is no more than ``GUESS`` times
        the variance of those steps' targets (what a guess drawn from the targets' own distribution scores: twice
        their variance), and against that variance no more than ``GUESS`` times what the first window's mean was
        against its own targets'. A DQN's temporal-difference loss rises so, 0.02 to 5 and more, as the values it
        bootstraps its targets from grow (their variance with them: a terminal step's target is the reward alone): a
        healthy run, stopped at step 1465 (stop 71's hunt). A regression that diverges scores far above its targets'
        spread. Then the run is judged afresh (``_begin_segment``): the bound is measured on the new scale. Two host
        synchronisations where a step would be found diverging, none otherwise."""
        steps, first = self._targets
        above = min(self._above, self.persistence) or 1
        blocks = [block for block in list(steps)[-above:] if block is not None]
        if first is None or len(blocks) < above or self._first is None:
            return False
        now, then = chance_level.spread(blocks), chance_level.spread([first])
        if now is None or then is None or not then > 0:
            return False
        losses = [*list(self._recent)[len(self._recent) - above + 1:], loss] if above > 1 else [loss]
        mean = sum(losses) / len(losses)
        return mean <= GUESS * now and mean * then <= GUESS * self._first[1] * now

    def at_end(self, step: int) -> RuleFinding | None:
        """The verdict on a run that completed: it must have learned (needs two windows).

        For a resumed run the first window is its lineage's (``load_state_dict``), so a short
        relaunch is judged too, on windows of its own.
        """
        if self._fired or not self._judged() or not self.judgeable:
            return None
        if (blind := self._blind_finding(step, at_end=True)) is not None:
            return blind
        # A run that ended before the chance level's own span (``patience_windows`` windows) is judged
        # against its start, as the chance level's tail test cannot judge it yet; not one whose last steps
        # ended well above that level, which learned nothing beyond an input-blind guess whatever its fall.
        short = len(self._tail) < (self._tail.maxlen or 0) and not self._ended_above_chance()
        ended_below = self._window_below(self._last[1], self.learning_start if short else None)
        if self._learned_at is None and (ended_below or self._tail_below_chance()):
            self._learned_at = self._last[0]  # the run ended below its start: no later window can confirm it
        if self._learned_at is not None and (same := self._same_by_cycles()) is not None:
            self._learned_at = None
            return self._fire(NOT_LEARNING, step, same, self._last[1])
        judged = self._judge(step, at_end=True)
        if judged is not None and judged.rule == NOT_LEARNING and (cycles := self._fell_by_cycles()) is not None:
            self._fired, self._learned_at, self._cycles.found = False, self._last[0], cycles  # learned, by its cycles
            return self._term_finding(step)
        if judged is not None and judged.rule == NOT_LEARNING and (why := self._fell_past_its_windows()):
            self._unjudged = why  # neither learned nor not: unverified (``learned`` None), nothing to remedy
            return None
        return judged if judged is not None or not self.learned else self._term_finding(step)

    def _fell_by_cycles(self) -> tuple[batch_cycle.CycleFall, float] | None:
        """How a completed run found never to have learned fell, cycle for cycle, where its losses repeat batch for
        batch (a loop that takes the same batches in the same order: stabilizer_sentinel.detection.batch_cycle), and
        from where; None unless its last cycle's mean is below its first's (or the chance level, where that is
        lower: a fall to it is the prior learned) by ``min_decrease`` of it and by ``confidence`` standard errors of
        the difference, the noise read one period apart. Only for a run that started here (not a resumed one: its
        first cycle is no start of its lineage's), whose first window did not explode and whose every loss was kept
        (``batch_cycle.KEPT``)."""
        if not self._first_here or self._exploded is not None or self.learning_start is None:
            return None
        fall = self._cycles.fall()
        if fall is None:
            return None
        chance = self._chance()
        start, error = fall.first, fall.error() * math.sqrt(2.0)
        if chance is not None and chance < start:  # known: the last cycle's error alone, and the level's own
            start, error = chance, math.hypot(fall.error(), getattr(self.chance, "error", lambda: 0.0)())
        return (fall, start) if start - fall.last > max(self._margin(start), self.confidence * error) else None

    def _same_by_cycles(self) -> str | None:
        """Why a completed run whose windows fell did not learn, where its losses repeat batch for batch
        (stabilizer_sentinel.detection.batch_cycle) and its last cycle's mean is not below its first's by
        ``confidence`` standard errors of the difference, the noise read one period apart: the same batches scored
        at its end as at its start, and its windows' fall was the batches' levels (their first window's batches
        scoring above their last window's). Stop 82's hunt: a plain loop's token-level loss over batches bucketed
        by length and taken longest first, at rate 0, fell from 6.35 to 4.94 window for window, every epoch's losses
        the same to the last digit, and was called learned; so was TRL's SFT at rate 0 with ``group_by_length``.
        None where they do not repeat, or fell; only for a run that started here whose first window did not
        explode, as ``_fell_by_cycles``, and never judged afresh (``_begin_segment``): a run that learned one loss
        and then repeats another's batches, converged, has learned."""
        if not self._first_here or self._exploded is not None or self.learning_start is None or self._segments:
            return None
        fall = self._cycles.fall()
        if fall is None or fall.first - fall.last > self.confidence * fall.error() * math.sqrt(2.0):
            return None
        return (f"the run did not learn by its end: its losses repeat every {fall.period} steps (batches in a fixed "
                f"order, each at a level of its own), and its last {fall.period} steps' mean {fall.last:.4g} is not "
                f"below its first {fall.period}'s {fall.first:.4g} by {self.confidence:g} standard errors of the "
                f"noise {fall.noise:.3g} per step one cycle apart: the same batches scored the same at its end as at "
                f"its start, and the fall of its windows ({self.learning_start:.4g} at the start, "
                f"{self._last[1] if self._last else float('nan'):.4g} over the last) was their batches' levels")

    @property
    def learned_by_cycles(self) -> str | None:
        """How a completed run learned where only its cycles showed it (``_fell_by_cycles``), else None."""
        if self._cycles.found is None or not self.learned:
            return None
        fall, start = self._cycles.found
        whence = (f"its first {fall.period}'s {start:.4g}" if start == fall.first
                  else f"the loss {start:.4g} of a prediction that ignores the inputs")
        return (f"its losses repeat every {fall.period} steps (batches in a fixed order, each at a level of its "
                f"own): its last {fall.period} steps' mean {fall.last:.4g} is below {whence} by more than "
                f"{self.confidence:g} standard errors of the noise {fall.noise:.3g} per step one cycle apart (the "
                f"per-step noise {fall.per_step:.3g} reads the batches' levels as noise)")

    def _fell_past_its_windows(self) -> str | None:
        """Why a completed run found never to have learned cannot be told from one that learned, or None when it can.

        Its last ``window`` steps' mean is below its first window's (or the chance level, where that is lower:
        ``_reference``) by ``min_decrease`` of it and by ``confidence`` standard errors of the difference, each
        window's error from its own steps' spread; only the per-step noise of the whole run hides the fall. A short
        run whose batches come in a fixed order, each with a level of its own, has that noise (the second
        differences read the batches' steady differences as noise): stop 77's harm hunt's regression of four batches
        fell from 5.3 to 1.5 in 26 steps, each batch's loss by half, and was found never to have learned (and then,
        its weights having moved, killed by a rate too high: relaunched at a lower one) at 26 and 28 steps as the
        launcher watched it (26 to 34 with no chance level known), where at 24 and at 40 it learned. Not where the
        first window exploded (its spread is the explosion's) or the last steps ended above the chance level (no
        fall shows learning beyond a guess there); a flat run of independent noise passes this test at its end about
        once in 115 (a simulation of two windows of five)."""
        spread, last, n = self._first_spread, list(self._recent), self.window
        if (self.learning_start is None or spread is None or self._exploded is not None or len(last) < n or n < 2
                or self._ended_above_chance()):
            return None
        # From the start, or from the chance level where that is lower (a fall to it is the prior learned), which
        # is known: then the last steps' spread alone.
        start = self._reference()
        first = spread ** 2 / (n - 1) if start == self.learning_start else 0.0  # a sample deviation's square / n
        mean = statistics.fmean(last)
        error = math.sqrt(first + statistics.variance(last) / len(last))
        if not start - mean > max(self._margin(start), self.confidence * error):
            return None
        whence = "first window's" if start == self.learning_start else "chance level"
        return (f"its last {len(last)} steps' mean {mean:.4g} is below its {whence} {start:.4g} by more than "
                f"{self.confidence:g} standard errors of their own spread, but not beyond the per-step noise "
                f"{self.noise or 0.0:.3g} of the whole run (a loss whose batches come in a fixed order, each at a "
                f"level of its own, reads so): too few steps to tell whether it learned")

    def arbitrate(self, step: int, findings: list[RuleFinding]) -> list[RuleFinding]:
        """VanishingGradient is never the finding while the loss climbs: it becomes Diverging. Nor does
        it stop a run whose loss learned: there it is told, not acted on.

        Tiny gradients under a loss that rises are not a signal too weak to learn from (the remedy
        for which is a higher rate) but a run leaving training behind (a saturated output, a
        log-likelihood running away); answering it with a higher learning rate makes it worse. Tiny
        gradients in a tensor of a run whose loss has learned (``learned``: confirmed below its start)
        are that tensor converged or saturated while the rest trains (a forward-forward network's
        first layer once it separates its data, an attention projection a high rate saturated):
        stopping it would end a run that learns, and a higher rate would not mend a saturated
        tensor. A loss that then stalls is the learning check's (and LossNotDecreasing's) to find.
        """
        vanishing = [f for f in findings if f.rule == VANISHING]
        if not vanishing:
            return findings
        wrecked = self._wreck() is not None  # a spike or a rise the run never learned past
        if not (self.climbing() or wrecked or any(f.rule == DIVERGING for f in findings)):
            return [self._told(f) if f.rule == VANISHING else f for f in findings] if self.learned else findings
        kept = [f for f in findings if f.rule != VANISHING]
        if not self._fired and self._recent:
            level = sum(self._recent) / len(self._recent)
            how = (f"the loss is climbing ({level:.4g} over the last {len(self._recent)} steps, best "
                   f"{self._lowest:.4g})" if self.climbing() else
                   f"the loss never learned since it {'spiked' if self._spike else 'rose'}{self._spike_words()}")
            message = f"{how} while {vanishing[0].message}: diverging, not vanishing ({self._bound_reason()})"
            kept.insert(0, self._fire(DIVERGING, step, message, level))
        return kept

    # -- internals
    def _told(self, finding: RuleFinding) -> RuleFinding:
        """``finding`` (VanishingGradient) as a notice: the run's loss learned."""
        start, best = self.learning_start, self._lowest
        learned = (f" from {start:.4g} to a window mean of {best:.4g}" if start is not None and best is not None
                   else "")
        return replace(finding, stops=False, message=(
            f"{finding.message}; the loss learned{learned}: a tensor whose gradient vanished while the "
            f"loss learns has converged or saturated, so this is told and the run goes on"))

    def _ceiling(self) -> float | None:
        """The chance level, or while a cross-entropy's is still being measured ln of its classes
        (``ChanceLevel.ceiling``: no level is higher); None while neither is known."""
        ceiling = getattr(self.chance, "ceiling", None)
        return ceiling() if ceiling is not None else self._chance()

    def _chance_bound(self, chance: float | None) -> tuple[float, float, float, float] | None:
        """The bound from the first step for a loss whose chance level is ``chance`` (``_ceiling``): (the
        bound, the first step's loss, the scale, the chance level), the scale the larger of that step's
        magnitude and the level; None without either."""
        first = self._first_step
        if chance is None or first is None:
            return None
        scale = max(abs(first), chance)
        return first + self.spreads * scale, first, scale, chance

    def _chance_cap(self, loss: float | None = None) -> tuple[float, float, float, float] | None:
        """The first window's bound (``_chance_bound``), kept once the window has closed, where that
        window climbed: (the bound, the first step's loss, the scale, the chance level); the divergence
        bound is never above it. None where it does not apply. The level is the one read as the bound was
        last refreshed, once a window (``_level_read``): reading it is a synchronisation on an accelerator.
        Given the step's ``loss``, None too where that loss is below it, as it then bounds nothing.

        The divergence bound is measured from the first window's mean, and a loss that climbed within
        that window (a warm-up to a rate far too high: llama2.c's loss went from 4.1 at its first step to
        21 at its fifth) sets it from the climb: ten times that mean let the loss sit at fifteen times its
        chance level for tens of steps unfound. An untrained network scores about chance and no healthy
        run holds ten times the larger of that and its first step for ``persistence`` steps. It applies
        only where this process closed the lineage's first window (a resumed run's first step is a trained
        state's, not the untrained network's), that window's mean is above its first step by more than
        ``noise_spreads`` per-step noise deviations (which also widen its scale, as the bound's), and the
        rule configures no ``baseline`` or ``scale`` of its own.

        Where no chance level is known (a log-likelihood, a custom loss, a sum of terms), it applies where the
        loss exploded within that window (``untrained_level``: the median of its other steps more than
        ``spreads`` times the first step's magnitude above it, or ``thrown_spreads`` times where the weights moved more
        than their size, or one of them ``jump_spreads`` times), its scale
        that step's magnitude (and the noise): since stop 55.
        The window's mean was then the explosion's, and a loss that stayed at tens of times its first step
        (a label-smoothed cross-entropy, a focal loss, a ranking margin, a CTC, a mixture density's NLL at a
        rate a thousand times too high) was found at the run's end alone, too late for the job to roll back."""
        if self.baseline is not None or self.scale is not None or not self._first_here or self.start_loss is None:
            return None
        level = self._level_read
        known = self._chance_bound(level if level is not None or self._exploded is None else 0.0)
        if known is None or (loss is not None and loss <= known[0]):
            return None  # nothing to bound, or ``loss`` below it before the noise widens it: no noise read
        _, first, scale, chance = known
        noise = self.noise_spreads * self._noise_at(first)
        if self.start_loss - first <= noise:
            return None  # the first window did not climb: its mean is the start, as always
        scale = max(scale, noise)
        return first + self.spreads * scale, first, scale, chance

    def _held_above(self, step: int, loss: float, learning_rate: float | None) -> str | None:
        """Why the loss is diverging, where the median of its last ``persistence`` windows of steps is above
        its first step + ``spreads`` x the larger of that step's magnitude and its chance level; else None.

        The bound of ``_chance_cap`` without the noise: a median of fifteen steps is no single batch, and
        an untrained network scores about chance. The divergence bound widens with the per-step noise,
        and a loss thrown up by a rate far too high swings as widely as it stands high: a GPT at a rate ten
        thousand times its own went 5.8, 6.3, 12, 17, 17 in its first window, then between 23 and 128 for
        sixty steps, never three steps in a row above a bound its swings had carried to 160-380 (its
        noise, read at the start's level, 5 to 18 there), and was found at its end alone
        (stabilizer/bench/gpt_loop.py, ``--lr 3 --clip 0``, the device benchmark's small model, 120 steps).
        Only where the chance level is known and this process closed the lineage's first window, as
        ``_chance_cap``. The first of those steps above the bound is the spike, where no step passed the
        divergence bound before (the run-up and the rate at fault are measured from it)."""
        self._held.append((step, loss, learning_rate))
        if (len(self._held) < self._held.maxlen or self._level_read is None or not self._first_here
                or self.baseline is not None or self.scale is not None):
            return None
        known = self._chance_bound(self._level_read)
        if known is None:
            return None
        bound, first, scale, chance = known
        median = statistics.median(held_loss for _, held_loss, _ in self._held)
        if median <= bound:
            return None
        if self._spike is None:
            spike_step, spike_loss, rate = next(held for held in self._held if held[1] > bound)
            self._spike, self._spike_rate = (spike_step, spike_loss), rate
        return (f"the median {median:.4g} of the loss's last {len(self._held)} steps is above {bound:.4g} (its first "
                f"step {first:.4g} + {self.spreads:g} x the larger of that step's magnitude and the loss {chance:.4g} "
                f"of a prediction that ignores the inputs, {scale:.4g})")

    def rise_reference(self) -> tuple[float | None, float | None]:
        """(start, scale) a rise of the loss is measured from (stabilizer_sentinel.detection.health.run_up):
        the first window's mean and the bound's scale, or the first step and its scale where the chance
        level's bound from it is the lower (``_chance_cap``: the first window climbed)."""
        cap = self._chance_cap() if self._bound is not None else None
        if cap is not None and cap[0] < self._bound:
            return cap[1], cap[2]
        return self.start_loss, self.scale_of_loss

    def _first_window_finding(self, step: int, loss: float, learning_rate: float | None) -> RuleFinding | None:
        """The divergence check of the first window, before its mean sets the bound: for a loss whose
        chance level is known, ``persistence`` steps in a row above the first step + ``spreads`` x the
        larger of its magnitude and that level (an untrained network scores about chance, and no three
        batches of it score ten times that); while a cross-entropy's level is still being measured,
        ln of its classes stands in for it (``ChanceLevel.ceiling``: no level is higher). Without a
        chance level (a log-likelihood, a sum of terms) the first window waits: such a loss can start
        near zero and leap from there while healthy. No jump is judged here: a loss thrown that far
        in the first steps is a step from overflowing, and the finite check names it (ExplodingTensor).
        The level is read (a synchronisation on an accelerator) only for a loss above the bound without it."""
        first = self._first_step
        if first is not None and loss <= first + self.spreads * abs(first):
            self._early_above = 0  # below the bound whatever the level: no need to read it
            return None
        known = self._chance_bound(self._ceiling())
        if known is None:
            return None
        bound, first, scale, chance = known
        self._early_above = self._early_above + 1 if loss > bound else 0
        if self._early_above < self.persistence:
            return None
        back = self._early_above - 1  # the spike is the first of the steps above, still in this window's losses
        self._spike = (step - back, list(self._recent)[-back]) if back else (step, loss)
        self._spike_rate = list(self._recent_rates)[-back] if back else learning_rate
        message = (f"the loss {loss:.4g} has been above {bound:.4g} for {self._early_above} steps of its first "
                   f"{self.window} (its first step {first:.4g} + {self.spreads:g} x the loss's scale {scale:.4g}, "
                   f"the larger of that step's magnitude and the loss {chance:.4g} of a prediction that "
                   f"ignores the inputs)")
        return self._fire(DIVERGING, step, message, loss)

    def _blind_finding(self, step: int, *, at_end: bool) -> RuleFinding | None:
        """NotLearning where the network is input-blind (stabilizer_sentinel.detection.input_blind): a fall to a
        constant prediction's loss is no learning, whatever the loss's chance level. At the end; before it, at a
        window's close once the patience is spent."""
        if not at_end and (self.main_steps < self.patience_steps() or not self._judged() or self._warming_up()):
            return None
        why = None if self.input_blind is None else self.input_blind.blind()
        if why is None or self._last is None:
            return None
        self._blind = True
        start, (last_step, last) = self.learning_start, self._last
        when = "by its end" if at_end else f"in {self.main_steps} steps after warm-up"
        fall = f": {start:.4g} at the start, {last:.4g} over the steps to {last_step}" if start is not None else ""
        return self._fire(NOT_LEARNING, step, f"the run did not learn {when}{fall}; {why}", last)

    def _term_finding(self, step: int) -> RuleFinding | None:
        """NotLearning at the end of a run that learned by its loss, a sum of terms, where the sum's one term of
        known level (stabilizer_sentinel.detection.chance_level, ``TermLevel``; its several multi-class
        cross-entropies, judged together and, where their labels are of several tasks, each alone; or a binary
        cross-entropy alone, whose level is judged here alone: ``chance_level.BINARY``) never got below that
        level: by
        ``min_decrease`` of it (of its height above the term's floor, its soft targets' own entropy:
        ``ChanceLevel.floor``) and ``confidence`` standard errors of its median over the last
        ``patience_windows`` windows of steps, as ``_tail_below_chance`` asks of a loss that is its own (of its
        mean). The fall was the other terms' (a penalty on the weights shrinking them): the network learned
        nothing beyond the labels' prior or the targets' mean. Where the floor is within those standard errors
        of the level, no value of the term tells a network that learned from one that did not: the run is not
        judged (``unjudged``). Only for a run given its patience
        (``patience_steps``, 100 steps at least), as a run is before it is called NotLearning on its way: a
        VAE's reconstruction 32 steps in (the public corpus's, at its default settings) is still above the mean
        image's and falling, and its fall is its own."""
        term = self.term
        given = self.main_steps >= self.patience_steps()
        tails = [] if term is None or term.off or not term.full or not given else term.tails()
        if not tails or self._last is None or self.learning_start is None:
            return None
        passes, median, error, level = tails[0]
        floor = term.floor() or 0.0  # soft targets: no prediction scores below their entropy
        if floor and level - floor <= self.confidence * error:
            self._unjudged = (
                f"its binary cross-entropy's soft targets have an entropy of {floor:.4g}, within {self.confidence:g} "
                f"standard errors of the loss {level:.4g} of a prediction that ignores the inputs: no loss tells a "
                f"network that learned from one that did not, so whether the run learned is not judged")
            return None
        if any(at - below > max(self.min_decrease * (at - floor), self.confidence * spread)
               for _, below, spread, at in tails):  # together, or one of several alone
            return None
        self._term_at_chance = True
        start, (last_step, last) = self.learning_start, self._last
        room = f"its height above the targets' own entropy {floor:.4g}" if floor else "it"
        words = TERM_WORDS.get(term.kind or "", "known")
        several = len(term.levels) > 1
        subject = (f"its {len(term.levels)} {words} terms, weighted as the loss weighs them," if several else
                   "it" if term.alone else f"its {words} term")
        each = ", none alone below its own level" if several else ""
        ended = f"{subject} ended at {median:.4g} (the median of its last {passes} passes{each})"
        why = ("the network learned nothing beyond that prediction" if several and term.alone else
               "it learned the labels' prior and nothing beyond it" if term.alone else
               "the fall was its other terms', and the network learned nothing beyond that prediction")
        message = (
            f"the run did not learn by its end: its loss fell ({start:.4g} at the start, {last:.4g} over the steps "
            f"to {last_step}), but {ended}, not below the loss {level:.4g} of a prediction that ignores the inputs "
            f"(the labels' prior or the targets' mean) by {self.min_decrease * 100:g}% of {room} and "
            f"{self.confidence:g} standard errors: {why}")
        return self._fire(NOT_LEARNING, step, message, last)

    def _judged(self) -> bool:
        """Whether the loss is judged: not once a backward pass was a surrogate's (``unjudged``), read here
        (a synchronisation on an accelerator) at each window's close and at the end."""
        if self._unjudged is None and self.surrogate is not None and self.surrogate.found():
            self._unjudged = surrogate.REASON
        return self._unjudged is None

    def _close_window(self, step: int, mean: float) -> None:
        if self._first is None:
            blocks = [block for block in list(self._targets[0])[-self.window:] if block is not None]
            self._targets = (self._targets[0], sum(blocks[1:], blocks[0]) if blocks else None)
        self._peak = mean if self._peak is None else max(self._peak, mean)
        self._last = (step, mean)
        self._lowest = mean if self._lowest is None else min(self._lowest, mean)
        if self._first is None:
            self._first = self._best = (step, mean)
            self._first_here = True
            thrown = self._thrown()
            if self.motion is not None:
                self.motion.mark()
            self._lineage_here = self._lineage_here or not self._segments
            self._first_spread = statistics.pstdev(self._recent)
            self._start, self._exploded = untrained_level(list(self._recent), self.spreads, self.jump_spreads,
                                                          self.thrown_spreads if thrown else None)
            if self._exploded is not None:  # exploded within the first window: a spike, and no part of the trend
                recent = list(self._recent)
                first_up = next((i for i, loss in enumerate(recent) if loss > self._exploded), 0)
                self._spike = (step - (len(recent) - 1 - first_up), recent[first_up])  # its first step up
                self._spike_rate = list(self._recent_rates)[first_up]
                self._trend = Trend()
        else:
            assert self._best is not None
            if self._learned_at is None and self._has_learned(mean):
                self._learned_at = step
            self._relapsed = [*self._relapsed, (step, mean)] if self._relapsing(mean) else []
            if mean <= self._best[1] - self.plateau_decrease * abs(self._best[1]):
                self._best = (step, mean)
        self._refresh_bound()
        if self.term is not None:
            self.term.close_window()
        if getattr(self.chance, "moved", bool)():  # a squared error's targets moved: another task's
            self._begin_segment(step + 1, "the targets of its squared error moved")

    def _new_makeup(self, step: int) -> None:
        """Start the bound afresh (``_begin_segment``) where this step's backward passes added up terms of a
        makeup the loss had not had (stabilizer_sentinel.detection.loss_makeup): a term switched on, another
        task's loss. The makeups of the first window's steps are the start's own (a loss that alternates
        between two, a GAN's two passes)."""
        taken = self.makeup.take() if self.makeup is not None else set()
        new = taken - self._makeups
        if not new:
            return
        before = self._makeups
        self._makeups = self._makeups | new
        if self._first is not None and before:
            names = " + ".join(sorted(max(new, key=len)))
            self._begin_segment(step, f"the loss is now made of {names}")

    def _begin_segment(self, step: int, why: str) -> None:
        """Judge the loss from ``step`` on as a run of its own: a first window, a bound and a noise of its
        own. Whether the run learned stands (a run that learned one loss and then takes another has learned),
        and so do its phase, the makeups seen and what the listeners read."""
        kept = {key: vars(self)[key] for key in SEGMENT_KEEPS}
        self.__post_init__()
        vars(self).update(kept)
        self._segments = [*self._segments, (step, why)]

    def swept(self, why: str) -> None:
        """A rate range test blew up (told, not acted on: stabilizer_sentinel.detection.sentinel): its steps are the
        script's test of rates, not its training, and what its loss did in them is not the run's. Nothing is judged
        until it ends (``after_sweep``); a run that ends inside it is not judged at all (``unjudged``: ``why``)."""
        self._fired, self._learned_at, self._sweeping = True, None, why

    def after_sweep(self, step: int) -> None:
        """The rate range test ended before ``step`` (the script put its starting weights back, or trains on from
        where the test left them): the run is judged afresh from ``step``, as one that has learned nothing yet."""
        self._begin_segment(step, "a rate range test ended")
        self._fired, self._learned_at = False, None

    @property
    def segments(self) -> list[tuple[int, str]]:
        """(step, why) for each step where the loss was judged afresh from (``_begin_segment``)."""
        return list(self._segments)

    def _relapsing(self, mean: float) -> bool:
        """Whether a window of a run that learned lost it. Where the chance level is known (a cross-entropy, a
        squared error), a window back at that level: the run learned from its inputs (``learned``, and its lowest
        window below the level by more than the noise), and this window lost at least ``1 - RELAPSE`` of how far
        below that level the run had got. No input-blind prediction scores below the level, so a run back there
        knows nothing of its inputs any more, whatever its loss once was.

        Where no level is known (a CTC, a log-likelihood, a loss computed by hand; ``_climbed_back``), a window
        ``relapse_spreads`` scales above where the run started, after this run's windows had got below it."""
        if not self.learned or self._lowest is None:
            return False
        chance = self._chance()
        if chance is not None and self._window_below(self._lowest, chance):
            return chance - mean <= RELAPSE * (chance - self._lowest)
        return self._climbed_back(mean)

    def _climbed_back(self, mean: float) -> bool:
        """Whether ``mean`` is ``relapse_spreads`` scales (the divergence bound's, ``_refresh_bound``: at least the
        start's magnitude and the run's fall) above the bound's base, in a run whose windows since its start (this
        segment's) got below it by ``min_decrease`` of it (``learned`` tested that fall against the noise). Never
        where another optimizer steps (``rivals``): a GAN's discriminator loses ground as its generator learns,
        by design. Stop 84's hunt: a CTC model at 1,000 times its rate fell from 3.7 to about 2, then swung
        between 10 and 38 for 150 steps (greedy accuracy 0.42 against 0.92), below the divergence bound (ten
        times its start), and was called learned."""
        base, reference = self._bound_base, self._reference()
        if base is None or self._scale <= 0 or self._lowest is None:
            return False
        # Below the start by the least fall that counts, not by today's noise: the loss thrown up swings as it climbs.
        if reference - self._lowest <= self._margin(reference):
            return False
        if self.rivals is not None and self.rivals():
            return False
        return mean > base + self.relapse_spreads * self._scale

    def _relapse(self, step: int) -> RuleFinding | None:
        """Diverging, where the windows of the run's patience (``patience_steps``) in a row were back at the
        chance level after the run learned, or far above its start where no level is known (``_relapsing``): a
        rate that knocked a trained network back to a guess, and left it there. A hunt's classifier under ASGD at
        ten times its rate learned to a window mean of 0.54, was thrown to 7.9 at step 45 and was back at chance,
        2.3, from step 55 to its end.

        The span is the patience a run that never learned is given, not fewer windows (stop 63 had six): a
        healthy run can pass through its chance level for tens of steps after a change of its objective the loss
        does not show. A digits classifier trained on FGSM examples (eps 0.25) from step 290 went from 5.5 to
        2.24 in six windows, its level 2.30, and learned on below it (1.68 at its end); six windows called it
        Diverging at step 319 (stop 64's hunt)."""
        if len(self._relapsed) * self.window < self.patience_steps():
            return None
        chance, lowest = self._chance(), self._lowest
        assert lowest is not None
        means = [mean for _, mean in self._relapsed]
        row = (f"{len(means)} windows of {self.window} steps in a row (the run's patience)", f"(means {means[0]:.4g} "
               f"first, {min(means):.4g} to {max(means):.4g}, the last to step {step})")
        if chance is not None and self._window_below(lowest, chance):
            message = (f"the loss went back to the loss {chance:.4g} of a prediction that ignores the inputs after "
                       f"it had learned to a window mean of {lowest:.4g}: {row[0]} lost at least {1 - RELAPSE:.0%} "
                       f"of what it had learned below that level {row[1]}")
        else:
            base = self._bound_base
            assert base is not None
            message = (f"the loss climbed back above {base + self.relapse_spreads * self._scale:.4g} "
                       f"({self._bound_reason(self.relapse_spreads)}) after it had learned to a window mean of "
                       f"{lowest:.4g}: {row[0]} above that {row[1]}")
        return self._fire(DIVERGING, step, message, self._relapsed[-1][1])

    def _start_words(self, first_step: int) -> str:
        start = self.learning_start
        if self._start is not None and self._start != self.start_loss:
            return f"{start:.4g} at its first step"
        return f"mean {start:.4g} over the steps to {first_step}"

    def _spike_words(self) -> str:
        wreck = self._wreck() if self._spike is None else (*self._spike, self._spike_rate)
        if wreck is None:
            return ""
        if self._spike is None:
            return (f" (from {self._first_step:.4g} at its first step to a window mean of {self._peak:.4g}; "
                    f"above twice its first step from step {wreck[0]})")
        return f" (it spiked to {wreck[1]:.4g} at step {wreck[0]})"

    @property
    def _bound_base(self) -> float | None:
        """What the divergence bound is measured from: the configured baseline, else the first window's mean."""
        return self.baseline if self.baseline is not None else self.start_loss

    def _refresh_bound(self) -> None:
        base = self._bound_base
        if base is None:
            self._bound, self._scale = None, 0.0
            return
        if self.scale is not None:
            self._scale = self.scale
        else:
            fallen = base - self._lowest if self._lowest is not None else 0.0
            self._scale = max(abs(base), fallen, self.noise_spreads * self._noise_at(base))
        self._bound = base + self.spreads * self._scale if self._scale > 0 else None
        # Once a window, as the bound: the level is read from counts on the device (a synchronisation).
        self._level_read = self._ceiling()

    def _noise_at(self, base: float) -> float:
        """The per-step noise the divergence bound widens by, read at the level of a positive start.

        A loss that has risen above its start spreads more as it rises (its steps scatter in proportion
        to it): read there, the noise would carry the bound up with the loss it bounds, and a run whose
        loss climbed tens of times its start would never be above it for long. So a noise read while the
        loss was above the start (``NoiseEstimate.level``) counts at the start's level: times the start
        over that level. Never more than the noise read."""
        noise = self.noise or 0.0
        level = self._noise.level if self._noise.sigma is not None else None
        if base > 0 and level is not None and level > base:
            return noise * base / level
        return noise

    def _bound_reason(self, spreads: float | None = None) -> str:
        """How a bound was reached: the start + ``spreads`` (the divergence bound's by default) x the scale."""
        base = self._bound_base
        where = "the configured baseline" if self.baseline is not None else "the mean of the first window"
        return f"{where} {base:.4g} + {spreads or self.spreads:g} x the loss's scale {self._scale:.4g}"

    def _judge(self, step: int, *, at_end: bool) -> RuleFinding | None:
        if self._first is None or self._last is None or self._best is None or not self._judged():
            return None
        first = self.learning_start
        assert first is not None
        last_step, last = self._last
        patience = self.patience_steps()
        if self._learned_at is None and (at_end or self.main_steps >= patience):
            if not at_end and self._undecided(first, last):
                return None
            # Where it ended: the last window, or the median of the last steps when that is lower (a spike).
            # Above the start by more than the noise, or still above the level of an explosion at the start
            # (whose noise is the explosion's own), it diverged.
            ended = min(last, self._centre if self._centre is not None else last)
            exploded = self._exploded is not None and ended > self._exploded
            diverged = self._diverged_words(first, ended, exploded, at_end=at_end)
            if diverged is not None:
                return self._fire(DIVERGING, step, diverged, last)
            return self._never_learned(step, at_end=at_end)
        best_step, best = self._best
        if (self.plateau_patience is not None and self._learned_at is not None and not at_end
                and last_step - best_step >= self.plateau_patience):
            message = (
                f"the loss plateaued: best mean {best:.4g} at step {best_step}, no improvement of "
                f"{self.plateau_decrease * 100:g}% in the {last_step - best_step} steps since (now {last:.4g})"
            )
            return self._fire(PLATEAU, step, message, last)
        return None

    def _never_learned(self, step: int, *, at_end: bool) -> RuleFinding | None:
        """NotLearning for a run that neither learned nor diverged by its patience (``_judge``); on its way, not
        while its weights move (``_moving``: a search, which its end judges)."""
        if not at_end and self._moving() and not (self.killed is not None and self.killed()):
            return None
        if not at_end and self._warming_up():
            return None
        assert self._first is not None and self._last is not None and self.learning_start is not None
        (first_step, _), (last_step, last) = self._first, self._last
        when = ("by the end of the run" if at_end
                else f"in {self.main_steps} steps after warm-up (patience {self.patience_steps()})")
        message = (
            f"the loss never learned {when}: {self._start_words(first_step)}, "
            f"{last:.4g} over the steps to {last_step} ({last - self.learning_start:+.4g}; a fall of at least "
            f"{self.min_decrease * 100:g}% of the start{self._floor_words()} and {self.confidence:g} "
            f"standard errors of the noise {self.noise or 0.0:.3g} per step was required){self._chance_words()}"
            f"{self._moving_words() if at_end else ''}"
        )
        return self._fire(NOT_LEARNING, step, message, last)

    def _warming_up(self) -> bool:
        """Whether the script's scheduler holds the rate at a constant warm-up's fraction still (``held_low``): its
        steps are not yet the main phase; once the rate jumps, the rise reclassifies them (``PhaseTracker``) and
        the patience counts from there (stop 87's verdict hunt: a run under ``ConstantLR(factor=0.01,
        total_iters=150)`` stopped as not learning at step 99, unwatched 0.954 accurate)."""
        return self.held_low is not None and self.held_low()

    def _thrown(self) -> bool:
        """Whether the network's sampled weights moved by more than ``weight_motion.THROWN`` of their size over the
        first window, read as it closes (one synchronisation on an accelerator, once): a rate that did that threw
        the network from its start, and its losses there are no start (``untrained_level``)."""
        moved = None if self.motion is None else self.motion.moved()
        return moved is not None and moved > weight_motion.THROWN

    def _moving(self) -> bool:
        """Whether the network's sampled weights moved by more than ``weight_motion.MOVING`` of their size since
        the first window (one synchronisation on an accelerator): a run whose loss did not fall in its patience
        while they moved is searching (an LSTM that must carry a token across a dozen steps sits at its chance
        level for 110 steps, then learns), and is left to its end; one whose weights stood still is stalled."""
        moved = None if self.motion is None else self.motion.moved()
        if moved is None or moved <= weight_motion.MOVING:
            return False
        self._left_moving = moved
        return True

    def _moving_words(self) -> str:
        moved = self._left_moving
        if moved is None:
            return ""
        return (f"; it was left to run past its patience, its weights having moved {moved:.2g} of their size "
                f"(a search, not a stall: stabilizer_sentinel.detection.weight_motion)")

    def _diverged_words(self, first: float, ended: float, exploded: bool, *, at_end: bool) -> str | None:
        """Why a run that never learned diverged (a rate too high, not too low), or None when it did not."""
        assert self._first is not None and self._last is not None
        first_step, (last_step, last) = self._first[0], self._last
        if (at_end and (ended - first > self._significant(first) or exploded)) or self._rose(first):
            ended_words = "the run ended with" if at_end else "the run never learned, with"
            return (f"{ended_words} its loss above where it started: mean {last:.4g} over the steps to "
                    f"{last_step}, {self._start_words(first_step)}{self._spike_words()}")
        if self._spike is not None:  # a spike above the bound it never learned past: a rate too high
            return (f"the loss never learned since it spiked{self._spike_words()}: "
                    f"{self._start_words(first_step)}, {last:.4g} over the steps to {last_step}")
        if self._rose_and_fell():
            return (f"the loss never learned since it rose{self._spike_words()}: "
                    f"{self._start_words(first_step)}, {last:.4g} over the steps to {last_step}")
        return None

    def _wreck(self) -> tuple[int, float, float | None] | None:
        """(step, loss, rate) of a spike or a rise the run never learned past; None without one."""
        if self.learned:
            return None
        if self._spike is not None:
            return self._spike[0], self._spike[1], self._spike_rate
        return self._first_up if self._rose_and_fell() else None

    def _rose_and_fell(self) -> bool:
        """Whether this process's loss rose from its first step and fell back: its highest window mean
        above both its first step and where it is now (the last window, or the median of the last
        steps when lower) by more than the loss's scale (the larger of the first step's magnitude,
        the chance level and ``noise_spreads`` per-step noise deviations). A rate too low leaves the
        network about where it started, batch noise aside; one too high throws the loss up, and a
        network it saturated falls back to about chance: a run that never learned after that had a
        rate too high, and raising it would be the wrong remedy."""
        if self._peak is None or self._first_step is None or self._first_up is None or self._last is None:
            return False
        now = min(self._last[1], self._centre if self._centre is not None else self._last[1])
        scale = max(abs(self._first_step), self._chance() or 0.0, self.noise_spreads * (self.noise or 0.0))
        return self._peak - max(self._first_step, now) > scale

    def _rose(self, first: float) -> bool:
        """Whether a run that never learned ended above its start by more than the noise of each end.

        The mean of the last steps (``CENTRE_STEPS``) against the first window's, each with its own
        spread: a loss whose noise grows with its level (a fine-tune thrown to tens) has a per-step
        noise, measured over the whole run, that would hide a rise from its start, but its start was
        quiet. The difference must exceed ``confidence`` standard errors and ``min_decrease``."""
        if self._first_spread is None or len(self._around) < self.window:
            return False
        tail = list(self._around)
        error = math.sqrt(self._first_spread ** 2 / self.window + statistics.pvariance(tail) / len(tail))
        return statistics.fmean(tail) - first > max(self.min_decrease * abs(first), self.confidence * error)

    def _fire(self, rule: str, step: int, message: str, value: float) -> RuleFinding:
        self._fired = True
        return RuleFinding(rule, step, "losses/loss", value, message)
