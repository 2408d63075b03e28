"""A loss whose makeup changes mid-run (a term switched on, another task's loss) is judged afresh from there.

The makeups are read from real backward passes; the check is fed synthetic losses beside them.
"""

from __future__ import annotations

import random

import torch
from torch.nn import functional

from stabilizer_sentinel.detection import loss_makeup
from stabilizer_sentinel.detection.chance_level import ChanceLevel
from stabilizer_sentinel.detection.learning_check import LearningCheck


def losses_of(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(8, 3, generator=generator, requires_grad=True)
    labels = torch.randint(0, 3, (8,), generator=generator)
    return functional.cross_entropy(scores, labels), functional.mse_loss(scores, torch.randn(8, 3, generator=generator))


def test_a_makeup_names_the_terms_added_up_whatever_their_scalings_and_counts():
    ce, mse = losses_of()
    assert loss_makeup.makeup([ce]) == loss_makeup.makeup([ce / 4]) == {"NllLossBackward0"}
    assert loss_makeup.makeup([ce + 0.0 * mse]) == loss_makeup.makeup([2.5 * ce - mse]) == {
        "NllLossBackward0", "MseLossBackward0"}
    assert loss_makeup.makeup([ce, mse]) == {"NllLossBackward0", "MseLossBackward0"}  # a pass from two scalars
    summed = ce
    for _ in range(300):  # a loss summed over many time steps: read from its first nodes, of one makeup
        summed = summed + losses_of()[0]
    assert loss_makeup.makeup([summed]) == {"NllLossBackward0"}
    assert loss_makeup.makeup([torch.ones(3, requires_grad=True) * 2]) is None  # no scalar: no loss
    # Two hand-written losses (stop 64's hunt: an L1 loss, then a mean squared error written out) differ below
    # their means.
    error = torch.randn(8, requires_grad=True)
    assert loss_makeup.makeup([functional.l1_loss(error, torch.zeros(8))]) == {"MeanBackward0(AbsBackward0)"}
    assert loss_makeup.makeup([(error ** 2).mean()]) == {"MeanBackward0(PowBackward0)"}


def run(steps: list[tuple[str, float]], *, listening: bool = True):
    """Each step backwards a loss of the makeup named (``ce`` or ``ce+mse``) and reports ``value``."""
    check = LearningCheck.configured([])
    if not listening:
        check.makeup = None
    for step, (made_of, value) in enumerate(steps):
        ce, mse = losses_of(step)
        (ce + mse if made_of == "ce+mse" else ce).backward()
        finding = check.observe(step, value, None, 0.05)
        if finding is not None:
            return check, finding
    return check, None


def noisy(levels: list[float], seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.gauss(0.0, 0.05)) for level in levels]


def test_a_term_switched_on_mid_run_is_judged_from_where_it_was_switched_on():
    # A classifier at 0.70 falling to 0.35; at step 30 a regression term of scale 9 joins it (9.4, falling).
    levels = [0.7 - 0.35 * step / 30 for step in range(30)] + [9.4 - 0.05 * step for step in range(50)]
    steps = [("ce" if step < 30 else "ce+mse", loss) for step, loss in enumerate(noisy(levels))]
    check, finding = run(steps)
    assert finding is None
    assert check.segments == [(30, "the loss is now made of MseLossBackward0 + NllLossBackward0")]
    assert check.start_loss is not None and check.start_loss > 8  # the new term's first window
    # Not listening to the makeup, the same losses are ten times the first window's: Diverging.
    _, unseen = run(steps, listening=False)
    assert unseen is not None and unseen.rule == "Diverging" and unseen.step == 32


def test_an_explosion_after_a_term_switched_on_is_still_found():
    levels = [0.7 - 0.35 * step / 30 for step in range(30)] + [9.4] * 30 + [9.4 * 20] * 10
    steps = [("ce" if step < 30 else "ce+mse", loss) for step, loss in enumerate(noisy(levels))]
    check, finding = run(steps)
    assert finding is not None and finding.rule == "Diverging" and finding.step == 62
    assert [step for step, _ in check.segments] == [30]


def test_a_loss_whose_makeup_alternates_from_its_start_is_one_run():
    # Mixup on every other batch: both makeups in the first window, the same loss throughout.
    levels = [0.7 - 0.3 * step / 80 for step in range(80)] + [7.5] * 5
    steps = [("ce" if step % 2 else "ce+mse", loss) for step, loss in enumerate(noisy(levels))]
    check, finding = run(steps)
    assert check.segments == []
    assert finding is not None and finding.rule == "Diverging" and finding.step == 82


def test_a_squared_errors_targets_that_moved_for_two_windows_are_measured_afresh():
    generator = torch.Generator().manual_seed(0)
    chance = ChanceLevel()
    moved_at = []
    for step in range(200):  # one task's targets (variance 0.6), then another's (variance 10) from step 100
        spread, centre = (0.77, 1.5) if step < 100 else (3.2, 2.6)
        chance.observe([_mse(centre + spread * torch.randn(16, 1, generator=generator))])
        if step % 5 == 4 and chance.moved():
            moved_at.append(step)
    assert moved_at == [109]  # the windows to steps 104 and 109
    assert 8 < chance.level() < 12  # the second task's targets alone


def test_targets_with_far_outliers_or_a_slow_drift_have_not_moved():
    generator = torch.Generator().manual_seed(1)
    chance = ChanceLevel()
    for step in range(600):
        targets = torch.randn(8, 1, generator=generator) + step / 300  # drifting a third of a spread a hundred steps
        if step % 37 == 0:
            targets[0] = 20.0  # a far outlier now and then
        chance.observe([_mse(targets)])
        assert not (step % 5 == 4 and chance.moved()), step


def _mse(targets: torch.Tensor) -> torch.Tensor:
    return functional.mse_loss(torch.zeros_like(targets, requires_grad=True), targets)


def test_a_regression_given_another_task_is_not_called_back_at_its_chance_level():
    # Learned its first task from 3 to 0.25 (targets' variance 0.6); at step 150 a harder task whose targets'
    # variance is 10: its loss sits about there, learning slowly. The level pooled over both tasks' targets (2 to
    # 6) would call it back at chance.
    generator = torch.Generator().manual_seed(2)
    levels = [3.0 * 0.97 ** step + 0.25 for step in range(150)] + [10.0 - 0.01 * step for step in range(150)]
    for listening in (True, False):
        check = LearningCheck.configured([])
        check.chance.accept_scaled = True
        if not listening:
            check.chance.moved = lambda: False  # as before stop 64: the targets pooled over the run
        finding = None
        for step, loss in enumerate(noisy(levels)):
            spread, centre = (0.77, 1.5) if step < 150 else (3.2, 2.6)
            _mse(centre + spread * torch.randn(64, 1, generator=generator)).backward()
            finding = check.observe(step, loss, None, 0.003)
            if finding is not None:
                break
        if listening:
            assert finding is None and [step for step, _ in check.segments] == [160]
        else:
            assert finding is not None and "went back to the loss" in finding.message


def _bootstrapped(losses_over_spread: float, *, grows: bool, steps: int = 300):
    """A squared error reported at three times its targets' variance at the start and ``losses_over_spread`` times it
    once trained, that variance growing a hundredfold over the run (a DQN's values, bootstrapped from its own
    predictions); the targets backwarded have that spread where ``grows``, else their first spread throughout."""
    generator = torch.Generator().manual_seed(3)
    check = LearningCheck.configured([])
    for step in range(steps):
        spread = 0.3 * 10 ** (step / steps)
        trained = min(step / 50, 1.0)
        level = spread ** 2 * (3.0 * (1 - trained) + losses_over_spread * trained)
        _mse(step / 30 + (spread if grows else 0.3) * torch.randn(64, 1, generator=generator)).backward()
        finding = check.observe(step, level * (1 + 0.1 * float(torch.randn(1, generator=generator))), None, 1e-3)
        if finding is not None:
            return check, finding
    return check, None


def test_a_squared_error_that_rises_with_its_targets_spread_is_judged_afresh_not_diverging():
    # Stop 71's hunt: a DQN's temporal-difference loss rose 0.02 to 5 as its values grew (the variance of its targets
    # with them): called Diverging at step 1465 and stopped. Here the loss sits at its targets' variance, which grows
    # a hundredfold.
    check, finding = _bootstrapped(1.0, grows=True)
    assert finding is None
    why = "the spread of its squared error's targets grew with the loss"
    assert check.segments and all(reason == why for _, reason in check.segments)
    assert check.learned
    # The same losses on targets whose spread stays put: a regression diverging.
    _, diverging = _bootstrapped(1.0, grows=False)
    assert diverging is not None and diverging.rule == "Diverging"
    # Targets that grow, and a loss at ten times their variance (worse than a guess drawn from them): diverging.
    _, worse = _bootstrapped(10.0, grows=True)
    assert worse is not None and worse.rule == "Diverging"
