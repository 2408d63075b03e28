"""The makeup of the loss a backward pass starts from: which losses it adds up.

A script may change what its loss is made of mid-run: an auxiliary term switched on at an epoch (a
multi-task head's, a distillation or consistency term's after a warm-up), one task's loss traded for
another's. The loss's level moves with it, ten times and more, while the network trains as well as
before; the divergence bound, measured from the first window of a loss made of other terms, would call
it diverging (a hunt's multi-task classifier, a squared-error term of scale 9 added to its cross-entropy
at step 30: Diverging at step 32, stop 64). ``makeup`` names the terms a scalar adds up: the nodes below
its additions, subtractions, negations and constant scalings (``backward_loss``), by name (a reduction's with
the node it reduces), as a set (a loss summed over a varying number of micro-batches or time steps is of one
makeup). The learning check
starts its bound afresh from a makeup it has not seen (``LearningCheck._begin_segment``).

A term weighted by a number that turns from 0 (a KL term annealed in, an adversarial term off for its
first steps) is of the same makeup throughout: its level moves as slowly as the weight, or the weight's
jump is the script's own and unseen here.

This module must not change gradients or weights: it reads node names, no tensor (no host
synchronisation). A few tens of nodes at most are walked per pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from stabilizer_sentinel.loops import backward_loss, bare_tensors

# Nodes that add terms up (``a + b``, ``a - b``, ``-a``, ``loss + 1``): walked through, never a term.
SUMS = backward_loss.SUMS
# Nodes walked per pass at most: a loss summed over hundreds of time steps is read from its first few.
MAX_NODES = 64


def makeup(tensors: Sequence[torch.Tensor]) -> frozenset[str] | None:
    """The names of the terms the scalars of a backward pass add up; None for a pass from no scalar with
    a graph (a pipeline stage's activations)."""
    roots = [(tensor.grad_fn, tensor.output_nr) for tensor in tensors
             if isinstance(tensor, torch.Tensor) and tensor.numel() == 1 and tensor.grad_fn is not None]
    if not roots or len(roots) != len(tensors):
        return None
    terms: set[str] = set()
    queue: deque[tuple[Any, int]] = deque(roots)
    seen: set[int] = set()
    keep: list[Any] = []  # holds the visited nodes, so that no id is reused during the walk
    try:
        while queue and len(seen) < MAX_NODES:
            node, output = queue.popleft()
            node, _ = backward_loss.through_passthrough(node, output)  # a loss computed in a DDP forward pass
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            keep.append(node)
            scaling = backward_loss.constant_scaling(node)
            if scaling is not None:
                queue.append((scaling[0], backward_loss.output_into(node, scaling[0])))
            elif node.name() in SUMS:
                queue.extend(node.next_functions)
            else:
                terms.add(_term(node))
    except (AttributeError, RuntimeError, TypeError):  # a node saved differently: what was read stands
        pass
    return frozenset(terms)


def _term(node: Any) -> str:
    """A term's name: its node's, and for a reduction (``(error ** 2).mean()``, ``F.l1_loss``, which autograd
    records as a mean of ``abs``) the node it reduces too: two hand-written losses differ there alone."""
    name = node.name()
    if name in backward_loss.REDUCTIONS and node.next_functions:
        below = node.next_functions[0][0]
        name = f"{name}({below.name() if below is not None else ''})"
    return name


class LossMakeup:
    """The makeups of the backward passes since the learning check last took them."""

    def __init__(self) -> None:
        self._since: set[frozenset[str]] = set()

    def observe(self, tensors: Sequence[torch.Tensor]) -> None:
        read = makeup(tensors)
        if read is not None:
            self._since.add(read)

    def take(self) -> set[frozenset[str]]:
        """The makeups seen since the last call."""
        taken, self._since = self._since, set()
        return taken


def listen(owner: object) -> LossMakeup:
    """The makeups of every backward pass of this process while ``owner`` lives."""
    makeups = LossMakeup()
    bare_tensors.listen_while(owner, makeups.observe)
    return makeups
