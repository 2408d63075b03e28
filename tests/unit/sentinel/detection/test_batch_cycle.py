"""A loss whose batches come in a fixed order: read cycle for cycle at the end of a run (``batch_cycle``)."""

from __future__ import annotations

import math
import random

from stabilizer_sentinel.detection import batch_cycle
from stabilizer_sentinel.detection.learning_check import LearningCheck
from stabilizer_sentinel.summary import RunRecord
from tests.unit.sentinel.detection.test_chance_level import Known

# Stop 78: a Huber regression (the diabetes data, 5 % of its targets thrown off as outliers, a 32-unit MLP, Adam at
# 0.01) over ten slices of 40 taken in order, 80 steps: its test loss 0.235 where a guess scores 0.452, and it was
# found never to have learned ("a fall of at least 5% of the start and 3 standard errors of the noise 0.265 per step
# was required"). Each slice's loss comes back every ten steps, a little lower each time.
IN_ORDER = [
    0.8131, 0.5244, 0.3498, 0.5154, 0.2152, 0.3307, 0.3083, 0.8017, 0.2983, 0.5278,
    0.7366, 0.4691, 0.2359, 0.3643, 0.2229, 0.3160, 0.2402, 0.7974, 0.2630, 0.5196,
    0.6812, 0.4302, 0.2214, 0.3604, 0.1777, 0.3289, 0.2270, 0.7970, 0.2421, 0.5066,
    0.6765, 0.4161, 0.2167, 0.3553, 0.1869, 0.3071, 0.2164, 0.7812, 0.2308, 0.5001,
    0.6756, 0.4150, 0.2130, 0.3591, 0.1715, 0.3012, 0.2138, 0.7781, 0.2173, 0.4913,
    0.6720, 0.4177, 0.2062, 0.3527, 0.1749, 0.2984, 0.2078, 0.7747, 0.2167, 0.4864,
    0.6708, 0.4161, 0.2031, 0.3485, 0.1664, 0.3000, 0.2051, 0.7745, 0.2107, 0.4810,
    0.6701, 0.4148, 0.1998, 0.3465, 0.1678, 0.2967, 0.2013, 0.7710, 0.2082, 0.4775,
]


def summary_of(losses: list[float], chance: float | None = None) -> tuple[str | None, dict]:
    """The rule found at the end of a completed run of ``losses`` (None for none), and findings.json's summary;
    ``chance`` the loss's chance level, as real backward passes would have measured it."""
    check, record = LearningCheck(run_steps=len(losses)), RunRecord()
    check.chance = Known(chance) if chance is not None else None
    for step, loss in enumerate(losses):
        record.observed(step, loss)
        assert check.observe(step, loss, None, 0.01) is None
    finding = check.at_end(len(losses) - 1)
    return None if finding is None else finding.rule, record.summary(check, ended="completed", exception=None)


def test_losses_that_repeat_batch_for_batch_are_read_cycle_for_cycle():
    fall = batch_cycle.cycle_fall(IN_ORDER)
    assert fall is not None and fall.period == 10
    assert math.isclose(fall.first, sum(IN_ORDER[:10]) / 10) and math.isclose(fall.last, sum(IN_ORDER[-10:]) / 10)
    assert fall.noise < 0.1 * fall.per_step  # the slices' levels cancel one period apart, and not one step apart


def test_independent_noise_and_a_noisy_fall_have_no_period():
    # Measured at stop 78: 1 and 4 of 5,000 runs of 30 and of 40 steps of independent noise read a period, none of
    # 60 or more steps, nor any of 2,000 falling ones.
    for seed in range(300):
        rng = random.Random(seed)
        assert batch_cycle.period([1.0 + 0.1 * rng.gauss(0.0, 1.0) for _ in range(80)]) is None
        assert batch_cycle.period([1.0 + math.exp(-t / 20) + 0.1 * rng.gauss(0.0, 1.0) for t in range(80)]) is None


def test_a_run_whose_batches_come_in_a_fixed_order_learned_by_its_cycles():
    finding, summary = summary_of(IN_ORDER)
    assert finding is None and summary["learned"] is True
    assert summary["learned_by"].startswith("its losses repeat every 10 steps (batches in a fixed order")
    # The same slices at a rate that moves nothing: each cycle as the first, never learned.
    finding, summary = summary_of([IN_ORDER[step % 10] for step in range(80)])
    assert finding == "NotLearning" and summary["learned"] is False and summary["learned_by"] is None
    # Falling 3 % cycle for cycle, less than the check's least fall (5 % of the start): not learned either.
    creeping = [IN_ORDER[step % 10] * (1.0 - 0.03 * (step // 10) / 7) for step in range(80)]
    finding, summary = summary_of(creeping)
    assert finding == "NotLearning" and summary["learned_by"] is None


def test_a_run_that_learned_on_its_way_says_nothing_of_cycles():
    # A falling loss of independent noise learns by its windows; the cycles are read only where they would not.
    rng = random.Random(0)
    finding, summary = summary_of([1.0 + math.exp(-t / 20) + 0.05 * rng.gauss(0.0, 1.0) for t in range(80)])
    assert finding is None and summary["learned"] is True and summary["learned_by"] is None


def test_a_fall_cycle_for_cycle_to_the_chance_level_is_no_learning():
    # Its first cycle (0.4685) above the level of a prediction that ignores the inputs: the fall counts from that
    # level, to the last cycle's 0.3754. Below 0.45 by 17 %: learned, from the level.
    finding, summary = summary_of(IN_ORDER, chance=0.45)
    assert finding is None and summary["learned"] is True
    assert "is below the loss 0.45 of a prediction that ignores the inputs" in summary["learned_by"]
    # Below 0.39 by under 4 %, less than the least fall (5 %): not learned.
    finding, summary = summary_of(IN_ORDER, chance=0.39)
    assert finding == "NotLearning" and summary["learned_by"] is None


def test_a_fall_that_is_only_the_batches_levels_in_a_fixed_order_is_no_learning():
    # Stop 82's hunt: a token-level loss over batches bucketed by length, longest first, at rate 0: each epoch's 30
    # losses the same as the last's, falling through the epoch (6.35 to 4.94) as the batches shorten. Its windows
    # fell from the first to the last, and it was called learned.
    draws = random.Random(0)
    epoch = sorted((draws.uniform(4.5, 6.4) for _ in range(30)), reverse=True)
    rule, written = summary_of(epoch * 3)
    assert rule == "NotLearning" and written["learned"] is False
    # The same batches at a rate that learns: every loss a little lower each epoch, as stop 78's regression.
    learning = [loss * (0.9 ** (step / 30)) for step, loss in enumerate(epoch * 3)]
    rule, written = summary_of(learning)
    assert rule is None and written["learned"] is True
