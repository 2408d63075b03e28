"""The checks behind the verdict, on whatever rule list the job was given.

An attempt is healthy only if its loss and gradients stayed finite the whole run and it learned.
The sentinel therefore runs three checks always, configured rules or not:

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

* **diverging** (finding ``Diverging``, also a check of our own): a step's loss at least
  ``diverged`` (10) times the mean of the first window (the lineage's, for a resumed run). A loss
  an order of magnitude above where the run started has left training behind, whether or not it
  ever overflows: a deep network can saturate at a finite 1e9 and run to its end. Stopping there
  saves the steps to the overflow, and the remedies answer it as they answer an explosion.

Two more readings of the same numbers serve the remediation policy (``run_up``): where the run-up
to an explosion began (the checkpoints before it are the healthy ones to resume from) and the
highest learning rate the run took healthy steps at (the stable end of a bisection).

This module must not touch the model, the optimizer or files: it watches numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rule_engine.rules import ExplodingTensor, RuleFinding
from rule_engine.trial import Trial

NOT_LEARNING = "NotLearning"
DIVERGING = "Diverging"
PLATEAU = "LossNotDecreasing"


def default_finite_rule(trial: Trial) -> ExplodingTensor:
    """The finite check's rule when the rule list has no ExplodingTensor of its own."""
    return ExplodingTensor(trial)


# run_up(): a step belongs to the run-up when its gradient norm is this many times the median of
# the BASELINE steps before it, or when its loss is RISE times the mean of the lineage's first
# window (a state whose loss is twice where training started has lost what it learned, and more);
# an explosion within RATE_CHANGE_REACH steps of a change of the learning rate is put down to that
# change; a rate is stable after STABLE_STEPS healthy steps.
GROWTH = 2.0
BASELINE = 5
RISE = 2.0
RATE_CHANGE_REACH = 20
STABLE_STEPS = 5


@dataclass(frozen=True)
class RunUp:
    """What preceded an explosion at ``step``, for the policy.

    ``onset_step``: checkpoints whose next step is at most this hold state from before the run-up
    (the first step at a new learning rate, the state before the gradient norm started to grow, or
    the last state whose loss was below ``RISE`` times the first window's). It can be earlier than
    the run's first step: a resumed run whose first states were already on the way up.
    ``stable_learning_rate``: the highest rate the run took at least ``STABLE_STEPS`` finite steps
    at before the onset; None when it took none.
    """

    onset_step: int
    stable_learning_rate: float | None


def run_up(
    norms: Sequence[tuple[int, float]],
    rates: Sequence[tuple[int, float | None]],
    step: int,
    losses: Sequence[tuple[int, float]] = (),
    start_loss: float | None = None,
) -> RunUp:
    """Where the run-up to an explosion at ``step`` began, from the per-step gradient norms, rates and losses.

    Three signs are read: a change of the learning rate shortly before (warm-up ending at a rate
    the network cannot take); a growing gradient norm (each step of the run-up at least ``GROWTH``
    times the median of the ``BASELINE`` steps before it); and a loss that has risen above
    ``RISE`` times ``start_loss`` (the mean of the lineage's first window), which catches a loss
    that jumps and stays up while its gradients grow slowly. The onset is the earliest.
    """
    onset = step - 1  # without evidence: the state before the step that failed
    rate_at = {s: r for s, r in rates if r is not None and s < step}
    steps = sorted(rate_at)
    if steps and step in {s for s, _ in rates}:
        current = next((r for s, r in rates if s == step), None)
        changed = None
        for s in reversed(steps):
            if rate_at[s] != current:
                changed = s + 1  # the first step at the current rate
                break
        if changed is not None and step - changed <= RATE_CHANGE_REACH:
            onset = min(onset, changed)
    finite = [(s, n) for s, n in norms if s < step and math.isfinite(n)]
    index = len(finite)
    while index > BASELINE:
        s, n = finite[index - 1]
        baseline = statistics.median(v for _, v in finite[index - 1 - BASELINE : index - 1])
        if n <= GROWTH * baseline:
            break
        index -= 1
    if index < len(finite):  # finite[index] is the first step of the growth: the state before it
        onset = min(onset, finite[index][0])  # has taken no abnormal step yet
    if start_loss is not None and start_loss > 0:
        before = [(s, v) for s, v in losses if s < step]
        index = len(before)
        while index > 0 and not before[index - 1][1] <= RISE * start_loss:  # a non-finite loss is risen too
            index -= 1
        if index < len(before):  # the state that gave before[index]'s loss was already up: the one before it
            onset = min(onset, before[index][0] - 1)
    healthy: dict[float, int] = {}
    for s, _ in finite:
        rate = rate_at.get(s)
        if s < onset and rate is not None:
            healthy[rate] = healthy.get(rate, 0) + 1
    stable = [rate for rate, count in healthy.items() if count >= STABLE_STEPS]
    return RunUp(onset, max(stable) if stable else None)


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
    # A step's loss this many times the first window's mean has diverged (finding Diverging).
    diverged: float = 10.0

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

    @property
    def start_loss(self) -> float | None:
        """The mean loss of the lineage's first window: where training started; None before it closes."""
        return None if self._first is None else self._first[1]

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to be judged against the start of its lineage, not its own first steps."""
        return {"first": self._first, "main_steps": self._main_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Judge this run against its lineage's first window. Whether it learned is not carried over:
        a run resumed from a state already on its way to diverging must show, in its own windows,
        a loss below where the lineage started."""
        first = state.get("first")
        self._first = self._best = None if first is None else (int(first[0]), float(first[1]))
        self._main_steps = int(state.get("main_steps", 0))

    def observe(self, step: int, loss: float, phase: str | None) -> RuleFinding | None:
        """Record one training step's loss; a finding when the run is found not to be learning."""
        if self._fired:
            return None
        if phase != "warmup":
            self._main_steps += 1
        if not math.isfinite(loss):
            return None  # the finite check's business
        start = self.start_loss
        if start is not None and start > 0 and loss >= self.diverged * start:
            message = (f"the loss {loss:.4g} is {loss / start:.3g}x the mean of the first window ({start:.4g}): "
                       f"diverging (at least {self.diverged:g}x is)")
            return self._fire(DIVERGING, step, message, loss)
        self._sum += loss
        self._count += 1
        if self._count < self.window:
            return None
        mean = self._sum / self._count
        self._sum, self._count = 0.0, 0
        self._close_window(step, mean)
        return self._judge(step, at_end=False)

    def at_end(self, step: int) -> RuleFinding | None:
        """The verdict on a run that completed: it must have learned (needs two windows).

        For a resumed run the first window is its lineage's (``load_state_dict``), so a short
        relaunch is judged too, on windows of its own.
        """
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
