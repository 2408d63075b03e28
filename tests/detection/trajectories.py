"""Synthetic loss and learning-rate trajectories of many kinds of run, for the sentinel's checks.

A small model of training: the loss falls from where it starts towards a floor as the learning
rate spent so far grows, plus the noise of a mini-batch (log-normal for a positive loss such as
cross-entropy, normal for a log-likelihood), now and then a batch far worse than the rest, or a
divergence that multiplies the loss each step until it overflows. Each ``make_*`` takes a seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    losses: list[float]
    rates: list[float | None]
    phases: list[str | None] | None = None  # what the script says, when it says


def one_cycle(steps: int, peak: float, warmup: float = 0.2) -> list[float]:
    """PyTorch's OneCycleLR with cosine annealing: peak/25 up to peak over `warmup`, down to peak/1e4."""
    up = int(steps * warmup)
    rates = []
    for step in range(steps):
        if step < up:
            start, end, fraction = peak / 25, peak, step / up
        else:
            start, end, fraction = peak, peak / 1e4, (step - up) / max(steps - up - 1, 1)
        rates.append(end + (start - end) * (1 + math.cos(math.pi * fraction)) / 2)
    return rates


def warmup_cosine(steps: int, peak: float, warmup: int) -> list[float]:
    return [peak * (step + 1) / warmup if step < warmup
            else peak * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup))) / 2 for step in range(steps)]


def learning(rates: list[float | None], start: float, floor: float, tau: float) -> list[float]:
    """The noiseless loss: from `start` towards `floor` as the learning rate spent grows."""
    spent, out = 0.0, []
    for rate in rates:
        out.append(floor + (start - floor) * math.exp(-spent / tau))
        spent += rate or 0.0
    return out


def multiplicative(losses: list[float], spread: float, seed: int) -> list[float]:
    """Mini-batch noise of a positive loss (cross-entropy): log-normal, mean-preserving."""
    rng = random.Random(seed)
    return [loss * math.exp(rng.gauss(0, spread) - spread**2 / 2) for loss in losses]


def additive(losses: list[float], spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [loss + rng.gauss(0, spread) for loss in losses]


def spiky(losses: list[float], every: float, height: float, seed: int) -> list[float]:
    """A batch now and then far worse than the rest (a hard example in a tiny batch)."""
    rng = random.Random(seed + 1000)
    return [loss * height if rng.random() < 1 / every else loss for loss in losses]


def grow_from(losses: list[float], step: int, factor: float) -> list[float]:
    """From `step` on, the loss multiplies by `factor` a step until it overflows."""
    out = losses[:step]
    value = losses[step]
    for _ in losses[step:]:
        value = value * factor if math.isfinite(value * factor) and value * factor < 1e38 else math.inf
        out.append(value)
    return out


def make_one_cycle(seed: int) -> Run:
    # The rate climbs from 4e-3 to 0.1 over the first 20% of 600 steps: in the first 30 steps the
    # loss falls by about 3 %, then fast at the peak.
    rates = one_cycle(600, 0.1)
    return Run(multiplicative(learning(rates, 2.3, 0.3, 6.0), 0.02, seed), rates)


def make_warmup_cosine(seed: int) -> Run:
    rates = warmup_cosine(800, 0.05, 120)
    return Run(multiplicative(learning(rates, 2.3, 0.2, 2.0), 0.03, seed), rates)


def make_step_warmup(seed: int) -> Run:
    # A constant warm-up rate 100 times below the main one for 80 steps, then the main rate. Nothing in
    # the rate says a jump is coming, so the script says which steps are warm-up (model/train.py does).
    rates = [1e-4] * 80 + [1e-2] * 320
    phases = ["warmup"] * 80 + ["main"] * 320
    return Run(multiplicative(learning(rates, 2.3, 0.2, 0.5), 0.02, seed), rates, phases)


def make_exponential(seed: int) -> Run:
    rates = [0.1] * 400
    return Run(multiplicative(learning(rates, 2.3, 0.1, 4.0), 0.05, seed), rates)


def make_fine_tune(seed: int) -> Run:
    # From a trained state: 0.03 easing to 0.02, with a batch ten to forty times the mean now and then.
    rates = [1e-3] * 400
    losses = multiplicative(learning(rates, 0.03, 0.02, 0.1), 0.3, seed)
    return Run(spiky(losses, 25, 15.0, seed), rates)


def make_nll_crossing_zero(seed: int) -> Run:
    rates = [0.01] * 500
    return Run(additive(learning(rates, 2.0, -1.5, 1.0), 0.15, seed), rates)


def make_nll_then_diverges(seed: int) -> Run:
    # A flow already below zero learns from -0.1 to -0.24, then its loss jumps to +11.7 and climbs.
    rates = [0.01] * 300
    losses = additive(learning(rates, -0.1, -0.25, 0.5), 0.02, seed)
    return Run(losses[:200] + [11.7 + 0.5 * k for k in range(100)], rates)


def _spike_at_the_start(seed: int, start: float, height: float, steps: int) -> list[float]:
    """The untrained step at `start`, then `steps` steps around `height` times it: an update far too large."""
    rng = random.Random(seed + 2000)
    return [start] + [start * height * math.exp(rng.gauss(0, 0.3)) for _ in range(steps)]


def make_spike_then_chance(seed: int) -> Run:
    # A rate far too high: from chance (2.3) to thousands within the first window, back to chance, stuck.
    rates = [0.3] * 200
    return Run(_spike_at_the_start(seed, 2.3, 2000.0, 14) + multiplicative([2.33] * 185, 0.02, seed), rates)


def make_short_spike_then_chance(seed: int) -> Run:
    # The same rate, its spike within the first window alone (four steps), then back at chance, stuck.
    rates = [0.3] * 200
    return Run(_spike_at_the_start(seed, 2.3, 2000.0, 4) + multiplicative([2.33] * 195, 0.02, seed), rates)


def make_spike_then_above_start(seed: int) -> Run:
    # A log-likelihood at 0.34 thrown to thousands, then falling slowly from 16 to 6: ends far above its start.
    rates = [0.6] * 200
    tail = additive([16.0 - 10.0 * k / 195 for k in range(195)], 0.8, seed)
    return Run(_spike_at_the_start(seed, 0.34, 2000.0, 4) + tail, rates)


def make_spike_then_learns(seed: int) -> Run:
    # The same spike, after which the run learns to below its start (-0.6): healthy.
    rates = [0.3] * 300
    tail = additive(learning(rates[:295], 3.0, -0.6, 3.0), 0.1, seed)
    return Run(_spike_at_the_start(seed, 0.34, 300.0, 4) + tail, rates)


def make_learns_then_unstable(seed: int) -> Run:
    # A rate still too high: the loss learns from 1.5 to about 0 while the noise is still being measured,
    # then climbs back and keeps climbing, to 3.5: it learned once, and it diverges.
    rates = [0.15] * 200
    first = [0.34, 3.5, 1.0, 1.45, 1.15]
    fall = additive([1.0 - 1.2 * k / 19 for k in range(20)], 0.15, seed)
    climb = additive([1.8 + 1.7 * k / 174 for k in range(175)], 0.3, seed + 1)
    return Run(first + fall + climb, rates)


def make_noisy_tiny_batches(seed: int) -> Run:
    rates = [0.05] * 600
    return Run(multiplicative(learning(rates, 2.3, 0.4, 8.0), 0.35, seed), rates)


def make_noisy_spikes(seed: int) -> Run:
    rates = [0.05] * 500
    losses = multiplicative(learning(rates, 2.3, 0.4, 5.0), 0.2, seed)
    return Run(spiky(losses, 40, 12.0, seed), rates)


def make_slow_plateau(seed: int) -> Run:
    # Learns slowly to 1.0, then sits there for 1000 steps: converged, not failed.
    rates = [0.01] * 1200
    return Run(multiplicative(learning(rates, 2.3, 1.0, 0.8), 0.03, seed), rates)


def make_late_divergence(seed: int) -> Run:
    rates = [0.1] * 500
    losses = multiplicative(learning(rates, 2.3, 0.3, 5.0), 0.05, seed)
    return Run(grow_from(losses, 350, 1.25), rates)


def make_early_explosion(seed: int) -> Run:
    rates = [0.5] * 200
    losses = multiplicative([2.3] * 200, 0.02, seed)
    return Run(grow_from(losses, 8, 1.5), rates)


def make_flat(seed: int) -> Run:
    rates = [0.0] * 300
    return Run(multiplicative([2.3] * 300, 0.02, seed), rates)


def make_flat_noisy(seed: int) -> Run:
    rates = [1e-9] * 400
    return Run(multiplicative([2.3] * 400, 0.35, seed), rates)


def make_flat_negative(seed: int) -> Run:
    # A log-likelihood loss that starts below zero and never moves.
    rates = [0.0] * 300
    return Run(additive([-1.0] * 300, 0.05, seed), rates)


def make_flat_near_zero(seed: int) -> Run:
    rates = [0.0] * 300
    return Run(additive([0.002] * 300, 0.001, seed), rates)


def make_slowly_rising(seed: int) -> Run:
    rates = [0.1] * 400
    return Run(multiplicative([2.3 * 1.01**step for step in range(400)], 0.03, seed), rates)


def make_unknown_rate(seed: int) -> Run:
    # A loop whose learning rate the sentinel cannot read (no optimizer in sight).
    losses = multiplicative(learning([0.1] * 300, 2.3, 0.2, 3.0), 0.05, seed)
    return Run(losses, [None] * 300)
