"""At the interpreter's exit the guard closes, and in a distributed run collects garbage while the interpreter is
whole (guard._close_at_exit; docs/library.md, "DDP": gloo aborts a rank whose collectives the teardown frees)."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from stabilizer_sentinel import watch
from stabilizer_sentinel.integration import guard as guard_module


class _Closing:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("distributed", [True, False])
def test_the_guard_closes_at_exit_and_a_distributed_run_then_collects_its_garbage(monkeypatch, distributed):
    events: list[str] = []
    watched = _Closing()
    monkeypatch.setattr(watched, "close", lambda: events.append("closed"))
    monkeypatch.setattr(guard_module.gc, "collect", lambda *args: events.append("collected") or 0)
    guard_module._close_at_exit(weakref.ref(watched), distributed)
    assert events == (["closed", "collected"] if distributed else ["closed"])


def test_a_distributed_run_whose_guard_is_gone_still_collects_at_exit(monkeypatch):
    collected: list[int] = []
    monkeypatch.setattr(guard_module.gc, "collect", lambda *args: collected.append(1) or 0)
    gone = _Closing()
    reference = weakref.ref(gone)
    del gone
    guard_module._close_at_exit(reference, True)
    assert collected == [1]


@pytest.mark.parametrize(("world", "distributed"), [("2", True), ("1", False)])
def test_watch_registers_the_exit_handler_with_whether_the_run_has_several_ranks(tmp_path, monkeypatch, world,
                                                                                  distributed):
    registered: list[tuple] = []
    monkeypatch.setattr(guard_module.atexit, "register", lambda function, *args: registered.append((function, args)))
    monkeypatch.setenv("WORLD_SIZE", world)  # torchrun's, read while no process group is up
    monkeypatch.setenv("RANK", "1" if distributed else "0")
    model = nn.Linear(2, 1)
    env = {"STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}
    watched = watch(model, torch.optim.SGD(model.parameters(), lr=0.1), environ=env)
    try:
        handlers = [(args[0](), args[1]) for function, args in registered if function is guard_module._close_at_exit]
        assert handlers == [(watched, distributed)]
    finally:
        watched.discard()
