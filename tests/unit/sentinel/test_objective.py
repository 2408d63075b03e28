"""The job's objective metric (stabilizer_sentinel.summary.Objective): a reward or an accuracy the script prints,
read from its log, decides whether the run learned where its loss cannot (a policy gradient's surrogate)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

from stabilizer_sentinel.summary import LogLoss, Objective, RunRecord

SURROGATE = "its loss is a policy gradient's surrogate, whose value measures no fit: whether it learned is not judged"


def _summary(readings: list[float], *, kind: str = "Maximize", loss_learned: bool = False,
             unjudged: str | None = SURROGATE) -> dict:
    objective = Objective("train:average_reward", kind)
    for value in readings:
        objective.add(value)
    record = RunRecord(integration="launcher", steps_observed=500, first_seen=0.3, last_loss=0.1,
                       log=LogLoss(objective=objective))
    learning = SimpleNamespace(learned=loss_learned, unjudged=unjudged, learning_start=0.3, window=5)
    return record.summary(learning, ended=None, exception=None)


def _rewards(episodes: int, rising: bool, seed: int = 0, running: bool = True) -> list[float]:
    """CartPole's reward as pytorch/examples' REINFORCE prints it every 10 episodes: the running reward (0.05 of
    each episode's into the last, from 10) or the last episode's; a policy that learns lasts longer each episode,
    a random one about 20 steps."""
    rng, average, printed = random.Random(seed), 10.0, []
    for episode in range(1, episodes + 1):
        mean = min(500.0, 20.0 + 2.0 * episode) if rising else 20.0
        reward = max(8.0, rng.gauss(mean, 0.4 * mean))
        average = 0.05 * reward + 0.95 * average
        if episode % 10 == 0:
            printed.append(average if running else reward)
    return printed


def test_a_policy_whose_reward_rose_learned_where_its_surrogate_loss_could_not_say():
    for running in (True, False):
        summary = _summary(_rewards(250, rising=True, running=running))
        assert summary["learned"] is True
        assert summary["learned_by"].startswith("its objective train:average_reward rose ")
        assert summary["objective"]["decided"] is True and summary["objective"]["readings"] == 25


def test_a_random_policys_reward_that_never_rose_did_not_learn():
    for seed in range(5):
        summary = _summary(_rewards(400, rising=False, seed=seed, running=False))
        assert summary["learned"] is False, summary["objective"]
        assert "never rose beyond its noise" in summary["learned_by"]


def test_a_running_average_climbing_from_its_initial_value_to_a_random_policys_level_is_not_learning():
    # REINFORCE's running reward starts at 10 and a random policy's episodes last about 20 steps: its first
    # 100 episodes rise 10 -> 20 with nothing learned (the corpus's gamma-0 run).
    for seed in range(5):
        summary = _summary(_rewards(400, rising=False, seed=seed))
        assert summary["learned"] is None, summary["objective"]
        assert "not beyond where its first readings settled" in summary["objective"]["says"]


def test_an_error_rate_to_minimize_that_fell_learned_and_one_that_rose_did_not():
    falling = [0.9 * math.exp(-i / 10) + 0.02 for i in range(30)]
    assert _summary(falling, kind="Minimize")["learned"] is True
    assert _summary(falling[::-1], kind="Minimize")["learned"] is False


def test_too_few_readings_leave_the_run_unjudged():
    summary = _summary([10.0, 50.0, 200.0])
    assert summary["learned"] is None
    assert summary["objective"]["improved"] is None and summary["objective"]["decided"] is False


def test_a_last_reading_that_is_not_finite_is_no_learning():
    summary = _summary([*_rewards(250, rising=True), float("nan")])
    assert summary["learned"] is False
    assert "last reading is nan" in summary["learned_by"]


def test_a_loss_that_learned_while_the_objective_never_rose_did_not_learn_unless_it_started_trained():
    # The RL hunt of stop 81: DQN at 1,000 times its rate fitted its TD error (159 -> 64) while its return stayed
    # at a random policy's.
    flat = _rewards(400, rising=False, running=False)
    summary = _summary(flat, loss_learned=True, unjudged=None)
    assert summary["learned"] is False and summary["objective"]["decided"] is True
    assert summary["learned_by"].startswith("its objective train:average_reward never rose beyond its noise")
    # Resumed from a trained state, its objective may start where it stays: the loss's word stands.
    objective = Objective("train:average_reward")
    for value in flat:
        objective.add(value)
    record = RunRecord(integration="launcher", steps_observed=500, first_seen=0.3, last_loss=0.1,
                       started_from="checkpoint-00000400.pt", log=LogLoss(objective=objective))
    learning = SimpleNamespace(learned=True, unjudged=None, learning_start=0.3, window=5)
    resumed = record.summary(learning, ended=None, exception=None)
    assert resumed["learned"] is True and resumed["objective"]["decided"] is False
    # A loss that did not learn is not made a success by an objective that rose.
    rising = _summary(_rewards(250, rising=True), loss_learned=False, unjudged=None)
    assert rising["learned"] is False and rising["objective"]["decided"] is False


def test_per_episode_returns_that_quadrupled_learned_though_one_early_episode_ran_long():
    # The RL hunt of stop 81: c51 and PQN on CartPole printed each episode's return; their means quadrupled, but a
    # lucky early episode as the baseline left them too little to judge.
    rng = random.Random(1)
    returns = [max(8.0, rng.gauss(25 + 0.25 * i, 0.5 * (25 + 0.25 * i))) for i in range(400)]
    returns[20] = 180.0  # a long episode early on
    summary = _summary(returns)
    assert summary["learned"] is True, summary["objective"]


def test_a_long_run_keeps_its_first_and_newest_readings_only_and_is_judged_on_them():
    objective = Objective("accuracy", "Maximize")
    for i in range(10_000):
        objective.add(0.1 if i < 5_000 else 0.9)
    assert len(objective.first) + len(objective.newest) == 2048
    improved, says = objective.judged()
    assert improved is True and "0.1 -> 0.9" in says
