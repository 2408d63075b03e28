"""The script's learning-rate schedulers, read for a constant warm-up (stabilizer_sentinel.loops.schedules)."""

from __future__ import annotations

import torch
from torch.optim import lr_scheduler

from stabilizer_sentinel.detection.learning_check import LearningCheck
from stabilizer_sentinel.loops.schedules import Schedules, schedulers_of


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def held(schedules: Schedules, scheduler: lr_scheduler.LRScheduler, steps: int) -> list[bool]:
    """Whether the rate is held low before each of ``steps`` steps."""
    seen = []
    for _ in range(steps):
        seen.append(schedules.held_low())
        scheduler.optimizer.step()
        scheduler.step()
    return seen


def test_a_constant_warm_up_holds_the_rate_low_until_its_last_step():
    opt = optimizer()
    constant = lr_scheduler.ConstantLR(opt, factor=0.01, total_iters=3)
    constant.state_dict()  # its attributes read as a dict: the scheduler is found through it too
    assert held(Schedules(opt), constant, 5) == [True, True, True, False, False]


def test_a_warm_up_first_in_a_sequence_is_read_through_the_sequence():
    opt = optimizer()
    warm = lr_scheduler.ConstantLR(opt, factor=0.1, total_iters=2)
    decay = lr_scheduler.ExponentialLR(opt, gamma=0.9)
    sequence = lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[2])
    assert schedulers_of(opt) == [sequence]  # its parts are read through it
    assert held(Schedules(opt), sequence, 4) == [True, True, False, False]


def test_schedules_that_never_raise_the_rate_hold_nothing_low():
    for build in (lambda o: lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
                  lambda o: lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=3),
                  lambda o: lr_scheduler.ConstantLR(o, factor=1.0, total_iters=3)):
        opt = optimizer()
        assert held(Schedules(opt), build(opt), 3) == [False] * 3
    assert not Schedules(optimizer()).held_low()  # no scheduler


def test_a_rising_linear_warm_up_and_a_chained_one_hold_the_rate_low():
    opt = optimizer()
    assert held(Schedules(opt), lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2), 3) == [True, True, False]
    opt = optimizer()
    chained = lr_scheduler.ChainedScheduler([lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
                                             lr_scheduler.ExponentialLR(opt, gamma=0.99)])
    assert held(Schedules(opt), chained, 3) == [True, True, False]


def test_not_learning_waits_for_a_constant_warm_up_and_counts_its_patience_from_its_end():
    # Stop 87's verdict hunt: a digits network under ConstantLR(factor=0.01, total_iters=150), its loss flat at that
    # rate, was stopped as not learning at step 99; unwatched it learned once the rate rose (0.954 accurate).
    def first_finding(warm_up_known: bool) -> int | None:
        check = LearningCheck()
        if warm_up_known:
            check.held_low = lambda: step < 150
        for step in range(600):
            rate = 1e-5 if step < 150 else 1e-3
            found = check.observe(step, 2.30 + 0.01 * (step % 3), None, rate)
            if found is not None:
                return found.step
        return None

    assert first_finding(False) == 99
    assert first_finding(True) >= 150 + 150  # the warm-up's steps, then as many main-phase steps as its patience
