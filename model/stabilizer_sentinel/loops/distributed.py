"""DDP for the guard: this process's rank, and agreeing on a stop so that all ranks leave at one step.

One 4-integer all-reduce per step tells every rank whether any rank found something or must stop (and,
with in-job recovery, whether a rollback is under way or a rank left rank 0 a finding);
the findings themselves are gathered only at a step where one fired. This module must not decide
anything about a finding.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from stabilizer_sentinel import failsafe

# How long a rank's first check waits for every other rank's (``step_together``): ranks that step together reach
# theirs within one step of each other (DDP's backward pass waits for every rank's).
MEET_SECONDS = 30.0
POLL_SECONDS = 0.02
MEETING = "stabilizer/first_check"  # the keys in the process group's store
_MEETINGS = itertools.count(1)  # this process's meetings after the first (``next_meeting``)


def rank_and_size() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else torchrun's environment."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def uneven(held: list[Any]) -> bool:
    """Whether the ranks may step unevenly: the script handed one of ``held`` (its DDP wrapper, its optimizer) to
    torch's ``Join`` (``torch.distributed.algorithms.join``, uneven inputs). A rank whose batches ran out steps no
    more there, and shadows only the collectives ``Join`` knows of: it would never meet the others in ``agree``.
    ``Join`` enables its joinables' configuration when it is built and leaves it so."""
    return any(getattr(getattr(obj, "_join_config", None), "enable", False) for obj in held if obj is not None)


TOGETHER, APART, DIFFERENT = "together", "apart", "different"  # ``step_together``'s decisions
# How far two ranks' norms of one parameter may differ, relatively, and still be one network's: the last bits of a
# float32's norm are the order its elements were summed in (another device, another thread count), not the network.
CLOSE = 1e-4


def replica(parameters: Iterable[torch.Tensor], groups: Iterable[dict[str, Any]] = (), *,
            gradients: bool = True) -> str:
    """What ranks that train one network alike share at their first check, before its update: the parameters'
    shapes and dtypes, each one's norm and its gradient's (DDP averaged them on every rank; so does a loop that
    averages them by hand), and the optimizer's settings (numbers, tuples of them, one-element tensors). Ranks that
    each train a network of their own (a sweep: another seed, rate or fold on each) differ in one of them.
    Without ``gradients`` (a loop updated by hand, checked as its backward pass ends, before DDP averaged them):
    the parameters alone. The norms are read in the parameters' own dtype (no copy; a one-byte float's in
    float32), compared within ``CLOSE`` (``same``); one host read for them all, once per meeting. Written as the
    hash of what is compared exactly, then the norms."""
    tensors = list(parameters)
    grads = [t.grad for t in tensors] if gradients else []
    try:
        with torch.no_grad():
            norms = [n for n in (_norm(t) for t in [*tensors, *(g for g in grads if g is not None)]) if n is not None]
            read = torch.stack([n.to(norms[0].device) for n in norms]).tolist() if norms else []
    except (RuntimeError, TypeError, NotImplementedError):  # a tensor no norm reads: no rank is matched with it
        return f"unreadable on this rank: {os.getpid()}"
    settings = [(key, _setting(value)) for group in groups for key, value in sorted(group.items()) if key != "params"]
    exact = repr(([(tuple(t.shape), str(t.dtype)) for t in tensors], [g is None for g in grads],
                  [(key, value) for key, value in settings if value is not None]))
    return hashlib.sha256(exact.encode()).hexdigest() + "|" + ",".join(f"{x:.9g}" for x in read)


def same(replicas: Iterable[str]) -> bool:
    """Whether every rank's ``replica`` is one network's: the same hash, and each norm within ``CLOSE`` of the
    first rank's."""
    parts = [replica.split("|", 1) for replica in replicas]
    if any(len(part) != 2 for part in parts) or len({part[0] for part in parts}) != 1:
        return False
    columns = [[float(x) for x in part[1].split(",")] if part[1] else [] for part in parts]
    return all(len(values) == len(columns[0]) and all(_close(x, y) for x, y in zip(values, columns[0], strict=True))
               for values in columns)


def _close(x: float, y: float) -> bool:
    """Two ranks' norms of one tensor, one network's: within ``CLOSE``, or both infinite alike, or both NaN (a
    non-finite gradient DDP averaged onto every rank at the first step is still one network's)."""
    return x == y or (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=CLOSE)


def _setting(value: Any) -> Any:
    """An optimizer setting as the ranks compare it: a number, a string, a tuple of numbers (Adam's betas), a
    one-element tensor's number; None for anything else."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple) and all(isinstance(v, bool | int | float) for v in value):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().float())
    return None


def next_meeting() -> str:
    """The keys of this process's next meeting after the first (``step_together``'s ``meeting``), numbered in the
    process, not the guard: ranks that meet alike count alike, whatever guards they built."""
    return f"{MEETING}/again/{next(_MEETINGS)}"


def _norm(tensor: torch.Tensor) -> torch.Tensor | None:
    """A tensor's norm in its own dtype, as one float (a sparse gradient's of its values, a one-byte float's in
    float32, where no norm is defined); None for a tensor of integers or booleans (its shape and dtype alone are
    compared)."""
    tensor = tensor.detach()
    if tensor.is_sparse:
        tensor = tensor.coalesce().values()
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return None
    if tensor.element_size() == 1:
        tensor = tensor.float()
    return torch.linalg.vector_norm(tensor).float()


def step_together(world_size: int, rank: int = 0, mine: str = "", meeting: str = MEETING) -> str:
    """Whether the ranks step together, decided once for every rank at its first check: ``TOGETHER`` when every
    rank reached its first check within ``MEET_SECONDS`` of the first with the same ``replica`` (``mine``);
    ``APART`` when they did not all arrive in time (a rank that trains alone while the others wait elsewhere:
    rank 0 pre-training a network before it builds DDP, the others at a barrier), for every rank and every one
    that comes later; ``DIFFERENT`` when they arrived with different replicas (each rank trains a network of its
    own: a sweep under torchrun, whose ranks stop at steps of their own). Through the process group's store (no
    collective, which a rank that never steps would leave waiting): each rank writes its replica, the last rank
    to arrive reads them all and writes the decision, or the first to tire of waiting does, once
    (``compare_set``). Stop 73's hunt: rank 0's steps before DDP waited in the per-step agreement for a rank that
    never stepped, and the job hung (16-26 s unwatched); stop 74's: a sweep, one network per rank for steps of its
    own, hung at the first rank's end (24 s unwatched). ``meeting`` names the keys: the ranks meet again at each
    optimizer that takes over the run's steps (``Guard._meet_again``). Where the store cannot be read:
    ``TOGETHER``, as before."""
    try:
        store = torch.distributed.distributed_c10d._get_default_store()
        decision = f"{meeting}/decision"
        store.set(f"{meeting}/replica/{rank}", mine)
        if store.add(f"{meeting}/arrived", 1) >= world_size:
            replicas = [bytes(store.get(f"{meeting}/replica/{other}")).decode() for other in range(world_size)]
            return bytes(store.compare_set(decision, "", TOGETHER if same(replicas) else DIFFERENT)).decode()
        deadline = time.monotonic() + MEET_SECONDS
        while not store.check([decision]):  # polled: a store's wait that times out has torch print two lines
            if time.monotonic() > deadline:  # no decision in time: this rank decides apart
                return bytes(store.compare_set(decision, "", APART)).decode()
            time.sleep(POLL_SECONDS)
        return bytes(store.get(decision)).decode()
    except (AttributeError, RuntimeError, torch.distributed.DistError):
        return TOGETHER


def agree(guard: Any, verdict: Any, stop: bool) -> bool:
    """Whether any rank must stop; rank 0 adopts the findings of the others (gathered only when one fired).

    With in-job recovery (stabilizer_sentinel.recovery.ranks) two flags more: a rank left findings to
    rank 0 (gathered, and rank 0 answers them: a rollback, or a stop it tells every rank), and a
    rollback is under way on rank 0 (every rank then exchanges with it at the step's end).
    """
    dist = torch.distributed
    device = _device()
    recovery = guard.recovery
    ranks = getattr(recovery, "ranks", None)
    pending = getattr(recovery, "pending", [])
    leading = ranks is not None and guard.primary and recovery.probing
    flags = torch.tensor([int(bool(verdict.findings)), int(stop), int(bool(pending)), int(leading), 0],
                         dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    found, stop_any, pending_any, leading, aside = (bool(v) for v in flags.tolist())
    if aside:
        _told(guard)
    if pending_any:
        leading, stop_any = _answer(guard, pending, leading, stop_any, device)
    if ranks is not None:
        ranks.due = leading and not stop_any
    if found:
        gathered: list[Any] = [None] * guard.world_size
        dist.all_gather_object(gathered, [dict(entry, rank=guard.rank) for entry in verdict.findings])
        others = [entry for rank, entries in enumerate(gathered) if rank != guard.rank for entry in entries]
        everyone = [entry for entries in gathered for entry in entries]
        if guard.primary:
            meant = [entry["step"] for entry in others if not entry.get("told")]  # not a finding the script meant
            if guard.rewind is not None and meant:  # another rank's finding: keep the state before it
                guard.rewind.persist(before_step=min(meant))
            guard.sentinel.adopt(others)
        elif guard.sentinel.stop_finding is None and everyone and guard.sentinel.action == "stop":
            guard.sentinel.stop_finding = everyone[0]
    return stop_any


def _answer(guard: Any, pending: list[dict[str, Any]], leading: bool, stop: bool, device: Any) -> tuple[bool, bool]:
    """Rank 0 answers the findings other ranks left to it: a rollback (or a probe that failed), else a stop."""
    dist = torch.distributed
    gathered: list[Any] = [None] * guard.world_size
    dist.all_gather_object(gathered, [dict(entry, rank=guard.rank) for entry in pending])
    pending.clear()
    decision = torch.tensor([int(leading), int(stop)], dtype=torch.int32, device=device)
    if guard.primary:
        entries = [entry for entries in gathered for entry in entries]
        if guard.recovery.intercept(entries):
            decision[0] = int(guard.recovery.probing)
        else:
            if guard.rewind is not None:
                guard.rewind.persist(before_step=min(entry["step"] for entry in entries))
            guard.sentinel.adopt(entries)
            decision[1] = 1
    dist.broadcast(decision, 0)
    answered_leading, answered_stop = (bool(v) for v in decision.tolist())
    return leading or answered_leading, stop or answered_stop


def leave(what: str) -> None:
    """This rank's watcher failed (``what``): meet the others in the step's agreement, saying so (``agree``)."""
    dist = torch.distributed
    flags = torch.tensor([0, 0, 0, 0, 1], dtype=torch.int32, device=_device())
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    dist.all_gather_object([None] * dist.get_world_size(), what)


def _told(guard: Any) -> None:
    """The agreement said another rank's watcher failed: learn what failed, stand aside on this rank at this step
    too, and leave its check (``StoodAside``, which the shield swallows)."""
    gathered: list[Any] = [None] * guard.world_size
    torch.distributed.all_gather_object(gathered, None)
    what = "; ".join(f"{failed} (on rank {rank})" for rank, failed in enumerate(gathered) if failed)
    guard.told(what or "another rank's")
    raise failsafe.StoodAside(what)


def _device() -> torch.device:
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
