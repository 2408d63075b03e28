"""Whether the ranks step together (stabilizer_sentinel.loops.distributed: ``replica``, ``step_together``), decided
through a store as the process group's, by threads standing for the ranks."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from stabilizer_sentinel.loops import distributed


def _stepped(seed: int = 0, lr: float = 0.1, data: int = 0, sparse: bool = False) -> tuple[nn.Module, torch.optim.SGD]:
    """A network at its first check: its gradients computed, its update not yet applied."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Embedding(8, 4, sparse=sparse), nn.Flatten(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    tokens = torch.randint(8, (5, 2), generator=torch.Generator().manual_seed(data))
    net(tokens).pow(2).mean().backward()
    return net, optimizer


def _replica(net: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    return distributed.replica(net.parameters(), optimizer.param_groups)


def test_ranks_that_train_one_network_alike_share_a_replica_and_a_sweeps_ranks_do_not():
    one = _replica(*_stepped())
    assert one == _replica(*_stepped())  # DDP's ranks: the same weights, gradients averaged, the same settings
    assert one != _replica(*_stepped(seed=1))  # a sweep over seeds
    assert one != _replica(*_stepped(lr=0.2))  # ... over rates, from the same weights and batches
    assert one != _replica(*_stepped(data=1))  # ... over folds: the same weights and settings, other batches
    sparse = _replica(*_stepped(sparse=True))  # a sparse gradient is read by its values
    assert sparse == _replica(*_stepped(sparse=True)) and sparse != _replica(*_stepped(sparse=True, seed=1))


@pytest.fixture
def store(monkeypatch):
    """A store standing for the process group's, as ``step_together`` reads it."""
    shared = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: shared)
    return shared


def _meet(replicas: dict[int, str], world_size: int) -> dict[int, str]:
    decided: dict[int, str] = {}

    def arrive(rank: int) -> None:
        decided[rank] = distributed.step_together(world_size, rank, replicas[rank])

    threads = [threading.Thread(target=arrive, args=(rank,)) for rank in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return decided


@pytest.mark.parametrize(("replicas", "decision"), [
    ({0: "a", 1: "a"}, distributed.TOGETHER),
    ({0: "a", 1: "b"}, distributed.DIFFERENT),  # stop 74: a sweep under torchrun hung at the first rank's end
])
def test_ranks_that_all_arrive_step_together_only_with_one_replica(store, replicas, decision):
    assert _meet(replicas, 2) == {0: decision, 1: decision}
    assert distributed.step_together(2, 1, "c") == decision  # a later guard: the decision stands


def test_a_rank_that_waits_in_vain_for_the_others_decides_apart_for_every_rank(store, monkeypatch):
    monkeypatch.setattr(distributed, "MEET_SECONDS", 0.1)
    assert _meet({0: "a"}, 2) == {0: distributed.APART}  # rank 1 trains elsewhere (stop 73)
    assert distributed.step_together(2, 1, "a") == distributed.APART


def test_a_meeting_at_an_optimizer_that_takes_over_is_decided_afresh(store, monkeypatch):
    # Stop 74: rank 0 alone fine-tuned a head after the ranks trained together; its optimizer took over the run's
    # steps, and those steps waited in the agreement for a rank at its final barrier.
    monkeypatch.setattr(distributed, "MEET_SECONDS", 0.1)
    assert _meet({0: "a", 1: "a"}, 2) == {0: distributed.TOGETHER, 1: distributed.TOGETHER}
    assert distributed.step_together(2, 0, "b", distributed.next_meeting()) == distributed.APART
