"""The script's averaged copies of the network after a rollback: an EMA or SWA kept with
``torch.optim.swa_utils.AveragedModel``.

The script updates such a copy after each optimizer step (``update_parameters``), so by the time a
rollback goes on it has averaged in the steps the rollback undid: the run-up to the finding, the step
that failed (an explosion's weights, 1e18 and more) and every probe's. The rollback does not keep the
copy's own state with each of its copies (that would cost another network's weights in each), so it
cannot put the average back as it was; it restarts it instead. Its ``n_averaged`` goes to 0, and the
script's next ``update_parameters`` takes the network's weights as they are then (the state the job goes
on from), as its first update did. The average from before the copy rolled back to is lost with the rest.

A copy is the network's when its parameters have the shapes, in order, of the watched network's, of
another rolled-back network's, or of the parameters of one of the rolled-back optimizers. Any other average
(another model's, a hand-written EMA that is a plain module) is left as it is. Found by a scan of the
objects the garbage collector tracks, at a rollback's end only.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel


def shapes(tensors: Iterable[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(tuple(t.shape) for t in tensors)
    except (RuntimeError, ValueError):  # a lazy module's parameters before their first call have no shape
        return ()


def restart(model: nn.Module, optimizer: torch.optim.Optimizer, others: Iterable[tuple[Any, torch.optim.Optimizer]],
            inner: Iterable[torch.optim.Optimizer] = ()) -> int:
    """Restart every ``AveragedModel`` of what a rollback held (stabilizer_sentinel.recovery.rewind.Rewind's
    ``model``, ``optimizer``, ``others`` as (network, optimizer) and ``inner``; a DDP follower's the same): of
    one of those networks, or of the parameters one of those optimizers trains. The script's next update copies
    the weights. Returns how many were restarted."""
    others = list(others)
    networks = [model, *(network for network, _ in others)]
    optimizers = [optimizer, *(other for _, other in others), *inner]
    known = {shapes(n.parameters()) for n in networks if isinstance(n, nn.Module)}
    known |= {shapes(p for group in o.param_groups for p in group["params"]) for o in optimizers}
    known.discard(())
    restarted = 0
    for candidate in gc.get_objects():
        # By the type itself: isinstance would read ``__class__``, which a dead weak proxy raises on.
        if issubclass(type(candidate), AveragedModel) and shapes(candidate.module.parameters()) in known:
            with torch.no_grad():
                candidate.n_averaged.zero_()
            restarted += 1
    return restarted
