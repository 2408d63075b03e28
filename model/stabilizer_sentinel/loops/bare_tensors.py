"""Loops over bare tensors: leaf tensors that require grad, updated by hand, with no ``nn.Module`` and no
``torch.optim`` (``w -= lr * w.grad`` under ``torch.no_grad()``).

Such a loop calls no module and steps no optimizer, so the launcher's other hooks never see it. Its
one regular event is the backward pass. Autograd has no global hook on a backward pass starting, so
``torch.autograd.backward`` (which ``Tensor.backward`` calls) is wrapped once per process, at module
level. With GradScaler's (stabilizer_sentinel.loops.step_clock), it is the second PyTorch function this library
wraps. The wrapper calls the listeners (``listen``) with the tensors about to be backwarded, then runs
the original.

``HandUpdates`` is what the launcher's standby does at each backward pass, until it attaches:

- the graph of the backwarded scalar (its loss) is walked to its leaves that require grad, the AccumulateGrad
  nodes (``grad_fn.next_functions``): they are the parameters;
- the smallest of them is copied; at the next backward pass, when it changed with no optimizer step
  in between (an optimizer step would have attached the launcher as usual), the loop updated them
  by hand. The launcher then attaches a guard to those tensors (stabilizer_sentinel.loops.networks.BareTensors),
  stepped by a backward-pass clock (stabilizer_sentinel.loops.step_clock.BackwardClock) and counting from
  step 1, since the first update came before anything could tell. From then on the scalar each
  backward pass starts from is that step's loss.

What cannot be watched this way is said in one line on stderr at exit, where nothing else attached the launcher
(an optimizer's step does: stabilizer_sentinel.integration.launcher_hooks), and the job then ends unwatched (no
summary):

- a loop that makes new leaf tensors at every step (``w = (w - lr * w.grad).detach().requires_grad_()``):
  the tensors the guard would hook are gone by the next step (the last pass's smallest leaf, held
  weakly, is no longer alive; a pass over other leaves while those of the last are still held is
  another network's loss, backwarded before an optimizer's step). Only said at exit: a pass over leaves made for
  it is no such loop where an optimizer steps after it (sentence-transformers' cached in-batch negatives backward
  a loss of detached embeddings first, made afresh for each loss, then the network through them: stop 83's hunt
  found the line said of a run that was watched);
- a loop whose gradients come from ``torch.autograd.grad`` (no backward pass; nothing is wrapped there), where
  the log reported a loss.

This module must not change gradients or weights. Walking the graph costs one visit per graph node,
at each backward pass until the launcher attaches or stands down (one walk in a script with an optimizer).
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from stabilizer_sentinel import failsafe, handle_ids

# Called with the tensors of every backward pass, before it runs (listen), by handle id; and with its
# gradients (``grad_tensors``, None where the pass was given none) where the listener asked for them.
_LISTENERS: OrderedDict[int, tuple[Callable[..., None], bool]] = OrderedDict()
_ORIGINAL: dict[str, Any] = {}
# A graph larger than this is not walked: no loop over bare tensors builds one (its leaves are written out).
MAX_NODES = 100_000


def _wrap_backward() -> None:
    """Wrap ``torch.autograd.backward`` once per process."""
    if not _ORIGINAL:
        _ORIGINAL["backward"] = torch.autograd.backward
        # Under the original's name, signature and documentation: what a script inspects stays the same.
        torch.autograd.backward = functools.wraps(torch.autograd.backward)(_backward)  # type: ignore[assignment]


def listen(listener: Callable[..., None], *, gradients: bool = False) -> RemovableHandle:
    """Call ``listener`` with the tensors of every backward pass, before it runs (and with the gradients it
    was given, ``gradients``), until the handle's ``remove()`` (idempotent, as torch's hook handles are)."""
    _wrap_backward()
    with handle_ids.apart():
        handle = RemovableHandle(_LISTENERS)
    _LISTENERS[handle.id] = (listener, gradients)
    return handle


def listen_while(owner: object, observe: Callable[[Sequence[torch.Tensor]], None]) -> RemovableHandle:
    """``listen`` with ``observe`` (the tensors of every backward pass) while ``owner`` lives: the listener
    removes itself at the first pass after ``owner`` is gone, and holds it only weakly."""
    ref = weakref.ref(owner)

    def listener(tensors: Sequence[torch.Tensor]) -> None:
        if ref() is None:
            listening.remove()
            return
        observe(tensors)

    listening = listen(listener)
    return listening


def _backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
    if _LISTENERS:
        seen = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        given = args[0] if args else kwargs.get("grad_tensors")
        for listener, with_gradients in list(_LISTENERS.values()):
            if with_gradients:
                failsafe.call_shielded(listener, seen, given)
            else:
                failsafe.call_shielded(listener, seen)
    return _ORIGINAL["backward"](tensors, *args, **kwargs)


def scalar_loss(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The loss of a backward pass: the one scalar it starts from (None for several, or a non-scalar)."""
    if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and tensors[0].numel() == 1:
        return tensors[0]
    return None


def leaves(loss: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors requiring grad that ``loss`` depends on, in the order the walk meets them."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    keep: list[Any] = []  # holds the visited nodes, so that no id is reused during the walk
    stack = [loss.grad_fn]
    while stack and len(keep) < MAX_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf's gradient is summed here
        if isinstance(variable, torch.Tensor) and variable.requires_grad:
            found.append(variable)
        stack.extend(child for child, _ in reversed(node.next_functions))
    return found


def readable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s values are there to read: FSDP2 frees the storage of a layer's gathered parameters
    between its passes (resized to nothing, the tensor's shape kept), and reading one then crashed the process
    (SIGSEGV, stop 73's hunt: a script sharding each layer with ``fully_shard``); a tensor subclass whose values
    live elsewhere (a ``DTensor``'s shards) has no storage of its own to read."""
    if type(tensor) not in (torch.Tensor, nn.Parameter):
        return False
    if tensor.numel() == 0:
        return True
    try:
        held = tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return False
    extent = tensor.storage_offset() + 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape,
                                                                                            tensor.stride(),
                                                                                            strict=True))
    return held >= extent * tensor.element_size()


class HandUpdates:
    """Finds, one backward pass at a time, a loop that updates its leaf tensors by hand."""

    def __init__(self) -> None:
        # The smallest leaf (weakly: a loop that drops it made new ones), and a copy of it.
        self._watched: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None
        self.refused: str | None = None
        self.previous_loss: torch.Tensor | None = None  # the last pass's loss, before its update

    def backward(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The leaves to watch when this backward pass shows that the loop updated them by hand, else None."""
        loss = scalar_loss(tensors)
        if loss is None or loss.grad_fn is None or self.refused is not None:
            return None
        found = [leaf for leaf in leaves(loss) if readable(leaf)]
        if not found:
            return None
        known, self._watched = self._watched, None
        leaf = known[0]() if known is not None else None
        if leaf is not None and known is not None and not torch.equal(leaf.detach(), known[1]):
            return found
        # The script let go of the leaves of the last pass, which nothing updated: it makes new ones at each
        # step. (Leaves of the last pass still held, none of them in this pass, are another loss's: a second
        # network backwarded before the step, which an optimizer's step will show.)
        if known is not None and leaf is None:
            self.refused = ("the loop makes new parameter tensors at every step (no optimizer, no nn.Module): "
                            "the launcher cannot follow them; update them in place (w -= lr * w.grad under no_grad)")
            return None  # said at exit, where no optimizer attached the launcher since (launcher_hooks)
        smallest = min(found, key=lambda t: t.numel())
        self._watched = (weakref.ref(smallest), smallest.detach().clone())
        self.previous_loss = loss.detach()  # the loss before the update the next pass may reveal
        return None
