"""What the guard does in an optimizer's hooks (stabilizer_sentinel.integration.guard's ``Guard`` mixes this in).

- Step pre-hook: check the gradients the optimizer is about to apply (``guard.check()``); with
  ``optimizer.step(closure)`` (LBFGS, ...) gradients exist only after the step, so the check runs in
  the post-hook and a stopping step has already been applied.
- Step post-hook: count the step (``guard.advance()``).
- A loop that checks and counts its steps itself (Lightning's callback) and recovers in the job gets
  the step's edges alone (``hook_step_edges``): a rollback's rate around the update, its end after it.
- ``state_dict`` post-hook / ``load_state_dict`` pre-hook, at the library level only (a script that
  calls ``watch()``): the guard's step count and the learning check's start travel in the
  optimizer's checkpoint, so a loop that checkpoints its optimizer resumes both by itself. A script
  watched by the launcher knows nothing of us: its ``state_dict()`` keeps PyTorch's keys alone, and
  it resumes through the launcher's own checkpoints (stabilizer_sentinel.recovery.resume).
- Optimizers the first one steps inside its own step, over its parameters (SAM's base, Lookahead's:
  ``add_inner``, found among its attributes, or by the launcher at their first step): part of the first
  one. Nothing is checked at their steps (the first one's check reads the same gradients, and its loss);
  in a job that recovers in place their state goes back with the first one's, and their groups that are
  not the first one's own run at the factor in force.
- Other optimizers of the same run (a GAN's second, ``add_optimizer``): their steps get the finite
  check of their own loss and gradients, with one host synchronisation per step each; they are not
  counted as steps and do not feed the learning check (the first optimizer's steps are the run's).
  In a job that recovers in place their steps run at the rate factor in force too, and the step at
  which a rollback's state goes back into one of them changes nothing (its gradients predate that
  state: stabilizer_sentinel.recovery.recovery.RateFactor.scale_other holds them aside for the step).

This module must not change gradients or weights.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from stabilizer_sentinel import handle_ids
from stabilizer_sentinel.failsafe import shielded
from stabilizer_sentinel.loops import gradients
from stabilizer_sentinel.say import say

# The latest steps of each other optimizer whose losses are kept (``OptimizerHooks.other_losses``).
OTHER_LOSSES = 1000

STATE_KEY = "stabilizer_step"
LEARNING_KEY = "stabilizer_learning"  # the learning check's start, so a resumed run is judged from its lineage


class OptimizerHooks:
    optimizer: torch.optim.Optimizer | None
    others: list[torch.optim.Optimizer]
    inner: list[torch.optim.Optimizer]
    step_number: int
    sentinel: Any
    capture: Any
    _handles: list[Any]
    _first_handles: list[Any]
    _in_step: bool
    recovery: Any
    _loss: Any
    _reported_once: bool
    _warned_late: bool
    warn_when_loss_is_late: bool
    # Inside the watched optimizer's ``step(closure)``: the version of its first weight at the step's first
    # backward pass inside it (-1 before that pass), else None (``at_trial_point``).
    _closure_version: int | None = None
    # The losses of each other optimizer's latest steps (``_check_other``), by its id: a network trained after the
    # first (the launcher's next phase, attached at its 51st step) is judged from its own first steps' losses.
    _other_losses: dict[int, deque[float]] | None = None

    def hook_optimizers(self, optimizers: list[torch.optim.Optimizer], *, in_checkpoints: bool) -> None:
        """Hook the first optimizer (its steps are the run's) and check the others' steps; with
        ``in_checkpoints``, the step count travels in the first one's ``state_dict()``."""
        self._hook_first(optimizers[0], in_checkpoints=in_checkpoints)
        for other in optimizers[1:]:
            self.add_optimizer(other)

    def _hook_first(self, first: torch.optim.Optimizer, *, in_checkpoints: bool) -> None:
        """The hooks of the optimizer whose steps are the run's (``_first_handles``, which ``Guard.hand_over``
        moves to another)."""
        self._in_step = False  # between its step's pre- and post-hooks: an optimizer stepped there is nested
        with handle_ids.apart():
            self._first_handles = [
                first.register_step_pre_hook(shielded(self._before_optimizer_step, meeting=self._meet_before_step)),
                first.register_step_post_hook(shielded(self._after_optimizer_step, meeting=self._meet_after_step)),
            ]
            if in_checkpoints:
                self._first_handles += [first.register_state_dict_post_hook(shielded(self._save_step)),
                                        first.register_load_state_dict_pre_hook(shielded(self._load_step))]
        self._handles += self._first_handles
        self.inner = []
        for inner in nested_optimizers(first):
            self.add_inner(inner)

    def steps_inside(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer``, stepping now, is one the first one steps inside its own step over its
        parameters (an inner optimizer no attribute held, ``nested_optimizers``)."""
        return self.optimizer is not None and self._in_step and _shares_parameters(optimizer, self.optimizer)

    def add_inner(self, optimizer: torch.optim.Optimizer) -> bool:
        """Take ``optimizer``, stepped inside the first one's step, as part of the first one (its hooks go
        with the first one's, ``_first_handles``); False when it is known already."""
        if any(optimizer is known for known in (self.optimizer, *self.inner, *self.others)):
            return False
        self.inner.append(optimizer)
        with handle_ids.apart():
            handles = [optimizer.register_step_pre_hook(shielded(self._before_inner_step)),
                       optimizer.register_step_post_hook(shielded(self._after_inner_step))]
        self._first_handles += handles
        self._handles += handles
        return True

    def _before_inner_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.recovery is not None and self.optimizer is not None:
            self.recovery.scale_inner(optimizer, self.optimizer)

    def _after_inner_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.recovery is not None and self.optimizer is not None:
            self.recovery.unscale_inner()

    def _unhook_first(self) -> None:
        for handle in self._first_handles:
            handle.remove()
            self._handles.remove(handle)
        self._first_handles = []

    def hook_step_edges(self, optimizer: torch.optim.Optimizer) -> None:
        """For a loop that checks and counts its steps itself (Lightning's callback, ``check_counted``)
        and recovers in the job: around the update a rollback's rate, after it the step's end (copies,
        probes); nothing is checked here. Lightning calls ``optimizer.step(closure)``: this pre-hook runs
        before the closure's forward and backward, the callback's check after them, the update after that."""
        with handle_ids.apart():
            self._handles += [optimizer.register_step_pre_hook(shielded(self._scale_for_step)),
                              optimizer.register_step_post_hook(shielded(self._after_counted_step))]

    def _scale_for_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self.recovery.scale(optimizer)

    def _after_counted_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self.recovery.unscale(optimizer)
        self.step_ended()

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._in_step = True
        self.step_begins()
        if _has_closure(args, kwargs):
            self._closure_version = -1
            self.take_first_copy()  # the check comes after the update: the state before it is now
            if self.recovery is not None:
                self.recovery.scale(optimizer)
            return  # gradients do not exist yet; checked after the step
        if self._loss is None and self._reported_once and self.warn_when_loss_is_late and not self._warned_late:
            self._warned_late = True
            say("sentinel: guard.step(loss) came after optimizer.step(); each loss is checked with the next "
                "step's gradients. Call guard.step(loss) before optimizer.step().")
        self.check()
        if self.recovery is not None:  # an in-job rollback's rate, for this step alone
            self.recovery.scale(optimizer)

    def _meet_before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not _has_closure(args, kwargs):  # where the step is checked (``_before_optimizer_step``)
            self.meet_ranks()

    def _meet_after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if _has_closure(args, kwargs):
            self.meet_ranks()

    def meet_ranks(self) -> None:
        """The watcher stood aside: where this rank owes the others the step's agreement, meet them there (the
        guard's; stabilizer_sentinel.failsafe). Nothing here."""

    def step_begins(self) -> None:
        """The watched optimizer's step is about to run, before its check: nothing here (the guard's copies)."""

    def take_first_copy(self) -> None:
        """The state training starts from, once, before the first update: nothing here (the guard's copies)."""

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._in_step, self._closure_version = False, None
        if _has_closure(args, kwargs):
            self.check()
        if self.recovery is not None:
            self.recovery.unscale(optimizer)
        self.advance()

    def at_trial_point(self) -> bool:
        """Whether a backward pass now is at a point the optimizer is trying inside its ``step(closure)``: the
        weights moved since the step's first pass inside it (read from their version counter, no host read of a
        tensor). L-BFGS calls the closure again at each point of its line search, and a rejected point's loss is
        no loss of the run's: the step's loss is its first call's (what ``step`` returns), made of that call's
        passes (micro-batches). Stop 69's hunt: a healthy L-BFGS with a strong-Wolfe line search, its closure
        evaluated at 0.034, 229.98, 1.665 and 0.032 in one step that returned 0.034, was rolled back as
        Diverging at the mean, 57.93. A SAM step that calls its closure at the weights and again at the point it
        climbed to has its first call's loss; one whose first pass came before the step has its one call's."""
        if self._closure_version is None or self.optimizer is None:
            return False
        first = next((p for group in self.optimizer.param_groups for p in group["params"]), None)
        if first is None:
            return False
        version = first._version
        if self._closure_version < 0:
            self._closure_version = version
            return False
        return version != self._closure_version

    def _save_step(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
        state_dict[STATE_KEY] = self.step_number
        state_dict[LEARNING_KEY] = self.sentinel.learning.state_dict()
        return state_dict

    def _load_step(self, optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
        if STATE_KEY in state_dict:
            self.step_number = int(state_dict.pop(STATE_KEY))
            self.capture.begin_step(self.step_number)
        if LEARNING_KEY in state_dict:
            self.sentinel.learning.load_state_dict(state_dict.pop(LEARNING_KEY))

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """Check another optimizer's steps too (a GAN's second): the finite check of its loss and gradients;
        False when it is known already.

        Its steps are not counted (the first optimizer's are the run's steps) and the learning check
        reads the first one's loss alone. One host synchronisation per step of each such optimizer.
        """
        if optimizer is self.optimizer or any(optimizer is other for other in self.others):
            return False
        self.others.append(optimizer)
        with handle_ids.apart():
            self._handles += [optimizer.register_step_pre_hook(shielded(self._before_other_step)),
                              optimizer.register_step_post_hook(shielded(self._after_other_step))]
        return True

    def _before_other_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.recovery is not None and not self.recovery.scale_other(optimizer):
            self.take_loss()  # gradients from before a rollback: the step is skipped, its loss is not the run's
            return
        if not _has_closure(args, kwargs):
            self._check_other(optimizer)

    def _after_other_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        skipped = self.recovery is not None and self.recovery.unscale_other(optimizer)
        if _has_closure(args, kwargs) and not skipped:
            self._check_other(optimizer)

    def other_losses(self, optimizer: torch.optim.Optimizer, count: int) -> list[float]:
        """The losses of ``optimizer``'s latest ``count`` steps (another optimizer's), oldest first (not-a-number
        for a step whose loss was not known)."""
        kept = (self._other_losses or {}).get(id(optimizer), ())
        return list(kept)[-count:] if count > 0 else []

    def _check_other(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = gradients.total_norm(grads).float() if grads else torch.zeros(())
        loss = self.take_loss()
        loss_value, norm_value = torch.stack([torch.as_tensor(float("nan") if loss is None else loss).to(
            norm.device, torch.float32).reshape(()), norm]).tolist()  # one host synchronisation for both
        index = next(i for i, other in enumerate(self.others) if other is optimizer) + 2
        if self._other_losses is None:
            self._other_losses = {}
        self._other_losses.setdefault(id(optimizer), deque(maxlen=OTHER_LOSSES)).append(loss_value)
        step = max(self.step_number - 1, 0)
        if loss is not None and not math.isfinite(loss_value):
            self.external_finding(step, "losses/loss", loss_value, f"loss is non-finite at step {step} "
                                  f"(optimizer {index})", source=f"optimizer {index}")
        elif not math.isfinite(norm_value):
            self.external_finding(step, "gradients", norm_value, f"gradient norm is non-finite at step {step} "
                                  f"(optimizer {index})", source=f"optimizer {index}")


def nested_optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The optimizers ``optimizer`` holds as attributes that update some of its parameters: those it steps
    inside its own step (SAM's ``base_optimizer``, Lookahead's ``optimizer``)."""
    held = [value for value in vars(optimizer).values() if isinstance(value, torch.optim.Optimizer)]
    return [inner for inner in held if inner is not optimizer and _shares_parameters(inner, optimizer)]


def _shares_parameters(one: torch.optim.Optimizer, other: torch.optim.Optimizer) -> bool:
    mine = {id(p) for group in other.param_groups for p in group["params"]}
    return any(id(p) in mine for group in one.param_groups for p in group["params"])


def _has_closure(args: tuple, kwargs: dict) -> bool:
    return (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None
