"""The watchdog's bounds and judgements, without a process: when no step is a hang, who holds the
others up, and which rank is a straggler."""

from __future__ import annotations

import pytest

from stabilizer_sentinel.detection.hang_bounds import HangBounds, HangSettingsError
from stabilizer_sentinel.detection.watchdog import laggards, stragglers


def test_the_hang_bound_is_the_floor_or_a_multiple_of_the_median_step_whichever_is_longer():
    bounds = HangBounds.from_env({"STABILIZER_HANG_FLOOR_SECONDS": "60", "STABILIZER_HANG_FACTOR": "10"})
    assert bounds.limit(0.5) == 60  # fast steps: the floor
    assert bounds.limit(12.0) == 120  # slow steps: 10 x the median
    assert bounds.limit(None) == 180  # before a median exists: the startup bound, three floors
    assert HangBounds.from_env({}).limit(None) == 1800 and HangBounds.from_env({}).limit(1.0) == 600
    assert not HangBounds.from_env({"STABILIZER_HANG_FLOOR_SECONDS": "0"}).enabled


@pytest.mark.parametrize(("name", "value"), [("STABILIZER_HANG_FACTOR", "0.5"), ("STABILIZER_STRAGGLER_FACTOR", "x")])
def test_a_bound_out_of_range_names_its_variable(name, value):
    with pytest.raises(HangSettingsError, match=f"^{name}: expected"):
        HangBounds.from_env({name: value})


def beat(step: int, forward: bool = False, wall: float = 100.0, busy: float | None = None) -> dict:
    return {"step": step, "forward": forward, "wall": wall, "host": "algo-2", "busy": busy}


def test_the_rank_behind_the_others_is_the_one_named():
    beats = {0: beat(8, True), 1: beat(8, True), 2: beat(8, False), 3: beat(8, True)}
    assert laggards(beats, now=101, stale_after=10) == [2]  # it never finished its forward pass
    assert laggards({0: beat(9), 1: beat(7)}, now=101, stale_after=10) == [1]
    assert laggards({0: beat(8, True), 1: beat(8, True)}, now=101, stale_after=10) == []  # no one singled out


def test_a_rank_whose_heartbeat_stopped_is_named_first():
    beats = {0: beat(8, True), 1: beat(9, True, wall=50.0)}
    assert laggards(beats, now=101, stale_after=10) == [1]


def test_a_straggler_is_a_rank_slower_than_the_others_median_by_the_factor():
    beats = {0: beat(5, busy=0.010), 1: beat(5, busy=0.011), 2: beat(5, busy=0.050), 3: beat(5, busy=0.012)}
    assert list(stragglers(beats, 2.0)) == [2]
    assert stragglers(beats, 0) == {}  # off
    assert stragglers({0: beat(5, busy=0.001), 1: beat(5, busy=0.003)}, 2.0) == {}  # within timer noise


def test_the_watchdog_beats_at_the_steps_of_the_optimizer_that_replaced_the_first():
    # Guard.hand_over moves the beat to the new optimizer: left on the old one, the second phase's
    # steps would not count and a healthy phase longer than the floor would be called a hang.
    from types import SimpleNamespace

    import torch

    from stabilizer_sentinel.detection.watchdog import Watchdog

    weight = torch.nn.Parameter(torch.ones(2))
    first, second = torch.optim.SGD([weight], lr=0.1), torch.optim.SGD([weight], lr=0.1)
    guard = SimpleNamespace(rank=0, world_size=1, step_number=0, optimizer=first, model=None, primary=True)
    dog, handles = Watchdog(guard, HangBounds.from_env({})), []
    dog.follow(first, handles)
    weight.grad = torch.ones(2)
    first.step()
    assert dog.steps == 1
    dog.follow(second, handles)
    first.step()
    second.step()
    assert dog.steps == 2 and len(handles) == 1
