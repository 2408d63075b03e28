"""The checks behind the verdict: a run that never learned or plateaued is caught, one that learns is not."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from stabilizer_sentinel.detection.health import (
    DIVERGING,
    NOT_LEARNING,
    PLATEAU,
    SWEEP_STEPS,
    LearningCheck,
    rate_sweep,
    run_up,
    sweep_goes_on,
)
from stabilizer_sentinel.detection.loss_statistics import NoiseEstimate
from tests.unit.sentinel.detection.test_sentinel import loop


def feed(check: LearningCheck, losses, warmup_steps: int = 0):
    for step, loss in enumerate(losses):
        finding = check.observe(step, loss, "warmup" if step < warmup_steps else "main")
        if finding is not None:
            return finding
    return None


def noisy(values, spread=0.01, seed=0):
    rng = random.Random(seed)
    return [v * (1 + rng.uniform(-spread, spread)) for v in values]


def test_a_loss_that_never_moves_is_stopped_after_the_patience_of_the_main_phase():
    finding = feed(LearningCheck(), noisy([2.30] * 200))
    assert finding is not None and finding.rule == NOT_LEARNING
    assert finding.step == 99  # the window that completes 100 main-phase steps (min_patience)
    assert "never learned in 100 steps after warm-up" in finding.message
    shorter = feed(LearningCheck(min_patience=1), noisy([2.30] * 200))
    assert shorter is not None and shorter.step == 29  # then 6 windows of 5 are the fewest


def test_a_network_at_its_chance_level_for_its_first_tens_of_steps_is_not_stopped_there():
    # RAdam at its defaults (its rectified first steps) and plain SGD at 0.01 on a digits MLP: flat at the
    # chance level for 30 steps and more, then learning (2.30 to 1.6 by step 280); both were stopped at step 29.
    late = noisy([2.30] * 45 + [2.30 * math.exp(-0.004 * s) for s in range(255)], spread=0.02)
    check = LearningCheck()
    assert feed(check, late) is None and check.learned


def test_warmup_steps_do_not_count_and_a_long_warmup_earns_a_longer_patience():
    # 150 warm-up steps, then max(6 windows, 100 steps, 1 x the warm-up) = 150 main-phase steps.
    finding = feed(LearningCheck(), noisy([2.30] * 400), warmup_steps=150)
    assert finding is not None and finding.step == 299
    assert "in 150 steps after warm-up (patience 150)" in finding.message
    short = feed(LearningCheck(), noisy([2.30] * 400), warmup_steps=10)
    assert short is not None and short.step == 109  # 10 + the minimum of 100


def test_a_run_that_learns_is_never_called_stalled():
    # Fast then slow learning with 3 % batch noise, for 300 steps.
    losses = noisy([0.2 + 2.1 * math.exp(-step / 40) for step in range(300)], spread=0.03)
    check = LearningCheck()
    assert feed(check, losses) is None
    assert check.learned and check.at_end(299) is None


def test_a_gentle_warmup_that_learns_slowly_is_not_stopped():
    losses = noisy([2.3 - 0.002 * step for step in range(12)] + [2.28 * math.exp(-s / 15) + 0.1 for s in range(60)])
    assert feed(LearningCheck(), losses, warmup_steps=12) is None


def test_a_loss_that_flattens_after_learning_is_not_judged_by_default():
    # Convergence is not failure: the default check only asks that the run learned.
    losses = [2.3 - 0.02 * step for step in range(50)] + [1.3] * 150
    assert feed(LearningCheck(), losses) is None


def test_with_a_patience_a_loss_that_stops_improving_after_learning_is_a_plateau():
    losses = noisy([2.3 - 0.05 * step for step in range(20)] + [1.3] * 200)
    finding = feed(LearningCheck(plateau_patience=60), losses)
    assert finding is not None and finding.rule == PLATEAU
    assert "plateaued" in finding.message
    assert 60 <= finding.step - 19 <= 70


def test_a_short_completed_run_is_judged_at_its_end():
    flat = LearningCheck()
    assert feed(flat, noisy([2.30] * 12)) is None  # shorter than the patience
    finding = flat.at_end(11)
    assert finding is not None and "by the end of the run" in finding.message
    learning = LearningCheck()
    feed(learning, [2.3 - 0.1 * step for step in range(12)])
    assert learning.at_end(11) is None
    too_short = LearningCheck()
    feed(too_short, [2.3] * 4)
    assert too_short.at_end(3) is None  # one window is no evidence either way


# An LBFGS run (max_iter 5, batches of 128 digits): its line search threw the loss to 135 and 10.5 at
# its tenth and eleventh steps, then it learned on to 0.04-0.25 (measured watched by the launcher).
LBFGS_SPIKE = [2.151, 1.321, 0.578, 0.529, 0.417, 0.240, 0.195, 0.239, 0.277, 135.5, 10.52, 0.271, 0.218, 0.390,
               0.096, 0.813, 0.166, 0.059, 0.117, 0.119, 0.101, 0.141, 0.257, 0.254, 0.066, 0.083, 0.040, 0.175]


def test_a_short_run_that_learned_past_a_spike_and_its_aftershock_is_not_diverging():
    # The spike and the step after it touch four second differences: with three left out, the noise read
    # 0.59 and no window after the spike was below the start (1.0) by three of its standard errors.
    check = LearningCheck(run_steps=len(LBFGS_SPIKE))
    assert feed(check, LBFGS_SPIKE) is None
    assert check.at_end(len(LBFGS_SPIKE) - 1) is None and check.learned
    assert check.noise < 0.3
    # Normal noise is read as it is, four of twenty left out or an eighth of sixty-four.
    for count in (20, 64):
        readings = []
        for seed in range(300):
            estimate = NoiseEstimate()
            rng = random.Random(seed)
            for _ in range(count + 2):
                estimate.add(rng.gauss(0.0, 1.0))
            readings.append(estimate.sigma / (1.0 + 8.0 / count))  # less the widening for few samples
        assert sum(readings) / len(readings) == pytest.approx(1.0, abs=0.06)


def test_a_slow_start_falling_beyond_its_noise_is_left_to_learn_and_a_crawl_is_not():
    # A slow start: 0.04 in its first 30 steps (a third of the 5 % it must fall), then faster. Judged at
    # the patience by the margin alone, it was stopped there (plain SGD on a digits MLP, which learned
    # 2.30 to 1.66 by step 280 unwatched).
    slow = noisy([2.3 - 0.0013 * step if step < 40 else 2.248 - 0.004 * (step - 40) for step in range(120)],
                 spread=0.002)
    check = LearningCheck()
    assert feed(check, slow) is None and check.learned
    # A crawl a hundred times too slow to reach the margin is judged at the patience, as before.
    crawl = noisy([2.3 - 0.0001 * step for step in range(120)], spread=0.0002)
    finding = feed(LearningCheck(), crawl)
    assert finding is not None and finding.rule == NOT_LEARNING and finding.step < 110


def test_a_completed_run_that_never_learned_leaves_a_finding(tmp_path):
    _, _, verdicts = loop(tmp_path, [], 12, lr=0.0)
    assert not any(v.stop for v in verdicts.values())  # shorter than the patience: judged at close
    (finding,) = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())["findings"]
    assert finding["rule"] == NOT_LEARNING and finding["step"] == 11
    assert "never learned by the end of the run" in finding["message"]


def test_a_slowly_rising_loss_is_not_called_stalled_while_it_runs_and_is_diverging_at_its_end():
    # Rising, not flat, and never ten times where it started (about 6x at the end): judged at the end,
    # where a loss that ended above its start is a divergence (its remedy a lower rate), not a stall.
    rising = [2.3 * 1.03**step for step in range(60)]
    check = LearningCheck()
    assert feed(check, rising) is None
    finding = check.at_end(59)
    assert finding is not None and finding.rule == DIVERGING
    assert "ended with its loss above where it started" in finding.message


def test_a_loss_ten_times_its_first_window_is_diverging_even_while_finite():
    # A deep network without a bound on its loss: 2.3 for a window, then up by 1.5x a step to a finite 1e9.
    losses = noisy([2.3] * 5) + [2.3 * 1.5**k for k in range(1, 60)]
    check = LearningCheck()
    finding = feed(check, losses)
    assert finding is not None and finding.rule == DIVERGING
    # 2.3 * 1.5**6 = 26.2 (step 10) is the first above 2.3 + 9 x 2.3; the third in a row is step 12.
    assert finding.step == 12
    assert "above the divergence bound 23.0" in finding.message and "for 3 steps" in finding.message
    # Just under ten times is not: a loss bump that stays below it is left to the other checks.
    calm = LearningCheck()
    assert feed(calm, [2.3] * 5 + [22.9] * 3 + [2.0] * 10) is None


def test_a_hard_batch_or_two_above_the_bound_is_not_a_divergence():
    # A run learning by steps of 10 % (a flat run that never did would be judged at its patience, and
    # one that spiked and never learned past it is Diverging there: test_a_short_run_that_learned_...).
    spikes = [*noisy([2.3] * 20), 30.0, 31.0, *noisy([2.05] * 20), 40.0, *noisy([1.8] * 20)]
    assert feed(LearningCheck(), spikes) is None
    assert feed(LearningCheck(persistence=1), spikes).rule == DIVERGING  # the persistence is the reason


def test_a_resumed_run_diverges_against_its_lineage_start():
    before = LearningCheck()
    feed(before, noisy([2.3] * 5))
    resumed = LearningCheck()
    resumed.load_state_dict(before.state_dict())
    # A relaunch from a state already up: its first three steps are above the lineage's bound.
    findings = [resumed.observe(step, 30.0 + step, "main") for step in (10, 11, 12)]
    assert findings[:2] == [None, None]
    assert findings[2] is not None and findings[2].rule == DIVERGING and findings[2].step == 12


def test_a_resumed_run_is_judged_from_its_lineage_start():
    before = LearningCheck()
    feed(before, [2.3] * 5 + [1.9] * 5)  # the first attempt learned, then exploded
    assert before.at_end(9) is None and before.learned
    resumed = LearningCheck()
    resumed.load_state_dict(before.state_dict())
    # Six steps of its own, no lower than the lineage started: one window, judged at the end.
    for step, loss in enumerate([2.31] * 6, start=10):
        resumed.observe(step, loss, "main")
    finding = resumed.at_end(15)
    assert finding is not None and finding.rule == NOT_LEARNING
    assert "over the steps to 4" in finding.message  # the first window is the lineage's
    learned = LearningCheck()
    learned.load_state_dict(before.state_dict())
    for step, loss in enumerate([1.9] * 6, start=10):
        learned.observe(step, loss, "main")
    assert learned.at_end(15) is None


def test_a_run_resumed_late_in_its_patience_is_judged_on_steps_of_its_own():
    before = LearningCheck()
    feed(before, noisy([2.3] * 25, spread=0.1))  # the first attempt: 25 main-phase steps, then it exploded
    resumed = LearningCheck()
    resumed.load_state_dict(before.state_dict())
    # The relaunch at a lower rate learns slowly under batch noise: the patience is spent within five
    # steps, but not a verdict on the relaunch until it has steps enough to measure its noise and trend.
    learning = noisy([2.3 - 0.004 * step for step in range(200)], spread=0.1, seed=1)
    findings = [resumed.observe(step, loss, "main") for step, loss in enumerate(learning, start=25)]
    assert [f for f in findings if f is not None] == []
    assert resumed.learned


def test_the_run_up_starts_at_a_change_of_the_learning_rate():
    # Warm-up at 0.1 for steps 0-7, then 3.0: norms grow from step 9, non-finite at 12.
    rates = [(s, 0.1 if s < 8 else 3.0) for s in range(13)]
    norms = [(s, 1.0) for s in range(9)] + [(9, 5.0), (10, 40.0), (11, 900.0), (12, math.inf)]
    found = run_up(norms, rates, 12)
    assert found.onset_step == 8  # the state before the first step at 3.0
    assert found.stable_learning_rate == 0.1


def test_the_run_up_of_a_spike_at_a_constant_rate_is_where_the_norm_started_to_grow():
    rates = [(s, 0.5) for s in range(40)]
    norms = [(s, 1.0 + 0.01 * (s % 3)) for s in range(35)] + [(35, 3.0), (36, 9.0), (37, 50.0), (38, 400.0)]
    found = run_up(norms, rates, 39)
    assert found.onset_step == 35  # the growth began at 35: the state before that step
    assert found.stable_learning_rate == 0.5
    # Without growth or a recent change, only the failing step's own state is excluded.
    assert run_up([(s, 1.0) for s in range(10)], [(s, 0.5) for s in range(11)], 10).onset_step == 9
    # Too few healthy steps at any rate: none is stable.
    assert run_up([(0, 1.0), (1, 1.0)], [(0, 0.1), (1, 0.1), (2, 0.1)], 2).stable_learning_rate is None


def test_the_run_up_of_a_loss_that_jumped_and_stayed_up_is_before_the_jump():
    # Warm-up at 0.2: the loss jumps from 2.4 to 7 at step 1 and stays there while the gradient norm
    # grows too slowly to count, until it overflows at 11. The states from step 1 on are worse than
    # the start: only the first is healthy, and 0.2 was never a stable rate.
    losses = [(0, 2.4), (1, 7.5), (2, 7.7), (3, 8.0), (4, 6.7), (5, 21.0), (6, 146.0), (7, 240.0), (8, 8.8e3),
              (9, 1.8e6), (10, 4e16), (11, math.nan)]
    norms = [(s, 20.0 + s) for s in range(11)] + [(11, math.nan)]
    rates = [(s, 0.2) for s in range(12)]
    found = run_up(norms, rates, 11, losses=losses, start_loss=2.4)
    assert found.onset_step == 0
    assert found.stable_learning_rate is None
    # Resumed at step 5 from a state already up: the onset is before the run's first step.
    assert run_up(norms[5:], rates[5:], 11, losses=losses[5:], start_loss=2.4).onset_step == 4
    # Without the lineage's start the loss says nothing, and the norms alone cannot place the rise.
    assert run_up(norms, rates, 11, losses=losses).onset_step == 10


def test_the_run_up_of_a_run_wrecked_by_a_spike_it_never_learned_past_is_before_the_spike():
    # Thrown to thousands at step 5, back at chance from step 9 to the end, judged at step 31: every
    # state after the spike is as good as the start by its loss, and none is healthy. The onset is the
    # state before the spike, and the rate, taken for only five steps before it, is stable there.
    norms = [(s, 1.0) for s in range(31)]
    rates = [(s, 1000.0) for s in range(32)]
    assert run_up(norms, rates, 31).onset_step == 30  # the norms and rates alone place nothing
    found = run_up(norms, rates, 31, wrecked_at=5)
    assert (found.onset_step, found.stable_learning_rate) == (4, None)
    assert run_up(norms, rates, 31, wrecked_at=8).stable_learning_rate == 1000.0  # 7 steps before it


def test_the_sentinel_reports_the_run_up_with_its_finding(tmp_path):
    def poison(step, model):
        if step == 9:
            for p in model.parameters():
                p.grad.fill_(float("nan"))

    _, _, verdicts = loop(tmp_path, [], 12, poison=poison)
    (finding,) = verdicts[9].findings
    assert finding["rule"] == "ExplodingTensor" and finding["onset_step"] == 8
    assert finding["stable_learning_rate"] == 0.1


def test_a_jump_says_the_arithmetic_of_its_own_bound():
    # One step far above the start is Diverging at once; its message adds up (start + 90 scales).
    finding = feed(LearningCheck(), [*noisy([2.30] * 12), 4054.0])
    assert finding is not None and finding.rule == DIVERGING
    said = re.search(r"jumped above ([\d.e+]+) \(the mean of the first window ([\d.]+) \+ (\d+) x the loss's scale "
                     r"([\d.]+)\)", finding.message)
    assert said, finding.message
    bound, start, spreads, scale = map(float, said.groups())
    assert spreads == 90
    assert bound == pytest.approx(start + spreads * scale, rel=1e-3)


def test_a_run_whose_loss_the_check_took_at_one_step_in_ten_is_too_short_to_judge_not_unlearned():
    # From the seventh harm hunt: a loop setting its gradients by hand, its loss known from the log alone,
    # printed every tenth of its 90 steps (1.95 down to 0.29): nine losses, one window after the first.
    from stabilizer_sentinel.summary import RunRecord

    check, record = LearningCheck(), RunRecord()
    losses = iter([1.95, 1.3, 1.0, 0.82, 0.7, 0.61, 0.52, 0.46, 0.41])
    for step in range(1, 91):
        loss = next(losses) if step % 10 == 0 else None
        record.observed(step, loss)
        if loss is not None:
            assert check.observe(step, loss, None) is None
    assert check.at_end(90) is None and not check.judgeable
    assert record.summary(check, ended="completed", exception=None)["learned"] is None


def test_a_rate_raised_by_one_ratio_at_every_step_is_a_range_test_and_a_warm_up_is_not():
    def rates(rate_at) -> list[tuple[int, float | None]]:
        return [(step, rate_at(step)) for step in range(100)]

    sweep = rates(lambda step: 1e-5 * 1.2**step)  # an LR finder's exponential sweep
    assert rate_sweep(sweep, 60) == pytest.approx(1.2)
    assert rate_sweep(sweep, SWEEP_STEPS - 1) is None  # not yet swept for long enough to tell
    assert rate_sweep(rates(lambda step: 0.1 * (step + 1) / 100), 30) is None  # a linear warm-up: 1 + 1/t
    assert rate_sweep(rates(lambda step: 0.1), 60) is None  # constant
    assert rate_sweep(rates(lambda step: 0.1 * 0.98**step), 60) is None  # a decay by one ratio
    assert rate_sweep(rates(lambda step: 1e-3 * 1.01**step), 60) is None  # too slow for a range test
    onecycle = rates(lambda step: 0.05 + 0.45 * (1 - math.cos(math.pi * step / 100)) / 2)
    assert all(rate_sweep(onecycle, step) is None for step in range(100))  # a one-cycle's rising half
    stopped = [(step, rate) for step, rate in sweep if step != 50]  # a step checked with no rate read
    assert rate_sweep(stopped, 60) is None


def test_a_range_test_goes_on_while_its_rate_rises_by_its_ratio():
    sweep = [(step, 1e-5 * 1.2**step) for step in range(60)]
    assert sweep_goes_on(1.2, sweep)
    assert not sweep_goes_on(1.2, [*sweep, (60, 1e-3)])  # the script put its rate back: the test ended
    assert not sweep_goes_on(1.2, [*sweep, (60, sweep[-1][1])])  # held: a rate it trains at
    assert not sweep_goes_on(1.2, [*sweep, (60, sweep[-1][1] * 1.5)])  # another ratio: no longer the sweep
    assert not sweep_goes_on(1.2, [*sweep, (60, None)])  # no rate read
    assert not sweep_goes_on(1.2, sweep[:1])


def test_a_range_tests_steps_go_unjudged_and_the_run_is_judged_afresh_after_it():
    from stabilizer_sentinel.summary import RunRecord

    check, record = LearningCheck(), RunRecord()
    losses = [2.0 - 0.01 * step for step in range(40)]  # the test's loss falls, then it blows up
    for step, loss in enumerate(losses):
        record.observed(step, loss)
        check.observe(step, loss, None)
    assert check.learned
    check.swept("the run ended inside a rate range test, past its blow-up")
    assert not check.learned and check.observe(40, 1e6, None) is None  # its blow-up is the test's
    assert record.summary(check, ended="completed", exception=None)["learned"] is None  # ended inside it
    check.after_sweep(41)  # the script put its starting weights back: the training after is its own run
    assert check.unjudged is None and check.segments == [(41, "a rate range test ended")]
    flat = [2.0 + 0.001 * (step % 3) for step in range(41, 400)]
    found = [check.observe(step, loss, None) for step, loss in zip(range(41, 400), flat, strict=True)]
    assert not check.learned and [f.rule for f in found if f is not None] == ["NotLearning"]
