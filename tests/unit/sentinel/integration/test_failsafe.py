"""Where the watcher's own code raises inside the script, it stands aside and the run goes on as unwatched.

Each test makes one of the watcher's parts raise at a chosen step (a bug met on a loop never seen) and
trains the same loop unwatched beside it: the losses must be the same, the script must not see the
exception, and findings.json must say what failed, so that the run is never called a success.
"""

from __future__ import annotations

import gc
import json
import textwrap

import pytest
import torch
from torch import nn

from stabilizer_sentinel import failsafe, watch
from stabilizer_sentinel.detection import chance_level, input_blind
from stabilizer_sentinel.detection.learning_check import LearningCheck
from tests.unit.sentinel.support import job_env, run, summary


@pytest.fixture(autouse=True)
def watching(monkeypatch):
    """Each test starts with a watcher that has not stood aside, and leaves none behind: its guards are
    collected (their listeners, which hold the raising methods, let go at the next backward pass)."""
    monkeypatch.setattr(failsafe, "_failure", [])
    monkeypatch.setattr(failsafe, "_ranks", [])
    yield
    gc.collect()


def train(steps: int, guard_of=None) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = guard_of(model, optimizer) if guard_of is not None else None
    inputs, labels = torch.randn(64, 6), torch.randint(0, 3, (64,))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        if guard is not None:
            guard.step(loss)
        optimizer.step()
        losses.append(loss.item())
    if guard is not None:
        guard.close()
    return losses


def fails_at(step_wanted: int):
    """A replacement for a method that raises when the guard's step count reaches ``step_wanted``."""
    calls = []

    def wrap(original):
        def raising(self, *args, **kwargs):
            calls.append(1)
            if len(calls) > step_wanted:
                raise RuntimeError("a bug of the watcher's")
            return original(self, *args, **kwargs)
        return raising
    return wrap


@pytest.mark.parametrize("part", ["learning check", "backward listener", "forward hook"])
def test_a_part_of_the_watcher_that_raises_leaves_the_run_as_unwatched(tmp_path, monkeypatch, capsys, part):
    target = {"learning check": (LearningCheck, "observe"),
              "backward listener": (chance_level.ChanceLevel, "observe"),
              "forward hook": (input_blind.InputBlind, "observe")}[part]
    unwatched = train(30)
    monkeypatch.setattr(target[0], target[1], fails_at(7)(getattr(*target)))
    env = job_env(tmp_path, {"rules": [{"name": "ExplodingTensor"}], "recovery": "in_job"})
    watched = train(30, lambda model, optimizer: watch(model, optimizer, environ=env))
    assert watched == unwatched
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sentinel:")]
    assert len(said) == 1 and "RuntimeError: a bug of the watcher's at" in said[0] and "stands aside" in said[0]
    summary = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())["summary"]
    assert summary["watching_failed"].startswith("RuntimeError: a bug of the watcher's at stabilizer_sentinel/")
    assert summary["ended"] == "completed" and summary["steps_observed"] < 30


class Ranks:
    """Where the ranks meet (a guard's part, stabilizer_sentinel.failsafe.meets_ranks): its agreements counted,
    whether a rank may stand aside now, and this rank's meetings owed once it did."""

    def __init__(self, may_leave: bool) -> None:
        self.meetings, self.leave, self.met = 0, may_leave, []

    def may_leave(self) -> bool:
        return self.leave

    def meet(self, *args) -> None:
        self.met.append(args)


def test_with_several_ranks_a_failure_while_they_may_wait_in_a_collective_is_raised(monkeypatch):
    monkeypatch.setattr(failsafe, "_several_ranks", lambda: True)
    ranks = Ranks(may_leave=False)  # inside the agreement, a rollback's exchange or a stop
    failsafe.meets_ranks(ranks)

    def bug():
        raise KeyError("a bug of the watcher's")

    with pytest.raises(KeyError):
        failsafe.shielded(bug, meeting=ranks.meet)()
    assert failsafe.failure() is None and ranks.met == []


def test_with_several_ranks_a_rank_that_stands_aside_meets_the_others_at_its_steps_agreement(monkeypatch):
    monkeypatch.setattr(failsafe, "_several_ranks", lambda: True)
    ranks = Ranks(may_leave=True)
    failsafe.meets_ranks(ranks)

    def fails_before_agreeing(step):
        raise KeyError("a bug of the watcher's")

    def fails_after_agreeing(step):
        ranks.meetings += 1  # the step's agreement ran in this call: the next one is owed
        raise KeyError("a bug of the watcher's")

    assert failsafe.shielded(fails_after_agreeing, meeting=ranks.meet)(4) is None
    assert failsafe.failure().startswith("KeyError") and ranks.met == []
    failsafe.shielded(fails_before_agreeing, meeting=ranks.meet)(5)  # stood aside: the meeting in its place
    assert ranks.met == [(5,)]
    monkeypatch.setattr(failsafe, "_failure", [])
    failsafe.shielded(fails_before_agreeing, meeting=ranks.meet)(6)  # failed before agreeing: met at once
    assert ranks.met == [(5,), (6,)]


def test_a_rank_told_that_another_failed_stands_aside_saying_which(capsys):
    def told():
        failsafe.told('KeyError: "a bug" at stabilizer_sentinel/x.py:1 (on rank 1)')
        raise failsafe.StoodAside

    assert failsafe.shielded(told)() is None
    assert failsafe.failure() == 'KeyError: "a bug" at stabilizer_sentinel/x.py:1 (on rank 1)'
    assert "every rank stands aside" in capsys.readouterr().err


def test_a_rate_a_rollback_scaled_for_the_step_under_way_is_the_scripts_again_when_the_watcher_stands_aside(
        tmp_path, monkeypatch):
    # A closure's step: the rate is scaled before the closure's forward pass, where the watcher's forward hook fails;
    # the step's post-hook then returns at once, and the script's rate was left times the factor for good.
    monkeypatch.setattr(input_blind.InputBlind, "observe", fails_at(3)(input_blind.InputBlind.observe))
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = watch(model, optimizer, environ=job_env(tmp_path, {"recovery": "in_job"}))
    guard.recovery.factor = 0.25  # as a rollback leaves it
    inputs, labels = torch.randn(64, 6), torch.randint(0, 3, (64,))

    def closure():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        return loss

    for _ in range(6):
        optimizer.step(closure)
    guard.close()
    assert failsafe.failure() is not None
    assert optimizer.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("ending", [SystemExit(86), KeyboardInterrupt()])
def test_a_stop_and_an_interrupt_are_not_caught(ending):
    def end():
        raise ending

    with pytest.raises(type(ending)):
        failsafe.shielded(end)()
    assert failsafe.failure() is None


@pytest.mark.slow
def test_a_script_under_the_launcher_whose_watcher_fails_exits_and_prints_as_unwatched(tmp_path):
    # The bug is put into the watcher by a module the script imports first (the launcher runs the script in an
    # interpreter of its own); unwatched, the same import changes nothing.
    (tmp_path / "inject_bug.py").write_text(textwrap.dedent("""
        from stabilizer_sentinel.detection.learning_check import LearningCheck
        original = LearningCheck.observe
        def observe(self, step, *args, **kwargs):
            if step == 12:
                raise KeyError("a bug of the watcher's")
            return original(self, step, *args, **kwargs)
        LearningCheck.observe = observe
    """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import inject_bug
        import torch
        from torch import nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        inputs, labels = torch.randn(64, 6), torch.randint(0, 3, (64,))
        for step in range(40):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            print(f"step {step} loss={loss.item():.6f}")
    """))
    env = job_env(tmp_path / "job", {"recovery": "in_job"})
    plain = run(["train.py"], tmp_path, env)
    watched = run(["-m", "stabilizer_sentinel.launch", "train.py"], tmp_path, env)
    assert (watched.returncode, watched.stdout) == (plain.returncode, plain.stdout) and plain.returncode == 0
    said = [line for line in watched.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and "KeyError" in said[0] and "stands aside" in said[0], watched.stderr
    assert summary(tmp_path / "job")["watching_failed"].startswith("KeyError")
