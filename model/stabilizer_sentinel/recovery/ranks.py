"""In-job recovery under DDP: every rank rolls back together, to rank 0's state, at rank 0's rate.

Rank 0 keeps the copies and decides (stabilizer_sentinel.recovery.recovery.Recovery); every other rank
follows (``Follower``). Under DDP the ranks hold the same weights and optimizer state (the gradients
are all-reduced), so rank 0's state is every rank's.

Nothing more is exchanged at a healthy step: the guard's agreement of each step
(stabilizer_sentinel.loops.distributed.agree) carries two flags more, a rank left a finding rank 0 can
answer in the job to rank 0 (``Follower.pending``, gathered only then), and rank 0 has a rollback under
way. At the end of each step of a rollback rank 0 tells every rank what it did (``Ranks.lead``, ``Ranks.follow``):
a header (what it did, the factor in force, the first step that is still the run's, whether the rollback
is still under way: then the next step's end is exchanged too) and, when it put a
state back, that state: the model's tensors broadcast in place, then the optimizer's state, the
checks' state and the loss scaler's as one object. When rank 0 finds no rate that trains, every
rank stops with it.

This module decides nothing about the run; it carries rank 0's decisions to the other ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from stabilizer_sentinel.recovery import averages
from stabilizer_sentinel.recovery.recovery import RECOVERABLE, RateFactor
from stabilizer_sentinel.recovery.rewind import entries_of, load_optimizer_state, load_other, state_on_host

NOTHING, LOADED, STOPPED = 0, 1, 2


def _device() -> torch.device:
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Ranks:
    """One rank's side of the exchange at the end of each step of a rollback (``guard``: its Guard)."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        # A rollback is under way: exchange at this step's end (the step's agreement or the last exchange said so).
        self.due = False

    def lead(self, *, loaded: bool, stop: dict[str, Any] | None = None) -> None:
        """Rank 0, at the end of a step of a rollback: tell every rank what it did."""
        if not self.due:
            return
        dist, guard, recovery = torch.distributed, self.guard, self.guard.recovery
        # Under way after this step too: every rank exchanges at the next step's end, checked or not (a
        # step a loss scaler skipped is counted without a check, on every rank alike).
        self.due = recovery.probing and stop is None
        kind = STOPPED if stop is not None else LOADED if loaded else NOTHING
        ceiling = -1.0 if recovery.ceiling is None else recovery.ceiling
        header = torch.tensor([kind, recovery.factor, recovery.live_from, int(self.due), ceiling],
                              dtype=torch.float64, device=_device())
        dist.broadcast(header, 0)
        if kind == LOADED:
            for name, tensor in guard.model.state_dict().items():
                if name not in guard.rewind.apart:  # another optimizer's: sent with its part, below
                    dist.broadcast(tensor, 0)
            state = [state_on_host(guard.optimizer.state_dict()), guard.sentinel.shared_checks_state(),
                     guard.rewind.due_others,  # the other optimizers' part: put back at their own next step
                     guard.scaler_watch.put_back_due,  # the loss scaler's, as rank 0 puts it back
                     [state_on_host(inner.state_dict()) for inner in guard.rewind.inner]]  # with the first's
            dist.broadcast_object_list(state, 0)
        elif kind == STOPPED:
            dist.broadcast_object_list([stop], 0)

    def follow(self) -> None:
        """Any other rank, at the end of a step of a rollback: do what rank 0 did."""
        if not self.due:
            return
        dist, guard, recovery = torch.distributed, self.guard, self.guard.recovery
        header = torch.zeros(5, dtype=torch.float64, device=_device())
        dist.broadcast(header, 0)
        kind, factor, live_from, under_way, ceiling = header.tolist()
        recovery.factor, recovery.live_from, self.due = factor, int(live_from), bool(under_way)
        recovery.covered = frozenset(id(optimizer) for _, optimizer in recovery.others)  # as rank 0's rollback holds
        recovery.ceiling = None if ceiling < 0 else ceiling
        if kind == LOADED:
            for name, tensor in guard.model.state_dict().items():  # detached views of the parameters: in place
                if name not in recovery.apart:
                    dist.broadcast(tensor, 0)
            state: list[Any] = [None, None, None, None, None]
            dist.broadcast_object_list(state, 0)
            optimizer, checks, recovery.due, scaler, inner = state
            load_optimizer_state(guard.optimizer, optimizer)
            for nested, nested_state in zip(recovery.inner, inner, strict=False):
                load_optimizer_state(nested, nested_state)
            guard.scaler_watch.put_back(scaler)  # at its update(), as rank 0 does
            guard.sentinel.load_shared_checks_state(checks)
            guard.undone_before(recovery.live_from)
        if kind != STOPPED and not self.due:  # the rollback went on: this rank's averaged copies restart too
            averages.restart(guard.model, guard.optimizer, recovery.others, recovery.inner)
        if kind == STOPPED:
            finding: list[Any] = [None]
            dist.broadcast_object_list(finding, 0)
            guard.give_up_rollback(finding[0], together=True)


class Follower(RateFactor):
    """In-job recovery on a DDP rank other than 0: what rank 0 can answer in the job is left to it, and
    this rank does as rank 0 did (``Ranks``)."""

    probing = False

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.factor = 1.0
        self._saved: list[Any] = []
        self.live_from = -1
        self.pending: list[dict[str, Any]] = []  # this step's findings for rank 0 to answer
        self.ranks = Ranks(guard)
        # Other optimizers (a GAN's second) with their networks, and their part of the state rank 0 put
        # back, loaded at each one's next step as rank 0 does (stabilizer_sentinel.recovery.rewind.Rewind.load_other).
        self.others: list[tuple[Any, torch.optim.Optimizer]] = []
        self.due: dict[int, Any] = {}
        self.apart: set[str] = set()  # the model's entries that are theirs (Rewind.apart)
        self.inner: list[torch.optim.Optimizer] = []  # stepped inside the first one's step (Rewind.inner)

    def add_other(self, network: Any, optimizer: torch.optim.Optimizer) -> None:
        self.others.append((network, optimizer))
        self.apart |= entries_of(self.guard.model, optimizer)

    def add_inner(self, optimizer: torch.optim.Optimizer) -> None:
        self.inner.append(optimizer)

    def put_back_other(self, optimizer: torch.optim.Optimizer) -> bool:
        return load_other(self.others, self.due, optimizer)

    def intercept(self, entries: list[dict[str, Any]]) -> bool:
        """Findings of a step: True when they are rank 0's to answer (not recorded here, no stop)."""
        stops = [entry for entry in entries if entry.get("action") == "stop"]
        if not stops:
            return False
        if all(entry["step"] < self.live_from for entry in stops):
            return True  # about a step a rollback undid
        if all(entry["rule"] in RECOVERABLE for entry in stops):
            self.pending.extend(stops)
            return True
        return False

    def observed(self, loss: float | None) -> None:
        """Rank 0 judges the probes on its own losses."""

    def after_step(self) -> None:
        self.ranks.follow()

    def close(self, cause: str = "the run ended") -> None:
        """Rank 0 records a rollback the run's end (``cause``) interrupted."""
