"""The chance level of a loss (what a prediction that ignores the inputs scores) in the learning check.

A loss that only falls to its chance level learned the labels' prior or the targets' mean, not the
inputs; a loss below it by more than its noise learned from the inputs, however little it fell.
The level is read from real backward passes; the check's verdicts are fed synthetic losses.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from stabilizer_sentinel.detection.chance_level import ChanceLevel, listen
from stabilizer_sentinel.detection.learning_check import LearningCheck


class Known:
    """A chance level already measured."""

    def __init__(self, value: float) -> None:
        self.value = value

    def level(self) -> float:
        return self.value


def verdict(losses: list[float], chance: float | None):
    check = LearningCheck(run_steps=len(losses))
    check.chance = Known(chance) if chance is not None else None
    for step, loss in enumerate(losses):
        finding = check.observe(step, loss, None, 0.05)
        if finding is not None:
            return finding
    return check.at_end(len(losses) - 1)


def noisy(levels: list[float], spread: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [max(0.01, level + rng.gauss(0.0, spread)) for level in levels]


def test_a_classifier_whose_loss_falls_only_to_the_entropy_of_its_labels_never_learned():
    # Random labels of three classes: the loss falls from a badly scaled 1.4 to ln 3 and stays there.
    levels = [math.log(3) + (1.4 - math.log(3)) * math.exp(-step / 40) for step in range(300)]
    losses = noisy(levels, 0.15)
    assert verdict(losses, None) is None  # from the loss alone, a genuine fall
    finding = verdict(losses, math.log(3))
    assert finding is not None and finding.rule == "NotLearning"
    assert "ignores the inputs" in finding.message


def test_a_noisy_classifier_below_its_chance_level_learned_though_its_fall_is_within_the_noise():
    # Batches of four, 30 % random labels: from 0.92 to 0.77 under a per-step noise of 0.45.
    levels = [0.77 + 0.15 * math.exp(-step / 60) for step in range(300)]
    losses = noisy(levels, 0.45, seed=3)
    finding = verdict(losses, None)
    assert finding is not None and finding.rule == "NotLearning"  # the fall alone is no evidence
    assert verdict(losses, math.log(3)) is None


def test_a_regression_that_falls_a_little_towards_its_targets_variance_never_learned():
    # A rate far too low: a straight 10 % fall from 12.7 under a noise of 0.5; the targets' variance is
    # 11.9 (the untrained model's predictions add their own error to it).
    losses = noisy([12.7 - 1.3 * step / 250 for step in range(250)], 0.5, seed=1)
    assert verdict(losses, None) is None  # from the loss alone, a real fall
    finding = verdict(losses, 11.9)
    assert finding is not None and finding.rule == "NotLearning"
    # The same run at a useful rate ends far below the variance: learned.
    assert verdict(noisy([6.0 + 6.7 * math.exp(-step / 120) for step in range(250)], 1.5), 11.7) is None


def _train(loss_of, steps: int = 40) -> ChanceLevel:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    owner = object.__new__(LearningCheck)
    chance = listen(owner)
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss_of(model, x).backward()
    del owner
    return chance


def test_the_chance_level_of_a_cross_entropy_is_the_entropy_of_the_labels_seen():
    labels = torch.tensor([0, 0, 0, 0, 0, 0, 1, 2])  # 6 : 1 : 1
    chance = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels))
    p = torch.tensor([6 / 8, 1 / 8, 1 / 8], dtype=torch.float64)
    assert math.isclose(chance.level(), float(-(p * p.log()).sum()), rel_tol=1e-9)


def test_labels_a_cross_entropy_ignores_are_not_counted_in_its_chance_level():
    labels = torch.tensor([0, 0, 1, 1, -100, -100, -100, -100])
    chance = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels))
    assert math.isclose(chance.level(), math.log(2), rel_tol=1e-9)


def test_the_chance_level_of_a_squared_error_is_the_variance_of_the_targets_seen():
    targets = torch.arange(24, dtype=torch.float32).reshape(8, 3)
    chance = _train(lambda model, x: nn.functional.mse_loss(model(x), targets))
    assert math.isclose(chance.level(), float(targets.var(0, unbiased=False).mean()), rel_tol=1e-6)


def test_a_classifier_knocked_back_to_its_chance_level_after_it_learned_is_diverging_within_its_patience():
    # Learned from 2.3 to about 0.2 in 80 steps, then a rate knocked it back to a guess (2.3) at step 100.
    levels = [2.3 * math.exp(-step / 25) + 0.15 for step in range(100)] + [2.3] * 150
    losses = noisy(levels, 0.05)
    finding = verdict(losses, 2.302)
    assert finding is not None and finding.rule == "Diverging" and "went back to the loss 2.302" in finding.message
    assert 195 <= finding.step <= 205  # the patience (100 steps) back at the level, well before the run's end
    assert verdict(losses, None) is None  # no level known (a GAN's, a sum of terms): never judged so


def test_a_classifier_whose_objective_got_harder_passes_its_chance_level_and_learns_on():
    # Adversarial examples from step 290 (stop 64's hunt): thrown to 5.5, back through its level 2.3 in about
    # thirty steps, then on below it, slowly (1.7 two hundred steps later).
    levels = ([2.3 * math.exp(-step / 25) + 0.07 for step in range(290)]
              + [max(5.5 * math.exp(-step / 12), 2.3 - 0.6 * step / 200) for step in range(250)])
    for seed in range(3):
        finding = verdict(noisy(levels, 0.05, seed=seed), 2.302)
        assert finding is None or finding.rule != "Diverging", (seed, finding)


def test_a_classifier_that_learned_a_little_and_wanders_near_its_chance_level_is_left_alone():
    # A hard task: from 0.69 to about 0.64 (chance ln 2), then noisy windows about there for 400 steps.
    levels = [0.69 - 0.05 * min(step, 60) / 60 for step in range(460)]
    for seed in range(5):
        finding = verdict(noisy(levels, 0.08, seed=seed), math.log(2))
        assert finding is None or finding.rule != "Diverging", (seed, finding)


def test_a_second_classifier_with_more_classes_leaves_the_level_unknown_and_its_backward_pass_alone():
    # A script that trains a three-class classifier, then a ten-class one (a sweep over tasks): the counts
    # of the first are no prior of the second's labels, and indexing them with its labels raised an
    # IndexError in the script's own backward pass (stop 63).
    torch.manual_seed(0)
    owner = object.__new__(LearningCheck)
    chance = listen(owner)
    for classes in (3, 10):
        model = nn.Linear(4, classes)
        for _ in range(5):
            nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, classes, (8,))).backward()
    assert chance.off and chance.level() is None and "classes change" in chance.reason
    del owner


def test_the_chance_level_is_unknown_for_a_loss_scaled_or_mixed_before_its_backward_pass():
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    halved = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels) / 2)  # accumulation
    assert halved.level() is None and halved.off
    weighted = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels, weight=torch.ones(3)))
    assert weighted.level() is None
    early = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels), steps=2)
    assert early.level() is None  # 16 labels of 3 classes: too few to measure a prior from


def test_a_run_shorter_than_the_chance_levels_span_is_judged_at_its_end_against_its_start():
    # Twelve steps of a ten-class classifier whose badly scaled start (2.6) falls to ln 10 at its end.
    # The chance level's own test needs 30 steps; until then the fall from the start decides.
    losses = [2.6 - 0.3 * step / 11 for step in range(12)]
    assert verdict(losses, None) is None
    assert verdict(losses, math.log(10)) is None
    flat = [2.6] * 12  # and a short flat run still never learned
    finding = verdict(flat, math.log(10))
    assert finding is not None and finding.rule == "NotLearning"


def test_a_classifier_thrown_to_ten_times_its_chance_level_in_its_first_steps_is_diverging_there():
    # MNIST at a thousand times its rate: 2.3 at the first step, then 1.8e8, 9.3e6, 4e5, and back
    # near chance by step 7. The first window's mean is no start to measure a bound from: the first
    # step is, in the larger of its magnitude and the chance level. Three steps above ten times it
    # are a divergence at the third, where the check used to wait for the run's patience.
    losses = [2.306, 1.776e8, 9.27e6, 3.98e5, 191.4, 254.5, 37.8, 10.2, *noisy([3.0] * 24, 0.3)]
    finding = verdict(losses, math.log(10))
    assert finding is not None and finding.rule == "Diverging" and finding.step == 3, finding
    assert "for 3 steps of its first 5" in finding.message and "2.306" in finding.message
    # A loss that leaves its chance level at 0.69 (a binary cross-entropy) for 50 and stays.
    stuck = verdict([0.805, *[50.0] * 31], math.log(2))
    assert stuck is not None and stuck.rule == "Diverging" and stuck.step == 3
    # Without a chance level the first window waits for its mean (a log-likelihood may leap from near zero).
    assert verdict(losses, None).step > 3


def test_a_loss_that_climbed_within_its_first_window_is_bounded_from_its_first_step_after_it():
    # llama2.c at a thousand times its rate (public corpus, ``llama2c-lr5``): a warm-up takes its loss
    # from 4.14 (ln 64 = 4.16, 64 tokens) to 21 within the first window and to 40-76 after it, where it
    # sits for tens of steps. The first window's mean (10.2) sets a bound of 102 the loss never
    # reached; from the first step, in the larger of its magnitude and the chance level (and the noise,
    # which the climb's steps widen at first), the bound is 41.6, and three steps above it (11, 12, 13)
    # are a divergence.
    climb = [4.144, 4.137, 6.853, 15.06, 21.02, 28.66, 48.53, 40.36, 62.56, 59.51, 46.95, 57.05, 75.68, 67.58,
             60.36, 49.71, 57.66, 56.82, 37.63, 33.72, 60.12, 45.37, 67.2, 49.13, 57.48, 63.1, 50.12, 54.14]
    losses = climb + noisy([3.0] * 72, 0.2)
    finding = verdict(losses, math.log(64))
    assert finding is not None and finding.rule == "Diverging" and finding.step == 13, finding
    assert "its first step 4.144" in finding.message and "no baseline" in finding.message
    # Without a chance level the first window's mean is all there is: not found while it sits there.
    assert (late := verdict(losses, None)) is None or late.step > len(climb), late
    # A classifier whose first window is its start (no climb): the bound from its mean, as before, a
    # hard batch or two well above chance no divergence.
    falling = noisy([2.4 * math.exp(-step / 30) + 0.1 for step in range(60)], 0.02)
    healthy = [2.3, 2.2, 2.25, 2.1, 2.05, 30.0, 25.0, *falling]
    assert verdict(healthy, math.log(10)) is None


def test_a_loss_that_swings_high_above_its_chance_bound_is_diverging_once_its_median_holds_there():
    # A GPT at ten thousand times its rate (stabilizer/bench/gpt_loop.py --lr 3 --clip 0, the device
    # benchmark's small model, 120 steps; 256 tokens): 5.76 to 17 in its first window, then between 23 and
    # 128 for sixty steps. Its swings carried the noise-widened bounds to 160-380, and no three steps in a row
    # were above them: found at its end alone. The median of fifteen steps is no single batch: above ten
    # times its first step (57.6) it is a divergence, at the fifteenth step after the first window.
    swings = [5.761, 6.3, 12.0, 17.2, 16.8, 27, 31, 50, 23, 68, 28, 82, 56, 64, 92, 82, 128, 65, 81, 98, 85, 108,
              89, 26, 71, 61, 124, 98, 121, 80, 45, 62, 75, 72, 45, 64, 56, 36, 68, 76, 94, 76, 50, 59, 65, 78]
    losses = swings + noisy([5.4] * 74, 0.05)
    finding = verdict(losses, math.log(256))
    assert finding is not None and finding.rule == "Diverging" and finding.step == 19, finding
    assert "median 65 of the loss's last 15 steps is above 57.61" in finding.message, finding.message
    # No step passed the widened bound: the first held step above this one is the spike, where the run-up
    # and the rate at fault are measured from (step 9, 68, at its rate then).
    check = LearningCheck(run_steps=len(losses))
    check.chance = Known(math.log(256))
    for step, loss in enumerate(losses[:20]):
        check.observe(step, loss, None, 0.01 * (step + 1))
    assert check.wrecked_at == 9 and check.wrecked_rate == pytest.approx(0.1)
    # Without a chance level nothing says where an untrained network scores: not found while it swings.
    assert (late := verdict(losses, None)) is None or late.step > len(swings), late
    # A healthy run one batch in three of which scores eight times the rest: its median is the others'.
    rough = [(2.3 * math.exp(-step / 30) + 0.1) * (8.0 if step % 3 == 0 and step else 1.0) for step in range(90)]
    assert verdict(rough, math.log(10)) is None


def test_the_level_is_read_once_a_window_after_the_first_not_each_step():
    # Reading the level is a synchronisation on an accelerator (its counts stay on the device): the bound
    # after the first window reads it as the window closes, not at every step of a climbed run.
    class Counted(Known):
        reads = 0

        def level(self) -> float:
            Counted.reads += 1
            return self.value

    climb = [4.144, 4.137, 6.853, 15.06, 21.02, *[30.0 + 0.5 * step for step in range(55)]]
    check = LearningCheck(run_steps=400)
    check.chance = Counted(math.log(64))
    for step, loss in enumerate(climb):
        check.observe(step, loss, None, 0.05)
    after_first = Counted.reads - 5  # the first window's steps read it each (the bound before its mean)
    assert after_first <= 2 * (len(climb) - 5) // check.window, Counted.reads


def test_the_first_step_bound_keeps_out_of_a_quiet_or_noisy_start_a_resumed_run_and_a_configured_bound():
    # A loss whose batches scatter widely (sd 0.6) about its chance level (0.5): a first window above its
    # first step by the noise is no climb, and the noise widens the bound as before.
    level = 0.5
    for seed in range(20):
        losses = noisy([0.5] * 60, 0.6, seed=seed)
        first = LearningCheck(run_steps=60)
        first.chance = Known(level)
        plain = LearningCheck(run_steps=60)
        found = [next((f.step for step, loss in enumerate(losses)
                       if (f := check.observe(step, loss, None, 0.05)) and f.rule == "Diverging"), None)
                 for check in (first, plain)]
        assert found[0] is None or found[0] == found[1], (seed, found)
    # A relaunch resumed from a trained state (0.1 at its first step; the lineage started at 2.3, ln 10
    # its level): its first step is no untrained network's, and its bound is its lineage's (23), not 20.8.
    resumed = LearningCheck()
    resumed.load_state_dict({"first": (4, 2.3), "lowest": 0.1, "main_steps": 100})
    resumed.chance = Known(math.log(10))
    losses = [0.1, 21.5, 22.0, 21.8, 0.1]
    assert all(resumed.observe(100 + step, loss, None, 0.05) is None for step, loss in enumerate(losses))
    # A rule that sets its own baseline and scale is bounded by them alone (21 here).
    configured = LearningCheck(baseline=3.0, scale=2.0)
    configured.chance = Known(0.3)
    steps = [0.5, 0.6, 8.0, 9.0, 10.0, 6.0, 6.0, 6.0, 6.0, 6.0]
    assert all(configured.observe(step, loss, None, 0.05) is None for step, loss in enumerate(steps))


def test_a_healthy_start_or_a_hard_batch_in_the_first_window_is_not_diverging():
    # A classifier whose first batches are harder than its first (2.3 then up to 2.9): healthy.
    learning = [2.3, 2.9, 2.7, 2.6, 2.5, *[2.4 * math.exp(-step / 30) + 0.1 for step in range(60)]]
    assert verdict(noisy(learning, 0.02), math.log(10)) is None
    # A fine-tune from a trained state (0.03) with two hard batches at 12 in its first window: the
    # chance level (2.3), not the tiny first step, sets the scale, and two steps are no trend.
    fine_tune = [0.03, 12.0, 0.04, 12.0, 0.03, *noisy([0.03] * 60, 0.005)]
    finding = verdict(fine_tune, math.log(10))
    assert finding is None or finding.step > 4, finding


def test_a_classifier_that_rose_from_its_first_step_and_fell_back_to_chance_had_a_rate_too_high():
    # An RNN at a thousand times its rate: 2.29 (chance, ln 10) at the first step, thrown to 11.8 and
    # back to about chance within the first window, where it stays. It never learned; "NotLearning"
    # would be answered by a higher rate. The loss rose from where the untrained network was and fell
    # back: a rate too high.
    losses = [2.288, 11.757, 9.279, 5.994, 2.995, 2.633, 2.413, 2.344, *noisy([2.35] * 24, 0.09)]
    finding = verdict(losses, math.log(10))
    assert finding is not None and finding.rule == "Diverging", finding
    assert "never learned since it rose" in finding.message
    assert "above twice its first step from step 1" in finding.message


def test_a_rate_too_low_is_still_not_learning_whatever_its_first_batch():
    # The same classifier at a rate too low: about chance throughout.
    flat = verdict(noisy([2.31] * 32, 0.05), math.log(10))
    assert flat is not None and flat.rule == "NotLearning", flat
    # A regression whose first batch happened to be easy (0.5, where its batches score 1.5 +- 0.5 at
    # the targets' variance): its windows are above its first step, but by its noise, not a rise.
    regression = [0.5, *noisy([1.5] * 59, 0.5, seed=2)]
    finding = verdict(regression, 1.5)
    assert finding is not None and finding.rule == "NotLearning", finding


class Ceiling:
    """A cross-entropy's chance level still being measured: only its bound, ln of its classes, is known."""

    def __init__(self, classes: int) -> None:
        self.classes = classes

    def level(self) -> None:
        return None

    def ceiling(self) -> float:
        return math.log(self.classes)


def test_while_a_cross_entropys_level_is_measured_ln_of_its_classes_bounds_it():
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    early = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels), steps=1)
    assert early.level() is None and early.ceiling() == pytest.approx(math.log(3))  # 8 labels of 3 classes
    measured = _train(lambda model, x: nn.functional.cross_entropy(model(x), labels))
    assert measured.ceiling() == measured.level()
    regression = _train(lambda model, x: nn.functional.mse_loss(model(x), torch.zeros(8, 3)), steps=1)
    assert regression.ceiling() is None  # a squared error has no bound before its variance is measured
    # MNIST with batches of 8: 100 labels are needed for its level, the divergence of its first window
    # is judged from the bound (as in the test above, where the level was known).
    check = LearningCheck()
    check.chance = Ceiling(10)
    losses = [2.306, 1.776e8, 9.27e6, 3.98e5, 191.4, 254.5]
    finding = next(f for step, loss in enumerate(losses) if (f := check.observe(step, loss, None, 1000.0)))
    assert finding.rule == "Diverging" and finding.step == 3


def test_a_short_run_that_ends_well_above_its_chance_level_never_learned_whatever_its_fall():
    # A regression of 24 steps thrown up at its second step (a rate a hundred times too high), back down
    # within a few steps to about 0.8 from its first step's 0.96: a fall, yet about nine times the
    # variance of its targets (0.089), the loss of predicting their mean. No input-blind prediction does
    # worse than that level, so the run learned nothing beyond a guess.
    losses = [0.96, 1.86e7, 1060.0, 0.43, 0.57, 213.0, 982.0, 0.62,
              0.63, 0.49, 0.87, 0.69, 0.47, 1.0, 0.77, 0.75, 0.84, 0.73, 1.04, 0.68, 0.89, 0.65, 0.9, 1.18]
    assert verdict(losses, None) is None  # from the loss alone, a fall from the start
    finding = verdict(losses, 0.089)
    assert finding is not None and finding.rule == "Diverging" and "spiked" in finding.message
    # Without the throw: a short regression whose loss falls from 1.0 to 0.6 where the targets' mean scores 0.1.
    falling = [1.0 - 0.4 * step / 19 for step in range(20)]
    assert verdict(falling, None) is None
    finding = verdict(falling, 0.1)
    assert finding is not None and finding.rule == "NotLearning" and "ignores the inputs" in finding.message
    # Ending at its chance level is still judged against its start, as before (the short classifier above).
    assert verdict([max(0.102, 1.0 - 0.1 * step) for step in range(20)], 0.1) is None


def test_a_short_run_whose_last_steps_reach_its_chance_level_is_judged_against_its_start():
    # The notebook's 12 steps of a ten-class classifier (batch norm, 32 a batch): its second window's
    # mean (2.43) is 6 % above the labels' entropy (2.30), but its last steps are at or below it (its
    # test accuracy 0.26 against 0.10 by chance): what it did last decides, and it fell from its start.
    losses = [2.9, 2.4, 2.8, 2.3, 2.88, 2.1, 2.75, 2.3, 2.6, 2.39, 2.19, 2.11]
    assert verdict(losses, 2.298) is None


def test_a_short_regression_ending_near_a_variance_measured_on_few_targets_is_judged_by_its_fall():
    # The targets' variance read from 32 targets is within about a quarter of the true one: a short run
    # that ends 15 % above that estimate may be below the true level. Its fall decides, as before.
    gen = torch.Generator().manual_seed(3)
    estimated = _train(lambda model, x: nn.functional.mse_loss(model(x), torch.randn(8, 3, generator=gen)), steps=4)
    level = estimated.level()
    assert level is not None and estimated.error() == pytest.approx(level * math.sqrt(2 / 31))
    losses = [1.6 - (1.6 - 1.15 * level) * min(step, 15) / 15 for step in range(20)]
    check = LearningCheck(run_steps=len(losses))
    check.chance = estimated
    assert all(check.observe(step, loss, None, 0.05) is None for step, loss in enumerate(losses))
    assert check.at_end(len(losses) - 1) is None and check.learned
    # Nine times the estimate (the super-resolution run above) is beyond any such error.
    check = LearningCheck(run_steps=len(losses))
    check.chance = estimated
    far = [9 * level * 1.4 - 0.4 * 9 * level * step / 19 for step in range(20)]
    assert [f for step, loss in enumerate(far) if (f := check.observe(step, loss, None, 0.05))] == []
    finding = check.at_end(len(far) - 1)
    assert finding is not None and finding.rule == "NotLearning" and "nothing beyond" in finding.message
