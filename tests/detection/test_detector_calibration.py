"""Calibration of the sentinel's own checks on a corpus of synthetic loss and learning-rate trajectories.

Each kind of run (healthy schedules, fine-tunes, negative log-likelihoods, noisy small batches,
plateaus, runs that never learn, runs that diverge early, late or slowly) is generated for a few
seeds from a small model of training: the loss falls with the learning rate spent so far, plus
the noise of a mini-batch. The learning check (``stabilizer_sentinel.detection.learning_check``) reads each run as
the sentinel does, one step at a time with the learning rate and no phase labels, and then closes
it as a completed run. Its finding is compared with the kind's: none, ``NotLearning`` or
``Diverging`` (a diverging run must be stopped before its loss is non-finite; otherwise the finite
check's ``ExplodingTensor`` would be the finding). Pure numbers: the corpus takes a second or two.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stabilizer_sentinel.detection.learning_check import DIVERGING, NOT_LEARNING, LearningCheck
from tests.detection import trajectories as t

SEEDS = range(10)
NONE = "none"
EXPLODED = "ExplodingTensor"  # the finite check's finding: the loss went non-finite before any other


CORPUS: dict[str, tuple[Callable[[int], t.Run], str]] = {
    "one-cycle, 20% warm-up": (t.make_one_cycle, NONE),
    "linear warm-up + cosine": (t.make_warmup_cosine, NONE),
    "constant low warm-up rate (labelled), then the main rate": (t.make_step_warmup, NONE),
    "healthy exponential decay": (t.make_exponential, NONE),
    "fine-tune from a low loss, spiky batches": (t.make_fine_tune, NONE),
    "log-likelihood crossing zero": (t.make_nll_crossing_zero, NONE),
    "noisy tiny batches": (t.make_noisy_tiny_batches, NONE),
    "noisy batches with outliers": (t.make_noisy_spikes, NONE),
    "slow plateau": (t.make_slow_plateau, NONE),
    "rate unknown, healthy": (t.make_unknown_rate, NONE),
    "a spike at the start, then learns below its start": (t.make_spike_then_learns, NONE),
    # A rate too high wrecked it: never learned past the spike, so Diverging (NotLearning would raise the rate).
    "a spike at the start, then stuck at chance": (t.make_spike_then_chance, DIVERGING),
    "a spike at the start, then settling above its start": (t.make_spike_then_above_start, DIVERGING),
    "learns while its noise is measured, then climbs above its start": (t.make_learns_then_unstable, DIVERGING),
    "flat, never learning": (t.make_flat, NOT_LEARNING),
    "flat and noisy, never learning": (t.make_flat_noisy, NOT_LEARNING),
    "flat negative log-likelihood": (t.make_flat_negative, NOT_LEARNING),
    "flat near zero": (t.make_flat_near_zero, NOT_LEARNING),
    "negative log-likelihood, then diverges": (t.make_nll_then_diverges, DIVERGING),
    "late divergence": (t.make_late_divergence, DIVERGING),
    "early explosion": (t.make_early_explosion, DIVERGING),
    "slowly rising": (t.make_slowly_rising, DIVERGING),
}


def verdict(run: t.Run, check: LearningCheck | None = None) -> tuple[str, int | None]:
    """The finding the sentinel's checks give a run (as the sentinel feeds them), and its step."""
    check = check or LearningCheck()
    phases = run.phases or [None] * len(run.losses)
    for step, (loss, rate, phase) in enumerate(zip(run.losses, run.rates, phases, strict=True)):
        if not math.isfinite(loss):
            return EXPLODED, step
        finding = check.observe(step, loss, phase, rate)
        if finding is not None:
            return finding.rule, step
    final = check.at_end(len(run.losses) - 1)
    return (final.rule, final.step) if final is not None else (NONE, None)


def test_the_corpus_is_judged_as_labelled_with_no_false_positive_or_negative():
    # A false positive: a finding the run should not get (a healthy run stopped, or the wrong finding).
    # A false negative: the finding the run should get is missing (a wrong finding is both).
    false_positives, false_negatives = [], []
    for name, (make, expected) in CORPUS.items():
        for seed in SEEDS:
            got, step = verdict(make(seed))
            if got == expected:
                continue
            line = f"{name} (seed {seed}): expected {expected}, got {got}" + ("" if step is None else f" at {step}")
            if got not in (NONE, EXPLODED):
                false_positives.append(line)
            if expected != NONE:
                false_negatives.append(line)
    report = "\n".join(["false positives:", *false_positives, "false negatives:", *false_negatives])
    assert not false_positives and not false_negatives, report
