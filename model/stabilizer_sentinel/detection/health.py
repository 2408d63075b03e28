"""The checks behind the verdict, on whatever rule list the job was given.

An attempt is healthy only if its loss and gradients stayed finite the whole run and it learned.
The sentinel therefore runs three checks always, configured rules or not:

* **finite**: the loss and the total gradient norm of every step (Debugger's ``ExplodingTensor``
  semantics; ``default_finite_rule`` is the rule the sentinel uses when the list has none, so the
  finding is named ``ExplodingTensor`` either way);
* **learning** and **diverging** (``LearningCheck``, in ``stabilizer_sentinel.detection.learning_check``; checks
  of this project's own, not Debugger's rules): the loss must fall below where the run started
  (finding ``NotLearning`` when it has not within the main phase's patience, or by the end of a
  completed run), and must not rise far above it (finding ``Diverging``: a loss well above where
  the run started has left training behind, whether or not it ever overflows; stopping there
  saves the steps to the overflow, and the remedies answer it as they answer an explosion).
  Every threshold comes from the run's own statistics (the noise of its loss, its warm-up, its
  length) and can be overridden in the job's rule list; docs/rules.md lists them with reasons.
  ``LearningCheck.arbitrate`` makes sure ``VanishingGradient`` is never the finding while the
  loss climbs.

  Why checks of our own: Debugger's ``LossNotDecreasing`` compares consecutive 10-step windows
  against a 0.1 % decrease, which a healthy run with noisy mini-batches fails now and then; it
  stays available as a rule, for those who want it (the learning check's plateau is that rule's
  name, off by default: a loss that stops improving after the run learned is usually a run that
  converged).

Two more readings of the same numbers serve the remediation policy (``run_up``): where the run-up
to an explosion began (the checkpoints before it are the healthy ones to resume from) and the
highest learning rate the run took healthy steps at (the stable end of a bisection).

This module must not touch the model, the optimizer or files: it watches numbers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from stabilizer_sentinel.capture.trial import Trial
from stabilizer_sentinel.detection.learning_check import DIVERGING, NOT_LEARNING, PLATEAU, LearningCheck
from stabilizer_sentinel.rules import ExplodingTensor

__all__ = ["DIVERGING", "NOT_LEARNING", "PLATEAU", "LearningCheck", "RunUp", "default_finite_rule", "run_up"]


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
    (the first step at a new learning rate, the state before the gradient norm started to grow, the
    last state whose loss was below ``RISE`` times the first window's, or the state before a spike
    the run never learned past). It can be earlier than
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
    scale: float | None = None,
    wrecked_at: int | None = None,
) -> RunUp:
    """Where the run-up to an explosion at ``step`` began, from the per-step gradient norms, rates and losses.

    Three signs are read: a change of the learning rate shortly before (warm-up ending at a rate
    the network cannot take); a growing gradient norm (each step of the run-up at least ``GROWTH``
    times the median of the ``BASELINE`` steps before it); and a loss that has risen above
    ``start_loss`` (the mean of the lineage's first window) by ``RISE - 1`` times ``scale`` (the
    learning check's scale of the loss; the start's magnitude when not given, so ``RISE`` times a
    positive start), which catches a loss that jumps and stays up while its gradients grow slowly.
    A fourth is the learning check's: ``wrecked_at``, a spike above its divergence bound that the
    run never learned past (it returned to chance, say, where no loss is above where it started),
    whose state before it is the last healthy one. The onset is the earliest.
    """
    onset = step - 1  # without evidence: the state before the step that failed
    if wrecked_at is not None:
        onset = min(onset, wrecked_at - 1)
    rate_at = {s: r for s, r in rates if r is not None and s < step}
    changed = _rate_changed(rate_at, rates, step)
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
    size = scale if scale is not None and scale > 0 else (abs(start_loss) if start_loss is not None else 0.0)
    if start_loss is not None and size > 0:
        risen = start_loss + (RISE - 1.0) * size
        before = [(s, v) for s, v in losses if s < step]
        index = len(before)
        while index > 0 and not before[index - 1][1] <= risen:  # a non-finite loss is risen too
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


# A rate range test (an LR finder: Lightning's ``Tuner.lr_find``, fastai's ``lr_find``, torch-lr-finder) raises the
# rate by one ratio at every step until the loss blows up, by design (``rate_sweep``): at least this ratio a step
# (an order of magnitude in 116 steps; the finders' defaults sweep several in 100), the same within this share of
# its logarithm, over this many steps up to the finding. A linear warm-up rises by 2 % a step only in its first 50
# steps, where its ratio (1 + 1/t) changes by a fifth over 20 steps; a schedule that peaks or decays is no sweep.
SWEEP_RATIO = 1.02
SWEEP_SPREAD = 0.02
SWEEP_STEPS = 20


def rate_sweep(rates: Sequence[tuple[int, float | None]], step: int) -> float | None:
    """The ratio by which the script raised its rate at each of the ``SWEEP_STEPS`` steps up to ``step`` (the
    rates each step ran at), where it raised it by one ratio (a rate range test: ``SWEEP_RATIO``), else None."""
    known = [(s, r) for s, r in rates if s <= step and r is not None and r > 0 and math.isfinite(r)]
    last = known[-(SWEEP_STEPS + 1):]
    if len(last) < SWEEP_STEPS + 1 or last[-1][0] - last[0][0] != SWEEP_STEPS:
        return None
    logs = [math.log(b / a) for (_, a), (_, b) in itertools.pairwise(last)]
    mean = sum(logs) / len(logs)
    if mean < math.log(SWEEP_RATIO) or any(abs(value - mean) > SWEEP_SPREAD * mean for value in logs):
        return None
    return math.exp(mean)


def sweep_goes_on(ratio: float, rates: Sequence[tuple[int, float | None]]) -> bool:
    """Whether the last step of ``rates`` raised the rate by the sweep's ``ratio`` again (``rate_sweep``): a rate
    range test goes on past its blow-up until the script ends it (Lightning's finder to its ``num_training``)."""
    before, now = (rates[-2][1], rates[-1][1]) if len(rates) >= 2 else (None, None)
    if before is None or now is None or not before > 0 or not now > 0:
        return False
    return abs(math.log(now / before) - math.log(ratio)) <= SWEEP_SPREAD * math.log(ratio)


def _rate_changed(rate_at: dict[int, float], rates: Sequence[tuple[int, float | None]], step: int) -> int | None:
    """The first step at the rate of ``step``, when the rate changed before it; else None."""
    if not rate_at or step not in {s for s, _ in rates}:
        return None
    current = next((r for s, r in rates if s == step), None)
    for s in sorted(rate_at, reverse=True):
        if rate_at[s] != current:
            return s + 1
    return None
