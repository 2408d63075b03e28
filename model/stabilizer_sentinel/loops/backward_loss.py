"""The loss a backward pass starts from, however the script wrote it.

Every loop that learns calls ``backward()`` on a scalar. That scalar is often not the loss itself:
divided by the accumulation steps (``loss / accum``), multiplied by a loss scaler
(``scaler.scale(loss)``, ``loss * 65536``), or a sum-reduced loss divided by its count (a language
model's ``cross_entropy(..., reduction="sum") / num_tokens``). Its graph says which: ``read`` walks
from the scalar's node through multiplications and divisions by a constant scalar (a tensor that
needs no gradient, or a Python number, which autograd saves as one) and undoes each, down to the
node that computed the loss:

* a cross-entropy (``NllLossBackward0``, which ``F.cross_entropy``, ``nn.CrossEntropyLoss`` and a
  model's ``outputs.loss`` all end in), a squared error (``MseLossBackward0``) or a binary
  cross-entropy (``BCEWithLogitsLoss``, ``BCELoss``): the loss is that node's mean per element (a sum
  reduction is divided by the elements it summed: the labels not ignored, or the targets; so is such a
  loss with no reduction whose every element the script summed itself), whatever the script did with it
  after;
* anything else (a sum of terms, a custom loss): the scalar with the scalings above it undone, but for a division
  of a sum by a count, which is a mean written by hand, not a scaling: a token-level loss averaged over the
  tokens the mask keeps, ``-(log_probs * mask).sum() / mask.sum()`` (TRL's SFT loss is one), is read as written.
  Undone, the reading was the batch's sum over its tokens, which follows how many there are: stop 82's hunt's
  runs at rate 0 whose batches went longest first were called learned, their sums falling as the batches
  shortened.

A loss computed in the model's forward pass under DDP (a Hugging Face model's ``outputs.loss``, a
Lightning module's ``training_step``) passes through DDP's passthrough of the forward's outputs
(``_DDPSinkBackward``, with ``find_unused_parameters``, or a static graph's first step), which hands each
output on unchanged: the walk goes through it to the node that computed that output, where every output
before the loss is a tensor (``_tensors_before``; a Hugging Face model's loss is its first). Before, the walk
stopped there: a Hugging Face ``Trainer`` under two ranks (which multiplies its loss by the ranks, as it
divides by the labels of them all) was read at half its loss, and as no cross-entropy.

Only a factor's magnitude is undone: its sign is the script's (``-1.0 * log_likelihood`` handed to an
optimizer that maximizes is an objective to ascend, and stays one). A factor of exactly 0 (a term
switched off for a step, a loss weight warmed up from 0) hides what is below it: the scalar, 0, stands.
A backward pass from several scalars is the sum of them as written. A per-element loss (a cross-entropy
or squared error with no reduction) backwarded with weights (``per_sample.backward(weights)``) is the
weighted sum it differentiates; any other tensor backwarded with a gradient is no loss (a pipeline
stage's activations, with the gradient of what follows them).

Each reading says how it was read (``kind``: the nodes walked) and what divides the scalar as written
into the loss (``divisor``): the passes of one step that were read alike are its micro-batches, and
one read otherwise is another term of the same objective (stabilizer_sentinel.integration.guard,
``backward_pass``).

The value stays on the tensors' device: no host synchronisation. Reading the graph costs one
attribute read per node walked, a few at most.

This module must not change gradients or weights: it reads the nodes' saved tensors, never one the script's
saved-tensor hooks hold (``saved``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

CROSS_ENTROPY = ("NllLossBackward0", "NllLoss2DBackward0")
SQUARED_ERROR = "MseLossBackward0"
BINARY_CROSS_ENTROPY = ("BinaryCrossEntropyWithLogitsBackward0", "BinaryCrossEntropyBackward0")
LOSS_NODES = (*CROSS_ENTROPY, SQUARED_ERROR, *BINARY_CROSS_ENTROPY)
NONE, MEAN, SUM = 0, 1, 2  # the reduction codes autograd saves
MAX_SCALINGS = 8  # more nested scalings than any loop writes: what is left is read as the loss
REDUCTIONS = ("SumBackward0", "SumBackward1", "MeanBackward0", "MeanBackward1")
SHAPINGS = ("ViewBackward0", "ReshapeAliasBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1")
# An elementwise choice between terms (``torch.max(a, b)``, ``torch.min(a, b)``): PPO's clipped surrogate chooses, for
# each sample, between its two products by the advantages (``_chosen``).
CHOICES = ("MaximumBackward0", "MinimumBackward0")
# A vector's norm as autograd names it, and what ``F.normalize`` and ``F.cosine_similarity`` put between it and the
# division (``_unit_vectors``), walked through at most ``NORM_NODES`` nodes.
NORMS = ("LinalgVectorNormBackward0", "NormBackward0", "NormBackward1", "SqrtBackward0")
NORM_WRAPPERS = ("CloneBackward0", "ExpandBackward0", "ClampMinBackward0", "ClampBackward1", "ClampBackward0",
                 "MaximumBackward0", "AddBackward0", "AddBackward1", "UnsqueezeBackward0", "ViewBackward0")
NORM_NODES = 8
SURROGATE_TERMS = 64  # the terms of a gathered sum whose weights ``signed_weights`` reads: enough for both signs
SURROGATE_NODES = 64  # the nodes ``signed_weights`` walks through a loss's additions, at most
# Nodes that add terms up (``a + b``, ``a - b``, ``-a``, ``loss + 1``): walked through, never a term.
# DDP's passthrough of the forward's outputs: its output ``i`` is its input ``i`` (``torch.nn.parallel.distributed``).
PASSTHROUGHS = ("_DDPSinkBackward",)
# The identity autograd records where a tensor subclass returns its result as a view of itself (MONAI's
# ``MetaTensor``: every operation's result, its losses' too, is an alias): walked through as DDP's passthrough.
ALIASES = ("AliasBackward0",)
# A division of a full sum (``DIVISIONS`` above ``FULL_SUMS``) over no loss node of ``LOSS_NODES`` is a mean the
# script wrote by hand, read as written (``read``).
DIVISIONS = ("DivBackward0",)  # a number's division too (a script's number is saved as a tensor): ``_undo_scaling``
FULL_SUMS = ("SumBackward0", "SumBackward1")
SUMS = ("AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "RsubBackward0", "RsubBackward1",
        "NegBackward0")


@dataclass(frozen=True)
class BackwardLoss:
    value: torch.Tensor  # the loss, detached, on the scalar's device
    node: Any  # the loss node (a cross-entropy, squared error or binary cross-entropy), None for another loss
    scaled: bool  # the script scaled its loss before the backward pass (undone in ``value``)
    kind: tuple[str, ...] = ()  # how it was read: the names of the nodes walked from the scalar to the loss
    written: torch.Tensor | None = None  # the scalar as the script backwarded it (``value`` times ``divisor``)
    divisor: torch.Tensor | float = 1.0  # what the scalar as written was divided by to give ``value``
    loss_node: str | None = None  # the name of ``node``, or of the per-element loss node a weighted pass read

    def kept(self) -> BackwardLoss:
        """This reading without its node: one kept past its pass must not hold the pass's graph (its
        activations, its leaves) alive."""
        return replace(self, node=None)


class ScriptHeld(RuntimeError):  # noqa: N818 - the name says what it is: a tensor the script holds
    """A node's saved tensor that the script's saved-tensor hooks packed (``saved``): not read."""


def saved(node: Any, name: str) -> Any:
    """What ``node`` saved as ``name`` for its backward pass (``node._saved_<name>``), read only where no hooks of
    the script's packed it (``torch.autograd.graph.saved_tensors_hooks``): reading it calls the script's unpack
    hook, which may consume what it packed (pop it from a store, delete the file it wrote) before the backward
    pass needs it. Stop 86's harm hunt: the pattern of PyTorch's tutorial on saved-tensor hooks (pack to a file,
    unpack and delete it) failed in its backward pass, watched. Raises ``ScriptHeld`` (a ``RuntimeError``, as a
    node saved differently: each reader leaves what it cannot read) for such a tensor."""
    raw = getattr(node, f"_raw_saved_{name}", None)  # None for what no SavedVariable holds (a number, an int)
    if raw is not None and _hooked(raw):
        raise ScriptHeld(name)
    return getattr(node, f"_saved_{name}")


def _hooked(raw: Any) -> bool:
    """Whether the script's hooks packed ``raw`` (a ``SavedTensor``): it names its unpack hook, where the torch
    has that; else a pack hook that made something other than a tensor of it says so."""
    try:
        return raw.unpack_hook is not None
    except AttributeError:
        data = getattr(raw, "data", None)
        return data is not None and not isinstance(data, torch.Tensor)


def scalar_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The one scalar a backward pass starts from (None for several, or a non-scalar)."""
    if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and tensors[0].numel() == 1:
        return tensors[0]
    return None


def read(tensors: Sequence[torch.Tensor], gradients: Any = None) -> BackwardLoss | None:
    """The loss of a backward pass from ``tensors``; None when it starts from no scalar with a graph.

    A pass from several scalars (``torch.autograd.backward([l1, l2])``) computes the gradients of their
    sum, and its loss is that sum as the script wrote it: each scalar's constant factors are the weights
    of its objective (``[l1 / 2, l2 / 2]``), so none is undone, and there is no one loss node. None when
    any of them is no scalar with a graph (a tensor backwarded with the gradient of what follows it, as a
    pipeline stage does: no loss is there to read), unless it is one per-element loss given its weights
    (``gradients``, the pass's ``grad_tensors``: ``_weighted``)."""
    if len(tensors) > 1:
        if not all(scalar_of([tensor]) is not None and tensor.grad_fn is not None for tensor in tensors):
            return None
        wide = torch.float32  # float64 where any of them is (its values above float32's range stay finite)
        for tensor in tensors:
            wide = torch.promote_types(wide, tensor.dtype)
        total = tensors[0].detach().reshape(()).to(wide)
        for tensor in tensors[1:]:
            total = total + tensor.detach().reshape(()).to(total.device, wide)
        return BackwardLoss(total, None, False, ("several",) * len(tensors), total)
    scalar = scalar_of(tensors)
    if scalar is None or scalar.grad_fn is None:
        return _weighted(tensors, gradients)
    value = written = scalar.detach().reshape(())
    node, output = scalar.grad_fn, scalar.output_nr
    scaled = False
    kind = [node.name()]
    divisor: torch.Tensor | float = 1.0
    mean = None  # the reading as a division of a sum by a count left it: a mean written by hand (``FULL_SUMS``)
    try:
        for _ in range(MAX_SCALINGS):
            node, output = through_passthrough(node, output, kind)
            undone = _undo_scaling(node, value)
            if undone is None:
                break
            above = node
            if above.name() in DIVISIONS and _a_full_sum(undone[0]):
                mean = (value, divisor, scaled, (*kind, "mean"))
            node, value, by = undone
            output = output_into(above, node)
            divisor = divisor * by
            kind.append(node.name())
            scaled = True
        node, output = through_passthrough(node, output, kind)
        node = _summed_per_element(node)
        if node.name() in LOSS_NODES and int(node._saved_reduction) in (SUM, NONE):
            summed = _summed(node)
            value = value / summed
            divisor = divisor * summed
            kind.append("sum")
    except (AttributeError, RuntimeError, TypeError):  # a node saved differently: what was undone stands
        pass
    loss_node = node.name() if node.name() in LOSS_NODES else None
    if loss_node is None and mean is not None:
        value, divisor, scaled, kind = mean
    return BackwardLoss(value, node if loss_node else None, scaled, tuple(kind), written, divisor, loss_node)


def _a_full_sum(node: Any) -> bool:
    """Whether ``node`` sums a tensor whole (``FULL_SUMS``), negated or not (``-(log_probs * mask).sum()``)."""
    while node is not None and node.name() == "NegBackward0" and len(node.next_functions) == 1:
        node = node.next_functions[0][0]
    return node is not None and node.name() in FULL_SUMS


def through_passthrough(node: Any, output: int, kind: list[str] | None = None) -> tuple[Any, int]:
    """The node that computed output ``output`` of ``node`` and its own output number, through DDP's passthrough
    (``PASSTHROUGHS``) and aliases (``ALIASES``), each node reached named in ``kind``; ``node`` itself for any
    other."""
    while node is not None:
        if node.name() in ALIASES and len(node.next_functions) == 1:
            below, number = node.next_functions[0]
        elif node.name() in PASSTHROUGHS and _tensors_before(node, output) and output < len(node.next_functions):
            below, number = node.next_functions[output]
        else:
            break
        if below is None:
            break
        node, output = below, number
        if kind is not None:
            kind.append(node.name())
    return node, output


def _tensors_before(node: Any, output: int) -> bool:
    """Whether DDP's passthrough's outputs up to ``output`` are all tensors that need gradients. Its outputs are
    numbered over every value the forward returned (a number, a cache object among them) and its graph inputs over
    the tensors alone, after its first input (the DDP's reference, neither): only then is output ``i`` graph input
    ``i``. A Hugging Face model's loss is its outputs' first; a number returned before the loss stops the walk there
    (the review of stop 74: a dict's ``{"epoch": 1, "loss": ..., "aux": ...}`` read the next output, 1,000 times the
    loss)."""
    return all(node.needs_input_grad[1:output + 1])


def output_into(above: Any, below: Any) -> int:
    """Which output of ``below`` the scaling ``above`` took as its one graph input."""
    return next((number for node, number in above.next_functions if node is below), 0)


def _weighted(tensors: Sequence[torch.Tensor], gradients: Any) -> BackwardLoss | None:
    """A per-element loss (one of ``LOSS_NODES`` with no reduction) backwarded with weights of its
    shape: the weighted sum it differentiates (``per_sample.backward(weights)``: with weights of one over the
    count, the mean). None for anything else."""
    weights = gradients[0] if isinstance(gradients, list | tuple) and len(gradients) == 1 else gradients
    if len(tensors) != 1 or not isinstance(weights, torch.Tensor) or weights.shape != tensors[0].shape:
        return None
    node = tensors[0].grad_fn
    try:
        if node is None or node.name() not in LOSS_NODES or int(node._saved_reduction) != 0:
            return None
    except (AttributeError, RuntimeError, TypeError):
        return None
    total = (tensors[0].detach().float() * weights.detach().to(tensors[0].device, torch.float32)).sum()
    return BackwardLoss(total, None, False, ("weighted", node.name()), total, 1.0, node.name())


def constant_scaling(node: Any) -> tuple[Any, torch.Tensor, bool] | None:
    """(the node below, the constant, whether it divides) when ``node`` scales its one graph input by a
    constant scalar: a tensor of one element, or a number (then a tensor of the host's, as a number a script
    multiplies by is saved)."""
    name = node.name()
    if name in ("MulBackward1", "DivBackward1"):
        return _number_scaling(node)
    if name not in ("MulBackward0", "DivBackward0"):
        return None
    return _tensor_scaling(node)


def _tensor_scaling(node: Any) -> tuple[Any, torch.Tensor, bool] | None:
    """``constant_scaling`` for a product or a quotient of two tensors (``MulBackward0``, ``DivBackward0``)."""
    name = node.name()
    (left, _), (right, _) = node.next_functions
    if name == "DivBackward0":
        other = saved(node, "other")
        if left is None or right is not None or other is None or other.numel() != 1:
            return None
        return left, other, True
    if left is not None and right is None:
        below, factor = left, saved(node, "other")
    elif right is not None and left is None:
        below, factor = right, saved(node, "self")
    else:
        return None
    if factor is None or factor.numel() != 1:
        return None
    return below, factor, False


def _number_scaling(node: Any) -> tuple[Any, torch.Tensor, bool] | None:
    """``constant_scaling`` for a scaling by a number, as torch's own code records one (``MulBackward1``,
    ``DivBackward1``: a label-smoothed cross-entropy weighs its two terms so)."""
    other = saved(node, "other")
    if isinstance(other, bool) or not isinstance(other, int | float) or len(node.next_functions) != 1:
        return None
    below = node.next_functions[0][0]
    if below is None:
        return None
    return below, torch.tensor(float(other), dtype=torch.float64), node.name() == "DivBackward1"


def _undo_scaling(node: Any, value: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor] | None:
    """(the node below, the value before it, what the scaling multiplied it by) when ``node`` scales its one
    graph input by a constant scalar. Not by a number: torch's own code scales so (a label-smoothed
    cross-entropy weighs its two terms by numbers), and what it returns is the loss, not a loss the script
    scaled, whose factors are tensors (a number a script multiplies by is saved as one)."""
    scaling = constant_scaling(node) if node.name() in ("MulBackward0", "DivBackward0") else None
    if scaling is None:
        return None
    below, factor, divides = scaling
    factor = factor.detach().reshape(()).abs()
    if divides:
        return below, value * factor, 1 / factor
    # A factor of exactly 0 (a loss term switched off, a weight warmed up from 0) hides the value below:
    # the scalar, 0, stands (divided by 1, on the device: no host read).
    factor = factor + (factor == 0)
    return below, value / factor, factor


def signed_weights(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Whether the pass's loss is, or adds up, a sum (or mean) of terms weighted by constants of both signs, on
    the device (no host read); None when it is not of that form.

    A policy gradient's surrogate is one: ``-(log_probs * advantages).sum()``, or each step's
    ``-log_prob * R`` gathered by ``torch.cat``/``torch.stack`` and summed, after the constant scalings
    ``read`` undoes. Its advantages have both signs, and its value measures no fit: as the policy grows
    sure of its actions their log-probabilities rise to 0 and the surrogate with them, while the return
    climbs. So does an actor-critic's loss that adds it to its value loss and an entropy bonus
    (``policy + 0.5 * value - 0.01 * entropy``: the terms below additions, subtractions, negations and
    constant scalings are each read; a healthy A2C on CartPole, its episodes 24 steps long to 127, was
    stopped as NotLearning at step 244, stop 65's hunt). Terms weighted by constants of one sign (class
    weights, a mask) are a weighted loss, and a product inside another function (a hinge's
    ``clamp(1 - y * f(x))``) no sum of weighted terms."""
    scalar = scalar_of(tensors)
    if scalar is None or scalar.grad_fn is None:
        return None
    found: torch.Tensor | None = None
    queue: deque[Any] = deque([scalar.grad_fn])
    walked = 0
    try:
        while queue and walked < SURROGATE_NODES:
            node = queue.popleft()
            walked += 1
            scaling = None if node is None else constant_scaling(node)
            if scaling is not None:
                queue.append(scaling[0])
            elif node is not None and node.name() in SUMS:
                queue.extend(below for below, _ in node.next_functions if below is not None)
            elif node is not None and (signed := _signed(node)) is not None:
                found = signed if found is None else found | signed.to(found.device)
    except (AttributeError, RuntimeError, TypeError):  # a node saved differently: what was read stands
        pass
    return found


def _signed(node: Any) -> torch.Tensor | None:
    """``signed_weights`` for one term: a reduction of terms weighted by constants, of both signs.

    Below the reduction, further reductions, reshapings and products by constants are walked through, each
    constant's signs read: a REINFORCE loss summed over an episode's steps and averaged over episodes,
    ``-(returns * log_probs).sum(1).mean()``, or multiplied by a mask of the steps each episode lived,
    ``-(returns * log_probs * alive).mean()``, is as much a surrogate as ``-(returns * log_probs).mean()`` (stop 69's
    hunt: a healthy REINFORCE written so was rolled back as Diverging three times, its return -1.0 where it
    reached 0.8 unwatched)."""
    try:
        if node.name() not in REDUCTIONS:
            return None
        found: torch.Tensor | None = None
        node = node.next_functions[0][0]
        for _ in range(SURROGATE_NODES):
            if node is None:
                break
            if node.name() in REDUCTIONS or node.name() in SHAPINGS:
                node = node.next_functions[0][0]
                continue
            if node.name() in ("CatBackward0", "StackBackward0"):
                return _either(found, _gathered(node))
            if node.name() in CHOICES:
                return _either(found, _chosen(node))
            weights = _constant_factor(node)
            if weights is None or _unit_vectors(_graph_input(node)):
                break
            if weights.numel() >= 2:
                flat = weights.detach()
                found = _either(found, (flat.amin() < 0) & (flat.amax() > 0))
            node = _graph_input(node)
        return found
    except (AttributeError, RuntimeError, TypeError):  # a node saved differently: no such sum
        return None


def _unit_vectors(node: Any) -> bool:
    """Whether ``node`` divides vectors by their own norm (``F.normalize``, inside ``F.cosine_similarity``): a
    product of those by a constant, summed, is a cosine similarity to fixed directions (BYOL's and SimSiam's
    loss, an embedding regressed by its angle), whose directions' signs weigh no terms (stop 71's hunt: a healthy
    BYOL and a cosine regression were read as a policy gradient's surrogate and never judged)."""
    if node is None or node.name() != "DivBackward0":
        return False
    queue, walked = deque(below for below, _ in node.next_functions if below is not None), 0
    while queue and walked < NORM_NODES:
        below, walked = queue.popleft(), walked + 1
        if below.name() in NORMS:
            return True
        if below.name() in NORM_WRAPPERS:
            queue.extend(further for further, _ in below.next_functions if further is not None)
    return False


def _either(found: torch.Tensor | None, signed: torch.Tensor | None) -> torch.Tensor | None:
    if found is None or signed is None:
        return signed if found is None else found
    return found | signed.to(found.device)


def _chosen(node: Any) -> torch.Tensor | None:
    """``_signed`` for an elementwise choice between two terms, each a product by constants: PPO's clipped
    surrogate, ``torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - c, 1 + c)).mean()`` (CleanRL's; SB3's
    ``-torch.min(advantages * ratio, ...).mean()``). Its value measures no fit as REINFORCE's does, and an actor-critic
    adds it to a value loss that rises with the returns (the RL hunt of stop 81: CleanRL's PPO on CartPole, healthy,
    rolled back three times as Diverging at its seed 1, its mean return 24 where unwatched 188; called Diverging at
    its end at seeds 2 and 3). A choice with a term that is no such product (a hinge written ``torch.max(0, 1 - y *
    f(x))``) is not one."""
    weights = [_constant_factor(term) if term is not None else None for term, _ in node.next_functions]
    if len(weights) != 2 or any(w is None or w.numel() < 2 for w in weights):
        return None
    terms = [_graph_input(term) for term, _ in node.next_functions]
    if any(_unit_vectors(term) for term in terms):
        return None
    flat = [w.detach() for w in weights]
    return _either((flat[0].amin() < 0) & (flat[0].amax() > 0), (flat[1].amin() < 0) & (flat[1].amax() > 0))


def _gathered(node: Any) -> torch.Tensor | None:
    """``_signed`` for terms gathered by ``torch.cat``/``torch.stack``: each a term times a constant scalar."""
    terms = [_through_shape(term) for term, _ in node.next_functions[:SURROGATE_TERMS]]
    weights = [_constant_factor(term) for term in terms]
    if len(weights) < 2 or any(w is None or w.numel() != 1 for w in weights):
        return None
    flat = torch.stack([w.detach().reshape(()).to(weights[0].device, torch.float32) for w in weights])
    return (flat.amin() < 0) & (flat.amax() > 0)


def _summed_per_element(node: Any) -> Any:
    """The per-element loss node (no reduction) whose every element ``node`` sums, through reshapings (the script's
    ``per_row.sum() / len(batch)``, or ``per_row.sum(0, keepdim=True)``: a sum whose result is the pass's one
    element summed them all); else ``node``. Stop 72's hunt: such a loss was read through the division as its sum,
    the batch size times the script's."""
    total = _through_shape(node)
    if total is None or total.name() not in ("SumBackward0", "SumBackward1"):
        return node
    below = _through_shape(total.next_functions[0][0])
    if below is not None and below.name() in LOSS_NODES and int(below._saved_reduction) == NONE:
        return below
    return node


def _graph_input(node: Any) -> Any:
    """The one graph input of a product by a constant (``_constant_factor`` found it)."""
    (left, _), (right, _) = node.next_functions
    return left if right is None else right


def _through_shape(node: Any) -> Any:
    """The node below a reshaping of one input (a term viewed as one element before it is gathered)."""
    while node is not None and node.name() in SHAPINGS:
        node = node.next_functions[0][0]
    return node


def _constant_factor(node: Any) -> torch.Tensor | None:
    """The constant one side of a product (``MulBackward0``) with one graph input multiplies it by."""
    if node is None or node.name() != "MulBackward0":
        return None
    (left, _), (right, _) = node.next_functions
    if (left is None) == (right is None):
        return None
    return saved(node, "other") if right is None else saved(node, "self")


def _summed(node: Any) -> torch.Tensor:
    """How many elements a sum-reduced loss node added up (kept on the device)."""
    target = saved(node, "target")
    if node.name() in CROSS_ENTROPY:
        return kept_labels(node).sum().clamp(min=1)
    return torch.tensor(max(target.numel(), 1), device=target.device)


def kept_labels(node: Any) -> torch.Tensor:
    """Which of a cross-entropy node's labels its loss counts (those not its ``ignore_index``), on the device."""
    ignore = int(node._saved_ignore_index)
    ignore = ignore - 2**64 if ignore >= 2**63 else ignore  # saved as an unsigned integer
    return saved(node, "target").detach() != ignore
