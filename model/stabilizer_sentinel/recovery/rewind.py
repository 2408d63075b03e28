"""Rewind: keep the last healthy training state in memory, persist it when a rule fires.

Periodic checkpoints are sparse (every 50 steps by default) because each one is written to disk
and synced to S3. An explosion between two of them would send a relaunch back tens of steps, or
to step 0 when it came before the first. ``Rewind`` copies the model and optimizer state to CPU
memory every ``every`` steps (a few milliseconds for a ResNet-20, measured by
``python -m stabilizer.bench.overhead``), keeps only the newest ``keep`` copies (bounded memory:
``keep`` x (weights + optimizer state)), and when the sentinel reports a finding at step S it
writes the copies taken before S as ordinary checkpoints
(``stabilizer_contract.checkpoints.checkpoint_name``) into the checkpoint directory, which SageMaker
syncs to S3. The monitor lists them like any checkpoint, so a remedy that keeps the architecture
resumes a few steps before the explosion (from the newest; the older one is there for a policy
that finds the newest already too close: a run that explodes again at the same step from it).

Why "before S" and two copies: the state at S is the one whose gradient was not finite; resuming
there replays the same batch on the same weights and fails the same way. With copies every
``every`` steps, the newest one strictly before S is 1 to ``2 * every`` steps old.

Once it has persisted, it takes no more copies: after a finding the state is no longer known to
be healthy (with the ``notify`` action the job goes on training).

The library wires it: ``watch(model, optimizer)`` (stabilizer_sentinel.integration.guard) builds one on rank 0 with
``rewind_every`` and ``rewind_keep`` (5 and 2; ``rewind_every=0`` builds none), exposes it as
``guard.rewind``, hands it to the sentinel (``sentinel.rewind``, which persists it at the first
finding, and the guard does for a finding of another DDP rank) and calls ``after_step`` with the
next step from its optimizer post-hook; the optimizer state it copies carries the guard's step
count. ``guard.restore()`` is the other half: a relaunch loads the newest checkpoint back. A loop
without the guard wires it the same way by hand::

    rewind = Rewind(model, optimizer, checkpoint_dir=checkpoint_dir, extra={"config": config})
    sentinel.rewind = rewind            # the sentinel persists it when a rule fires
    ...
    optimizer.step(); step += 1
    rewind.after_step(step)             # step = the next step to run, as in checkpoint names

``extra`` goes into every checkpoint it writes (model/train.py passes its config through
``guard.restores_checkpoints(extra=...)``; its own resume reads it for the architecture check).

This module must not decide anything about the run; it keeps and writes state.
"""

from __future__ import annotations

import copy
import gc
import math
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from stabilizer_contract.checkpoints import checkpoint_name
from stabilizer_sentinel.loops import distributed
from stabilizer_sentinel.loops.optimizer_hooks import LEARNING_KEY, STATE_KEY
from stabilizer_sentinel.recovery.averages import shapes
from stabilizer_sentinel.say import say

GUARD_KEYS = (STATE_KEY, LEARNING_KEY)


def state_on_host(value: Any, devices: set[torch.device] | None = None) -> Any:
    """A deep copy of a (nested) state dict with every tensor copied to CPU memory.

    With ``devices``, a CUDA tensor is copied without waiting for it: into pinned memory, in its stream's
    order (the optimizer's next update of it comes after), its device added to ``devices``; the copies may
    be read once that stream has done them (``copied_on``, ``Snapshot.settle``). Waiting for each tensor
    drains the device's queue once per tensor: on a GPT of 23 M parameters on an H200, 203 ms a copy, where
    the same state copied into pinned memory without waiting took 5.5 ms, drain included
    (``python -m stabilizer.bench.device``)."""
    if isinstance(value, torch.Tensor):
        if devices is not None and value.is_cuda:
            devices.add(value.device)
            return value.detach().to("cpu", non_blocking=True)
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: state_on_host(item, devices) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(state_on_host(item, devices) for item in value)
    return value


def copied_on(devices: set[torch.device]) -> tuple[Any, ...]:
    """Events marking, on each device's current stream, the end of the copies ``state_on_host`` queued there."""
    events = []
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return tuple(events)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_nbytes(item) for item in value)
    return 0


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load ``state`` (an optimizer's ``state_dict()``, the guard's keys left out) into ``optimizer``.

    The groups stay the script's own, as they are: the same dicts, whose settings (lr, momentum, ...) are
    the script's schedule now. ``load_state_dict`` alone puts new dicts with the copy's settings in their
    place, and a script that holds a group to write its rate into (``group = optimizer.param_groups[0]``),
    or an optimizer that shares its groups with one it steps (SAM's, Lookahead's base), would write into
    dicts no step reads any more.
    """
    groups, own = optimizer.param_groups, list(optimizer.param_groups)
    optimizer.load_state_dict({key: value for key, value in state.items() if key not in GUARD_KEYS})
    groups[:] = own
    optimizer.param_groups = groups


def _other_state(network: nn.Module | None, optimizer: torch.optim.Optimizer,
                 devices: set[torch.device] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    return (({} if network is None else state_on_host(network.state_dict(), devices)),
            state_on_host(optimizer.state_dict(), devices))


def entries_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> set[str]:
    """The names of ``model``'s parameters that ``optimizer`` updates."""
    updated = {id(param) for group in optimizer.param_groups for param in group["params"]}
    return {name for name, param in model.named_parameters() if id(param) in updated}


def loose_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors ``optimizer`` updates that ``model`` does not hold, in the optimizer's order: a head, an
    encoder or a loss's own parameters kept as a module of their own beside the network, with one optimizer
    over both (``SGD([*encoder.parameters(), *head.parameters()])``)."""
    held = {id(param) for param in model.parameters()}
    seen: set[int] = set()
    loose = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in held and id(param) not in seen:
                seen.add(id(param))
                loose.append(param)
    return loose


def shadows_of(model: nn.Module, optimizer: torch.optim.Optimizer,
               others: list[tuple[nn.Module | None, torch.optim.Optimizer]],
               inner: list[torch.optim.Optimizer]) -> list[nn.Module]:
    """The networks the script keeps beside ``model`` (or beside another network held, ``others``) of its very
    parameter shapes, in order, none of whose parameters ``model`` holds or an optimizer held trains: a DQN's target
    network (copied from the online one every so many steps, its targets computed from it), a hand-written EMA or
    momentum encoder. Their weights are part of the training state: a rollback that put the online network back
    hundreds of steps and left the target network where the run-up took it had every probe chase targets of that
    state (stop 72, a DQN whose rate the script raised at step 1000: stopped, where a relaunch builds the target
    network afresh). A frozen teacher of the same shapes is put back as it was: unchanged. ``AveragedModel``s restart
    instead (stabilizer_sentinel.recovery.averages). Found by a scan of the objects the garbage collector tracks."""
    networks = [model, *(network for network, _ in others if network is not None)]
    optimizers = [optimizer, *(other for _, other in others), *inner]
    held = {id(param) for network in networks for param in network.parameters()}
    held |= {id(param) for o in optimizers for group in o.param_groups for param in group["params"]}
    known = {shapes(network.parameters()) for network in networks}
    known.discard(())
    found = []
    for candidate in gc.get_objects():
        # By the type itself: isinstance would read ``__class__``, which a dead weak proxy raises on.
        if not issubclass(type(candidate), nn.Module) or issubclass(type(candidate), AveragedModel) \
                or any(candidate is network for network in networks):
            continue
        try:
            params = list(candidate.parameters())
            if params and not any(id(param) in held for param in params) and shapes(params) in known:
                found.append(candidate)
        except (AttributeError, RuntimeError, TypeError):  # a module half built, or one of odd making: not one
            continue
    inside = {id(module) for network in found for module in network.modules() if module is not network}
    return [network for network in found if id(network) not in inside]


def load_other(others: list[tuple[nn.Module | None, torch.optim.Optimizer]],
               due: dict[int, tuple[dict[str, Any], dict[str, Any]]], optimizer: torch.optim.Optimizer) -> bool:
    """Put ``due``'s part for ``optimizer`` (by its position in ``others``) back into it and its network,
    and forget it; False when nothing is due for it."""
    index = next((i for i, (_, other) in enumerate(others) if other is optimizer), None)
    if index is None or index not in due:
        return False
    network_state, optimizer_state = due.pop(index)
    network = others[index][0]
    if network is not None:
        network.load_state_dict(network_state)
    load_optimizer_state(optimizer, state_on_host(optimizer_state))
    return True


@dataclass(frozen=True)
class Snapshot:
    next_step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    checks: Any = None  # the companion's state (the sentinel's checks), for an in-job rollback
    # How good it is, when known: the mean loss of the steps just before it; for the first copy, the loss of
    # the step taken from it (Rewind.measured).
    level: float | None = None
    # The other optimizers' (a GAN's second), in ``Rewind.others``' order: (their network's state, or {}
    # when the model holds their parameters; their state). Not written into checkpoints.
    others: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    # The loss scaler's (``GradScaler.state_dict()``: its scale and count of steps since it last backed off),
    # when one steps the optimizer: as its update() after the copy left it (filled then; empty until).
    # Not written into checkpoints: a relaunch calibrates a new one.
    scaler: dict[str, Any] | None = None
    # The loss of the step taken from it, once known (Rewind.measured): one step, on its very weights.
    own: float | None = None
    # The optimizers the first one steps inside its own step (``Rewind.inner``: SAM's, Lookahead's base),
    # their state in that order; put back with the first one's. Not written into checkpoints.
    inner: list[dict[str, Any]] = field(default_factory=list)
    # Events that mark the end of its copies from CUDA memory, queued without waiting (``state_on_host``):
    # its tensors are read only after ``settle()``.
    copied: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    # The values of the optimizer's tensors that the model does not hold (``Rewind.loose``), in that order.
    # Not written into checkpoints: a checkpoint is the network's.
    loose: list[torch.Tensor] = field(default_factory=list)
    # The states of the networks the loop keeps beside the trained one (``Rewind.shadows``), in that order ({} for
    # one gone). Not written into checkpoints: the script builds them again when it starts.
    shadows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return (_nbytes(self.model) + _nbytes(self.optimizer) + _nbytes(self.others) + _nbytes(self.inner)
                + _nbytes(self.loose) + _nbytes(self.shadows))

    def settle(self) -> Snapshot:
        """Wait until its copies from CUDA memory are done (at once where none is pending); returns itself."""
        for event in self.copied:
            event.synchronize()
        return self


class Rewind:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        checkpoint_dir: str | Path,
        every: int = 5,
        keep: int = 2,
        extra: dict[str, Any] | None = None,
    ) -> None:
        if every < 1 or keep < 1:
            raise ValueError(f"rewind: every and keep must be >= 1, got every={every}, keep={keep}")
        self.model = model
        self.optimizer = optimizer
        self.checkpoint_dir = Path(checkpoint_dir)
        self.every = every
        self.extra = dict(extra or {})
        self.snapshots: deque[Snapshot] = deque(maxlen=keep)
        self.persisted: Path | None = None
        self.frozen = False
        self.seconds = 0.0  # time spent taking copies, and how many: for the overhead benchmark
        self.copies = 0
        # In-job recovery (stabilizer_sentinel.recovery.recovery): the sentinel, whose checks' state is kept beside each
        # copy and put back with it; then the first copy and the one with the lowest loss level (``anchor``)
        # are kept too, whatever ``keep`` says.
        self.companion: Any = None
        self.first: Snapshot | None = None
        self.anchor: Snapshot | None = None
        # False: the copies serve the rollback alone and are never written as checkpoints (a launcher-level
        # job whose relaunch would otherwise resume from them: it did not before in-job recovery kept copies).
        self.writes = True
        # Other optimizers of the run (a GAN's second), each with the network of its parameters that the
        # model does not hold (None when it holds them all): copied and put back with the model.
        self.others: list[tuple[nn.Module | None, torch.optim.Optimizer]] = []
        self._due: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # their part of the state loaded last
        # The optimizers the first one steps inside its own step, over its parameters (SAM's base, Lookahead's):
        # part of the first one, their state copied and put back with it (momentum a rollback must undo too).
        self.inner: list[torch.optim.Optimizer] = []
        # The model's entries that are another optimizer's parameters (a GAN's two networks in one
        # module): put back with that optimizer's part, at its step, never with the model's.
        self.apart: set[str] = set()
        # The optimizer's tensors the model does not hold (``loose_of``: a head beside an encoder, with one
        # optimizer), copied and put back with it: a rollback that restored the encoder alone left the head
        # with the run-up's weights, and no lower rate trained from there (stop 63). With the number of the
        # optimizer's groups they were read at: a group added since (``add_param_group``) is read again.
        self.loose = loose_of(model, optimizer)
        self._groups = len(optimizer.param_groups)
        # The loss scaler stepping the optimizer, if any, as the guard's ScalerWatch sees it
        # (``state_after_update``, ``put_back``). Its state goes with each copy and back with it: the
        # overflows of a run-up (and of a probe thrown up) halve the scale, which would otherwise stay low
        # for the rest of the run (a GradScaler grows it back only after 2,000 steps without one).
        self.scaling: Any = None
        # In-job recovery: the networks the loop keeps beside the trained one, of its very shapes and trained by no
        # optimizer held (``shadows_of``: a DQN's target network, a hand-written EMA); searched for at the first copy
        # of each series (None until then), in one process alone, copied and put back with it.
        self.shadows: list[weakref.ref[nn.Module]] | None = None

    def add_other(self, network: nn.Module | None, optimizer: torch.optim.Optimizer) -> None:
        """Copy and put back ``optimizer`` (and ``network``) too, from now on and in the copies held.

        Called before its first step (the launcher meets it there): its state now is its state when the
        copies held were taken, since only its own steps change it."""
        self.others.append((network, optimizer))
        self.apart |= entries_of(self.model, optimizer)
        now = _other_state(network, optimizer)
        for snapshot in self.kept():
            if len(snapshot.others) < len(self.others):
                snapshot.others.append(now)

    def held_other(self, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The state of another optimizer (and of its network) in the newest copy held: where no copy was taken
        since its first step, the state it began training from (``add_other``). None where none is held, or
        where a rollback's part for it is still to be put back."""
        index = next((i for i, (_, other) in enumerate(self.others) if other is optimizer), None)
        newest = self.snapshots[-1] if self.snapshots else None
        if index is None or newest is None or index >= len(newest.others) or index in self._due:
            return None
        return newest.others[index]

    def begin_from(self, state: tuple[dict[str, Any], dict[str, Any]], next_step: int, loss: float | None) -> bool:
        """Keep ``state`` (a network's and its optimizer's, ``held_other``) as the first copy, from which training
        went on at ``next_step`` to the loss ``loss``: the state a network trained before this rewind's guard
        attached began from (stabilizer_sentinel.integration.launcher_hooks, ``_new_phase``). The checks' state
        with it is theirs now, before they are told of the steps trained since. Not where it would not load into
        the network and the optimizer (its network's entries are not the model's, or the optimizer holds tensors
        the model does not) or a first copy is held already."""
        network, optimizer = state
        if self.frozen or self.first is not None or not network or self.loose:
            return False
        checks = self.companion.checks_state() if self.companion is not None else None
        measured = loss if loss is not None and math.isfinite(loss) else None
        snapshot = Snapshot(next_step, network, optimizer, checks, measured, own=measured)
        if not self.fits(snapshot):
            return False
        self.keep(snapshot)
        return True

    def add_inner(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy and put back ``optimizer``, stepped inside the first one's step, with the first one's state;
        the copies held get its state now (its first step is under way: nothing has changed it yet)."""
        self.inner.append(optimizer)
        now = state_on_host(optimizer.state_dict())
        for snapshot in self.kept():
            if len(snapshot.inner) < len(self.inner):
                snapshot.inner.append(now)

    def replace_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The script trains with ``optimizer`` from now on: the copies held carry the replaced one's state,
        which does not load into it, so they are let go; the next copy is the first of the new one's."""
        self.optimizer = optimizer
        self.inner = []  # the replaced one's
        self._let_go()

    def start_over(self, next_step: int) -> None:
        """The run starts over from the state now, from which training goes on at ``next_step`` (a rate range
        test ended: the script put its starting weights back, or trains on from the test's): the copies held
        are of the test's states, no restore point for the run's, and go; this state is the first copy."""
        if self.frozen:
            return
        self._let_go()
        snapshot = self.try_take(next_step)
        if snapshot is not None:
            self.keep(snapshot)

    def _let_go(self) -> None:
        """The copies held no longer load into the optimizer: let them go (the next is the first)."""
        self.loose = loose_of(self.model, self.optimizer)
        self._groups = len(self.optimizer.param_groups)
        self.snapshots.clear()
        self.first = self.anchor = None
        self.shadows = None

    def before_step(self, step: int) -> None:
        """Call before each optimizer step (before its check): when the optimizer has gained a group since the
        last step (``add_param_group``: a second phase's parameters, a backbone unfrozen), the copies held
        have fewer groups than it has and would not load into it (``load_state_dict`` refuses: a rollback
        after one crashed the script, stop 63), so they go, and the state this step starts from is copied:
        a rate that explodes the new group's first steps can be rolled back to it."""
        if self.frozen or len(self.optimizer.param_groups) == self._groups:
            return
        self._let_go()
        snapshot = self.try_take(step)
        if snapshot is not None:
            self.keep(snapshot)

    def after_step(self, next_step: int) -> None:
        """Call after each optimizer step; copies the state every ``every`` steps (``before_step`` at once,
        where the optimizer gained a group)."""
        if self.frozen:
            return
        changed = len(self.optimizer.param_groups) != self._groups  # a loop that calls no before_step
        if changed:
            self._let_go()
        if not changed and next_step % self.every:
            return
        snapshot = self.try_take(next_step)
        if snapshot is None:
            return
        newest = self.snapshots[-1] if self.snapshots else None
        if newest is not None and list(newest.model) != list(snapshot.model):
            self._let_go()  # the network's entries changed (pruned: weight became weight_orig and weight_mask)
        self.keep(snapshot)

    def try_take(self, next_step: int) -> Snapshot | None:
        """``take_now``, or None where the optimizer's state cannot be read now: ``ZeroRedundancyOptimizer``
        refuses ``state_dict()`` until its shards are consolidated, and the copy raised in the script (stop 63).
        Then no copy is taken again: a finding stops the job as it would without in-job recovery."""
        try:
            return self.take_now(next_step)
        except RuntimeError as error:
            self.frozen = True
            self.snapshots.clear()
            self.first = self.anchor = None
            say(f"sentinel: no copies of the training state for a rollback in the job: the optimizer's state "
                f"cannot be read ({' '.join(str(error).split())[:200]}); a finding stops the job")
            return None

    def fits(self, snapshot: Snapshot) -> bool:
        """Whether ``snapshot`` loads into the network and the optimizer as they are now: the same entries and
        as many groups. Not where the script changed them since (pruned the network, added a group) and no
        copy has been taken since to let it go (``after_step``): a rollback to it raised in the script."""
        return (list(snapshot.model) == list(self.model.state_dict())
                and len(snapshot.optimizer.get("param_groups", ())) == len(self.optimizer.param_groups)
                and len(snapshot.loose) == len(self.loose))

    def keep(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)
        if self.companion is None:
            return
        if self.first is None:
            self.first = snapshot
        if snapshot.level is not None and (self.anchor is None or snapshot.level <= self.anchor.level):
            self.anchor = snapshot

    def measured(self, step: int, loss: float | None) -> None:
        """The loss of step ``step``: the ``own`` loss of the copy taken before that step, if one is held; for
        the first copy, its level too (nothing before it measured that state).

        The level of a later copy is the mean loss of the window before it; the first has no window, yet
        its step's loss was computed on its very weights. A fine-tune whose rate wrecks the pretrained
        network within its first window shows how much that matters: every window is then the wrecked
        level, the pretrained state alone is not, and a rollback must know it (``restore_point``)."""
        if loss is None or not math.isfinite(loss):
            return
        # Every step calls this: the copies held are scanned, not sorted (kept()).
        target = next((s for s in (self.first, self.anchor, *self.snapshots)
                       if s is not None and s.next_step == step and s.own is None), None)
        if target is None:
            return
        first = target is self.first
        measured = replace(target, own=float(loss), level=float(loss) if first and target.level is None
                           else target.level)
        if first:
            self.first = measured
        if target is self.anchor:  # its level is its window's still: one step's loss is no window's mean
            self.anchor = measured
        kept = [measured if s is target else s for s in self.snapshots]
        self.snapshots.clear()
        self.snapshots.extend(kept)

    def kept(self) -> list[Snapshot]:
        """Every copy held, oldest first: the first, the anchor and the newest ``keep``."""
        held = {id(s): s for s in (self.first, self.anchor, *self.snapshots) if s is not None}
        return sorted(held.values(), key=lambda s: s.next_step)

    def travel(self) -> float | None:
        """How far the model's parameters have moved since the first copy: the norm of the difference over
        the norm of the first copy's parameters. None without a first copy (it is kept for an in-job
        rollback), or where those parameters' norm is 0 (a network started from zeros has no scale to
        measure by). One pass over the parameters, read from the device once."""
        if self.first is None:
            return None
        self.first.settle()
        moved: torch.Tensor | float = 0.0
        start: torch.Tensor | float = 0.0
        for name, param in self.model.named_parameters():
            before = self.first.model.get(name)
            if not isinstance(before, torch.Tensor) or before.shape != param.shape or not param.is_floating_point():
                continue
            before = before.to(param.device, torch.float32)
            moved = moved + (param.detach().float() - before).square().sum()
            start = start + before.square().sum()
        moved, start = float(moved), float(start)
        return math.sqrt(moved / start) if start > 0 and math.isfinite(moved) else None

    def forget_after(self, next_step: int) -> None:
        """A rollback went back to the copy from which training went on at ``next_step``, and training
        goes on from it: the copies taken after it hold states of the steps it undid, and are no restore
        point for a later rollback (step numbers go on counting, so they would pass for older states of
        the run). The anchor among them gives way to the best of those left."""
        kept = [s for s in self.snapshots if s.next_step <= next_step]
        self.snapshots.clear()
        self.snapshots.extend(kept)
        if self.anchor is not None and self.anchor.next_step > next_step:
            known = [s for s in kept if s is not self.first and s.level is not None]
            self.anchor = min(known, key=lambda s: s.level) if known else None

    def take_now(self, next_step: int, *, waiting: bool = False) -> Snapshot:
        """A copy of the state now, from which training goes on at ``next_step`` (not kept here).

        From CUDA memory it is queued without waiting, into pinned memory (``state_on_host``), unless
        ``waiting``: pinned memory is locked, and PyTorch keeps what it freed for reuse rather than give it
        back, so a copy read at once and dropped (a probe's end state) is better made the plain way."""
        started = time.perf_counter()
        checks, level = (self.companion.checks_state(), self.companion.loss_level()) if self.companion else (None, None)
        if self.companion is not None and self.shadows is None:
            # One process alone: under DDP the other ranks' shadows would stay where the run-up took them, and
            # the ranks would disagree on them from then on (stabilizer_sentinel.recovery.ranks sends the rest).
            alone = distributed.rank_and_size()[1] == 1
            self.shadows = [weakref.ref(network) for network in shadows_of(self.model, self.optimizer, self.others,
                                                                            self.inner)] if alone else []
        try:
            devices: set[torch.device] | None = None if waiting else set()
            snapshot = self._copy(next_step, checks, level, devices)
        except RuntimeError:  # no pinned memory to be had: copied waiting, as without CUDA
            snapshot = self._copy(next_step, checks, level, None)
        self.seconds += time.perf_counter() - started
        self.copies += 1
        return snapshot

    def _copy(self, next_step: int, checks: Any, level: float | None, devices: set[torch.device] | None) -> Snapshot:
        model = state_on_host(self.model.state_dict(), devices)
        optimizer = state_on_host(self.optimizer.state_dict(), devices)
        others = [self._due.get(index) or _other_state(network, other, devices)
                  for index, (network, other) in enumerate(self.others)]
        inner = [state_on_host(inner.state_dict(), devices) for inner in self.inner]
        loose = [state_on_host(tensor, devices) for tensor in self.loose]
        shadows = [{} if (network := shadow()) is None else state_on_host(network.state_dict(), devices)
                   for shadow in self.shadows or ()]
        return Snapshot(next_step, model, optimizer, checks, level, others, self._scaler_state(), inner=inner,
                        copied=copied_on(devices) if devices else (), loose=loose, shadows=shadows)

    def load(self, snapshot: Snapshot) -> None:
        """Put ``snapshot`` back into the model, the optimizer's state and the companion; the copy stays intact.

        The guard's own keys in the optimizer's state (its step count, the learning check's start)
        are left out: a rollback keeps counting the steps the script takes.
        """
        snapshot.settle()
        self.model.load_state_dict({key: value for key, value in snapshot.model.items() if key not in self.apart},
                                   strict=not self.apart)  # copied into the parameters
        load_optimizer_state(self.optimizer, state_on_host(snapshot.optimizer))  # a fresh copy: updated in place
        with torch.no_grad():
            for tensor, value in zip(self.loose, snapshot.loose, strict=True):
                tensor.copy_(value)
        for inner, state in zip(self.inner, snapshot.inner, strict=False):
            load_optimizer_state(inner, state_on_host(state))
        for shadow, state in zip(self.shadows or (), snapshot.shadows, strict=False):
            if state and (network := shadow()) is not None:
                try:
                    network.load_state_dict(state)
                except (KeyError, RuntimeError, TypeError):  # the script changed it since (pruned it): left as it is
                    continue
        self._due = dict(enumerate(snapshot.others))  # put back at each one's next step (load_other)
        if self.companion is not None and snapshot.checks is not None:
            self.companion.load_checks_state(copy.deepcopy(snapshot.checks))
        if self.scaling is not None:
            self.scaling.put_back(snapshot.scaler)  # at the scaler's next update(), once the copy's state is known

    def _scaler_state(self) -> dict[str, Any] | None:
        return self.scaling.state_after_update() if self.scaling is not None else None

    @property
    def due_others(self) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
        """The other optimizers' part of the state loaded last, not put back yet, by position."""
        return dict(self._due)

    def load_other(self, optimizer: torch.optim.Optimizer) -> bool:
        """At another optimizer's step: put back its part of the state loaded last, when not done yet;
        True when it did (the gradients about to be applied were computed before it).

        Not when the rest was loaded: the script may hold a graph through that network's weights still
        to be backwarded (a GAN's generator made the batch before the discriminator stepped), and a copy
        into them would break it. At its own step its backward pass is done."""
        return load_other(self.others, self._due, optimizer)

    def healthy_before(self, step: int) -> Snapshot | None:
        """The newest copy from which training went on at a step before ``step``."""
        earlier = [snapshot for snapshot in self.snapshots if snapshot.next_step < step]
        return earlier[-1] if earlier else None

    def persist(self, before_step: int) -> Path | None:
        """Write the copies taken before ``before_step`` as checkpoints; stop taking copies.

        Returns the newest one's path, or None when there is no such copy (then the periodic
        checkpoints are all there is). Called at the first finding; later calls return the same.
        """
        if self.frozen:
            return self.persisted
        self.frozen = True
        if not self.writes:
            return None
        for snapshot in self.snapshots:
            if snapshot.next_step < before_step:
                self.persisted = self._write(snapshot)
        return self.persisted

    def persist_point(self, snapshot: Snapshot) -> Path | None:
        """Write ``snapshot`` as a checkpoint: a rollback's restore point, when the job did not settle on a
        rate and the finding stands (the relaunch resumes from the newest checkpoint before the run-up).

        None when the copies are never written, or for the state before the first step (a relaunch
        that starts fresh is there already).
        """
        if not self.writes or snapshot.next_step == 0:
            return None
        self.persisted = self._write(snapshot)
        return self.persisted

    def _write(self, snapshot: Snapshot) -> Path:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / checkpoint_name(snapshot.next_step)
        snapshot.settle()
        if not path.exists():  # a periodic checkpoint of the same step holds the same state
            partial = path.with_suffix(".tmp")
            torch.save(
                {"model": snapshot.model, "optimizer": snapshot.optimizer, "next_step": snapshot.next_step,
                 **self.extra},
                partial,
            )
            partial.rename(path)  # a reader (or the S3 sync) never sees half a checkpoint
        return path
