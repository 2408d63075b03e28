"""The checks behind the verdict, on whatever rule list the job was given.

An attempt is healthy only if its loss and gradients stayed finite the whole run and it learned.
The sentinel therefore runs two checks always, configured rules or not:

* **finite**: the loss and the total gradient norm of every step (Debugger's ``ExplodingTensor``
  semantics; ``default_finite_rule`` is the rule the sentinel uses when the list has none, so the
  finding is named ``ExplodingTensor`` either way);
* **learning** (``LearningCheck``, a check of this project's own, not one of Debugger's rules):
  the training loss, averaged over windows of ``window`` steps, must fall. Two ways to fail it:

  - *never learned* (finding ``NotLearning``): no window mean has fallen ``min_decrease`` (5 %)
    below the first window's mean within ``patience`` steps of the main phase (warm-up steps do
    not count: a deliberately gentle warm-up may learn slowly), or by the end of a completed run.
    A loss that is rising instead is left to the finite check while the run goes on: a diverging
    run is an explosion in the making, and the explosion is what the remedies answer;
  - *plateaued* (finding ``LossNotDecreasing``, Debugger's name for a stalled loss), only when
    ``plateau_patience`` is set: after it learned, no window mean improved on the best one before
    it by ``plateau_decrease`` (1 %) for ``plateau_patience`` steps. Off in the sentinel's default
    check: a loss that stops improving after the run learned is usually a run that converged
    (a noisy small regression flattens within a hundred steps), and stopping it is a choice the
    job makes by configuring Debugger's ``LossNotDecreasing`` rule, not a verdict of failure.

  Why a check of our own: Debugger's ``LossNotDecreasing`` compares consecutive 10-step windows
  against a 0.1 % decrease, which a healthy run with noisy mini-batches fails now and then; it
  stays available as a rule, for those who want it. The learning check compares against the
  start (never learned) or against the best so far (plateau), with thresholds far above the
  noise of a window mean of mini-batch losses, so a run that learns is never called stalled.

This module must not touch the model, the optimizer or files: it watches numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rule_engine.rules import ExplodingTensor, RuleFinding
from rule_engine.trial import Trial

NOT_LEARNING = "NotLearning"
PLATEAU = "LossNotDecreasing"


def default_finite_rule(trial: Trial) -> ExplodingTensor:
    """The finite check's rule when the rule list has no ExplodingTensor of its own."""
    return ExplodingTensor(trial)


@dataclass
class LearningCheck:
    window: int = 5  # steps per window mean: one batch is too noisy, a whole epoch too slow
    min_decrease: float = 0.05  # fraction below the first window that counts as having learned
    patience: int = 30  # main-phase steps a run may take to learn before it is stopped
    # A window mean this fraction above the first is a loss on its way up (diverging), far beyond
    # the noise of a flat run's window means; the finite check is left to stop it.
    diverging_increase: float = 0.5
    plateau_decrease: float = 0.01  # fraction below the best window that counts as progress
    # Steps without progress after learning that make a plateau; None (the sentinel's default) turns
    # the plateau check off: after learning, a flat loss is most often convergence.
    plateau_patience: int | None = None

    def __post_init__(self) -> None:
        self._sum = 0.0
        self._count = 0
        self._first: tuple[int, float] | None = None  # (last step of the first window, its mean)
        self._best: tuple[int, float] | None = None  # (step, mean) of the best window so far
        self._last: tuple[int, float] | None = None
        self._learned_at: int | None = None
        self._main_steps = 0
        self._fired = False

    @property
    def learned(self) -> bool:
        return self._learned_at is not None

    def observe(self, step: int, loss: float, phase: str | None) -> RuleFinding | None:
        """Record one training step's loss; a finding when the run is found not to be learning."""
        if self._fired:
            return None
        if phase != "warmup":
            self._main_steps += 1
        if not math.isfinite(loss):
            return None  # the finite check's business
        self._sum += loss
        self._count += 1
        if self._count < self.window:
            return None
        mean = self._sum / self._count
        self._sum, self._count = 0.0, 0
        self._close_window(step, mean)
        return self._judge(step, at_end=False)

    def at_end(self, step: int) -> RuleFinding | None:
        """The verdict on a run that completed: it must have learned (needs two windows)."""
        if self._fired or self._first is None or self._last is None or self._last[0] == self._first[0]:
            return None
        return self._judge(step, at_end=True)

    def _close_window(self, step: int, mean: float) -> None:
        self._last = (step, mean)
        if self._first is None:
            self._first = self._best = (step, mean)
            return
        assert self._best is not None
        if self._learned_at is None and mean <= self._first[1] * (1 - self.min_decrease):
            self._learned_at = step
        if mean <= self._best[1] * (1 - self.plateau_decrease):
            self._best = (step, mean)

    def _judge(self, step: int, *, at_end: bool) -> RuleFinding | None:
        if self._first is None or self._last is None or self._best is None:
            return None
        first_step, first = self._first
        last_step, last = self._last
        if self._learned_at is None and (at_end or self._main_steps >= self.patience):
            change = (last - first) / abs(first) * 100 if first else 0.0
            if not at_end and last > first * (1 + self.diverging_increase):
                # Rising, not flat: a run that is diverging. The finite check stops it when it
                # overflows, and the explosion is what the remedies answer (a lower rate); calling
                # it "never learned" first would end it with no remedy. Judged at the end if it
                # never overflows.
                return None
            when = "by the end of the run" if at_end else f"in {self._main_steps} steps after warm-up"
            message = (
                f"the loss never learned {when}: mean {first:.4g} over the steps to {first_step}, "
                f"{last:.4g} over the steps to {last_step} ({change:+.3g}%, a decrease of at least "
                f"{self.min_decrease * 100:g}% was required)"
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
