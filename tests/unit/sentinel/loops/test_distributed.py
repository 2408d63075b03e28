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


def _same(*pairs: tuple[nn.Module, torch.optim.Optimizer], gradients: bool = True) -> bool:
    return distributed.same(distributed.replica(net.parameters(), optimizer.param_groups, gradients=gradients)
                            for net, optimizer in pairs)


def test_the_ranks_replicas_are_compared_within_a_float32s_last_bits_and_by_what_they_hold():
    # The review of stop 74: a hash of norms rounded to six digits split norms one bit apart now and then.
    net, optimizer = _stepped()
    nudged, same_optimizer = _stepped()
    with torch.no_grad():
        first = next(nudged.parameters())
        first.mul_(1 + 2e-7)  # a float32's last bits, as another summation order leaves them
    assert _same((net, optimizer), (nudged, same_optimizer))
    with torch.no_grad():
        first.mul_(1.01)
    assert not _same((net, optimizer), (nudged, same_optimizer))
    # A non-finite gradient DDP averaged onto every rank at the first step: still one network.
    broken = [_stepped() for _ in range(2)]
    for each, _ in broken:
        next(each.parameters()).grad.fill_(float("nan"))
    assert _same(*broken)
    # Adam's betas are compared: a sweep over them from the same weights and batches is two networks.
    adam = [(net, torch.optim.Adam(net.parameters(), betas=betas)) for net, betas in
            ((_stepped()[0], (0.9, 0.999)), (_stepped()[0], (0.8, 0.999)))]
    assert not _same(*adam) and _same(adam[0], adam[0])
    # Without gradients (a loop updated by hand, checked before DDP averaged them): the parameters alone.
    other_batches = _stepped(data=1)
    assert not _same((net, optimizer), other_batches) and _same((net, optimizer), other_batches, gradients=False)


def test_a_network_of_one_byte_floats_or_integers_is_compared_not_left_unreadable():
    # The review of stop 74: a norm of float8 or integer weights raised, and no two ranks ever matched.
    def network(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return [torch.randn(4, 4).to(torch.float8_e4m3fn), torch.randint(0, 9, (3,), dtype=torch.uint8)]

    replicas = [distributed.replica(network(seed)) for seed in (0, 0, 1)]
    assert not any(r.startswith("unreadable") for r in replicas)
    assert distributed.same(replicas[:2]) and not distributed.same(replicas[1:])


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
    ({0: "h|1.5,2", 1: "h|1.5,2"}, distributed.TOGETHER),
    ({0: "h|1.5,2", 1: "h|1.5,3"}, distributed.DIFFERENT),  # stop 74: a sweep hung at the first rank's end
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
    assert _meet({0: "h|1", 1: "h|1"}, 2) == {0: distributed.TOGETHER, 1: distributed.TOGETHER}
    assert distributed.step_together(2, 0, "b", distributed.next_meeting()) == distributed.APART
