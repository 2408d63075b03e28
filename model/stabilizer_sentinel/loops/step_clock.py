"""Steps no optimizer hook announces: those a loss scaler skips, and loops that update by hand.

**Mixed precision with a GradScaler.** ``scaler.step(optimizer)`` calls ``optimizer.step()`` only when
the unscaled gradients are finite; otherwise it skips it, and with it every optimizer hook. A run
whose loss turned NaN would then look like a run that stopped taking steps. So ``GradScaler.step``
and ``GradScaler.update`` are wrapped once, at class level (the one place this library wraps a
PyTorch method: the scaler has no hooks), for the optimizers a guard watches. A step the scaler
skipped is counted (``steps_taken`` and ``steps_skipped`` of the summary, and the step number goes
on, so step numbers count the steps the loop attempted); its loss is read (one host synchronisation,
at skipped steps only: the scaler has just synchronised on its found-inf flag anyway), and after the
scaler's update the new scale is read (idem; once more at the end for ``loss_scale.last``).

What is healthy and what is not:

- skipped steps with a finite loss are the scaler calibrating: its scale starts high (2**16) and
  halves at each overflow until the scaled gradients fit float16. Healthy, however many; their
  losses are the model's all the same, so the learning check reads them (the first of them is where
  the run started: a run whose first applied steps already exploded is judged from it);
- a non-finite loss on ``NONFINITE_LOSS_STEPS`` (3) consecutive steps is an ``ExplodingTensor``
  finding, at the first of them: the scale does not enter the forward pass, so lowering it cannot
  cure a loss that overflows, and one bad batch makes one non-finite loss, not three in a row;
- a scale below ``MIN_LOSS_SCALE`` (1.0) is an ``ExplodingTensor`` finding: the scaler only gets
  there by multiplying gradients by less than one and still finding them non-finite, so they
  overflow float16 at their true size (or are NaN): the gradients themselves have exploded.

**Loops that update parameters by hand** (``p.data -= lr * p.grad``, no ``torch.optim``): a
``BackwardClock`` makes each backward pass through the model's parameters a step. A multi-grad hook
(``torch.autograd.graph.register_multi_grad_hook``, mode "any") fires when the first of their
gradients is computed and queues a callback at the end of that backward pass, when every gradient
is in place and before the loop can apply them: the check runs there (the gradient norm and the
loss reported for that step) and a stop leaves from ``loss.backward()``, before the update. With the
library the loss is the one ``guard.step(loss)`` reports, before or after ``backward()``; with the
launcher it is the loss module's output, else the log's (checked with the next backward). A library
loop that never calls ``guard.step(loss)`` is noticed at its second backward pass; from then on each
pass is checked when it ends, on its gradients alone.

This module must not change gradients, weights or the scaler's decisions.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.failsafe import shielded

NONFINITE_LOSS_STEPS = 3
MIN_LOSS_SCALE = 1.0

_GUARDS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # id(optimizer) -> guard
_ORIGINAL: dict[str, Any] = {}


class ScalerWatch:
    """One guard's view of the GradScaler that steps its optimizer."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.scaler: Any = None
        self.nonfinite_since: int | None = None
        self.nonfinite_count = 0
        self.scale_stale = False
        # In-job rollback (stabilizer_sentinel.recovery): a state to put back, and copies' states to fill, at the
        # next update(). A copy and a rollback happen at the end of a step, inside or right after the
        # scaler's step() and before the script's update(), which is what sets the scale the next step runs
        # at: halved after an overflow, so a copy taken at a skipped step would hold a scale that overflows.
        self.put_back_due: dict[str, Any] | None = None
        self._recording: list[dict[str, Any]] = []

    def state_after_update(self) -> dict[str, Any] | None:
        """A dict that the scaler's state (``GradScaler.state_dict()``) fills at its next ``update()``; None
        without an enabled scaler. Its scale is read back to the host then, once per copy of the weights,
        which waits for the device already."""
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        recorded: dict[str, Any] = {}
        self._recording.append(recorded)
        return recorded

    def put_back(self, state: dict[str, Any] | None) -> None:
        """A rollback puts the scaler's state back at its next ``update()``: until then the step under way
        goes on at the scale its gradients were scaled with (another optimizer's step of the same
        iteration too), and the update that follows would fold the undone step's overflow into it."""
        if state is not None and self.scaler is not None and self.scaler.is_enabled():
            self.put_back_due = state

    def updated(self) -> None:
        """After the scaler's ``update()``: the copies taken during the step get its state, then a rollback's
        is put back."""
        if self._recording:
            state = self.scaler.state_dict()
            for recorded in self._recording:
                recorded.update(state)
            self._recording = []
        if self.put_back_due:
            self.scaler.load_state_dict(self.put_back_due)
        self.put_back_due = None
        if self.scale_stale:
            self.read_scale()

    def applied(self) -> None:
        self.nonfinite_since, self.nonfinite_count = None, 0

    def skipped(self) -> None:
        guard = self.guard
        step = guard.step_number
        loss = guard.take_loss()
        value = float(loss) if loss is not None else None  # a host synchronisation, at skipped steps only
        guard.record.steps_skipped += 1
        if value is not None:
            guard.record.last_loss = value
        self.scale_stale = True
        if guard.batches is not None:  # a skipped step took its batches too (stabilizer_sentinel.recovery.batches)
            guard.batches.checked(step)
        guard.advance()
        guard.stop_if_deferred(step)  # a finding of the log's, when no step is checked any more
        if value is None or math.isfinite(value):
            self.applied()
            if value is not None:  # a loss the model had, though the scaler skipped its update: the learning check's
                found = guard.sentinel.learning.observe(step, value, guard.phase, guard.learning_rate)
                if found is not None:
                    guard.external_finding(step, found.tensor, found.value, found.message, source="loss_scaler",
                                           rule=found.rule)
            return
        if self.nonfinite_since is None:
            self.nonfinite_since = step
        self.nonfinite_count += 1
        if self.nonfinite_count >= NONFINITE_LOSS_STEPS:
            message = (f"loss is non-finite at steps {self.nonfinite_since}..{step}, all skipped by the loss scaler "
                       f"({NONFINITE_LOSS_STEPS} in a row: not a scale calibrating)")
            guard.external_finding(self.nonfinite_since, "losses/loss", value, message, source="loss_scaler")

    def read_scale(self, *, judge: bool = True) -> None:
        """Record the scaler's scale; ``judge``: a collapsed one is a finding (not at the end: nothing to stop)."""
        self.scale_stale = False
        if self.scaler is None or not self.scaler.is_enabled():
            return
        scale = float(self.scaler.get_scale())  # a host synchronisation: after skipped steps and at the end
        self.guard.record.loss_scale(scale)
        if judge and scale < MIN_LOSS_SCALE:
            step = max(self.guard.step_number - 1, 0)
            message = (f"the loss scale collapsed to {scale:.3g} at step {step} (below {MIN_LOSS_SCALE:g}: the "
                       "gradients overflow float16 at their true size)")
            self.guard.external_finding(step, "loss_scale", scale, message, source="loss_scaler")


# Called with an optimizer a GradScaler steps that no guard follows yet (stand_by), by handle id.
_STANDBY: OrderedDict[int, Callable[[torch.optim.Optimizer], None]] = OrderedDict()


def _wrap_scaler() -> None:
    """Wrap ``GradScaler.step`` and ``update`` once per process."""
    if not _ORIGINAL:
        from torch.amp import GradScaler

        _ORIGINAL.update(step=GradScaler.step, update=GradScaler.update)
        # Under the originals' names, signatures and documentation: what a script inspects stays the same.
        GradScaler.step = functools.wraps(GradScaler.step)(_scaler_step)  # type: ignore[method-assign]
        GradScaler.update = functools.wraps(GradScaler.update)(_scaler_update)  # type: ignore[method-assign]


def stand_by(standby: Callable[[torch.optim.Optimizer], None]) -> RemovableHandle:
    """Call ``standby`` with each optimizer a GradScaler steps that no guard follows yet, before the step,
    until the handle's ``remove()``: the launcher attaches there, since a skipped first step calls no
    optimizer hook."""
    _wrap_scaler()
    with handle_ids.apart():
        handle = RemovableHandle(_STANDBY)
    _STANDBY[handle.id] = standby
    return handle


def follow_scaler(optimizer: torch.optim.Optimizer, guard: Any) -> ScalerWatch:
    """Count the steps a GradScaler skips for ``optimizer``, on ``guard``."""
    _wrap_scaler()
    _GUARDS[id(optimizer)] = guard
    return guard.scaler_watch


def unfollow(optimizer: torch.optim.Optimizer, guard: Any) -> None:
    if _GUARDS.get(id(optimizer)) is guard:
        del _GUARDS[id(optimizer)]


def _scaler_step(self: Any, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
    if id(optimizer) not in _GUARDS:
        for standby in list(_STANDBY.values()):
            standby(optimizer)
    guard = _GUARDS.get(id(optimizer))
    if guard is None or not self.is_enabled():
        return _ORIGINAL["step"](self, optimizer, *args, **kwargs)
    watch = guard.scaler_watch
    watch.scaler = self
    taken = guard.record.steps_taken
    result = _ORIGINAL["step"](self, optimizer, *args, **kwargs)
    if guard.record.steps_taken == taken:  # the optimizer's hooks never ran: the scaler skipped the step
        watch.skipped()
    else:
        watch.applied()
    return result


def _scaler_update(self: Any, new_scale: Any = None) -> None:
    _ORIGINAL["update"](self, new_scale)
    for guard in list(_GUARDS.values()):
        if guard.scaler_watch.scaler is self:
            guard.scaler_watch.updated()


class BackwardClock:
    """A step per backward pass through ``params``: for loops that apply gradients without an optimizer."""

    def __init__(self, guard: Any, params: list[torch.Tensor], *, wait_for_loss: bool) -> None:
        self.guard = guard
        self.wait_for_loss = wait_for_loss
        self.ready = False  # a backward pass ended and waits for guard.step(loss)
        with handle_ids.apart():
            self._handle = torch.autograd.graph.register_multi_grad_hook(params, shielded(self._started), mode="any")

    def _started(self, grad: Any) -> None:
        if self.ready:  # the last backward pass got no guard.step(loss): the loop reports none, count without
            self.wait_for_loss = False
            self.tick()
        torch.autograd.Variable._execution_engine.queue_callback(self._ended)

    def _ended(self) -> None:
        if self.guard.has_loss or not self.wait_for_loss:
            self.tick()
        else:
            self.ready = True

    def loss_reported(self) -> None:
        """The library's ``guard.step(loss)`` after ``backward()``: the step whose gradients wait is checked now."""
        if self.ready:
            self.tick()

    def tick(self) -> None:
        self.ready = False
        self.guard.check()
        self.guard.advance()

    def remove(self) -> None:
        self._handle.remove()
