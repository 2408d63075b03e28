"""Whether the network's output stopped depending on its input: a dead or collapsed network.

A rate far too high can kill a network (every ReLU unit dead, a sigmoid saturated): its output is then
its last layer's bias, the same for every input. Its loss still falls, to the best constant's (a
segmentation's Dice loss to an empty mask's, a quantile regression's to the targets' quantile), and
where the loss's chance level is unknown (stabilizer_sentinel.detection.chance_level: a custom loss, a
sum of terms) that fall read as learning. No fall of the loss says as much as the output itself: a
network whose outputs for different inputs are equal, to the last bit, has learned nothing about them.

Each forward pass of the watched network in training (its ``training`` flag set, gradients on) is
counted, and one in ``EVERY`` is read: up to ``SAMPLE`` values spread evenly over each of up to ``ROWS``
rows (first, last and evenly between) of its input and of each of its outputs with the same number of
rows. A pass whose input rows differ is evidence; its output is input-blind when every such output's
rows are equal. The passes read in a row that were input-blind (``streak``) are counted on the device,
with no synchronisation; the learning check reads the count (one synchronisation) at the end of the
run, and a run whose last ``STREAK`` passes read were all input-blind did not learn, whatever its loss
did. A pass with no evidence (one row, inputs alike, no tensor of the batch's rows, a call with keyword
arguments alone) changes nothing.

Equal means equal: an output that differs in any sampled value is not input-blind, so a network
alive in one unit, or one with a large offset and a small spread (a price regression), is never
called blind. Rows equal at a bound of an output activation (every sampled value 0, 1 or -1) are no
evidence either way: a ReLU forecaster at its floor for a dry season's targets of 0, and a sigmoid
classifier saturated to exactly 1.0 for eight positive rows of data 99 % positive, are alive (the stop
56 hunt found both; a dead network behind such an activation, saturated at its bound, is missed). A network
that ignores its input by design (a generator with no noise, a learned prior) is called without an
input that varies: no evidence. The sample is spread over the whole row: a left-padded tagger's first
512 output values are its padding, the same in every row.

Cost: a few small kernels on at most ``ROWS`` x ``SAMPLE`` values of the input and the output, for one
training pass in ``EVERY`` (63 to 90 us a read on this CPU for a small language model's tokens and logits).
Not under ``torch.compile``, tracing, CUDA graph capture or a ``torch.func`` transform (``vmap`` of the
network for per-sample gradients), and not for tensor subclasses (a ``DTensor``): those passes are not
read.

This module must not change gradients or weights: it reads detached values under ``no_grad``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from stabilizer_sentinel.capture import module_hooks

ROWS = 8  # rows compared per pass
SAMPLE = 512  # values compared per row, spread evenly over it
EVERY = 4  # one training pass in this many is read: the cost of a few small kernels, a quarter as often
STREAK = 10  # input-blind passes read in a row (over EVERY x as many), at the end of a run that did not learn
DEPTH = 2  # how deep the containers of a pass's inputs and outputs are searched for tensors
INDICES = 16  # sampling indices kept, by rows and width (a batch padded to its longest clip changes width)


class InputBlind:
    """The count of the network's last forward passes in training, in a row, whose output ignored its input."""

    def __init__(self) -> None:
        self._streak: torch.Tensor | None = None  # on the device of the first pass read
        self._indices: dict[tuple[int, int, torch.device], torch.Tensor] = {}
        self._passes = 0  # training passes seen (a host count): one in ``EVERY`` is read
        self.off = False  # a pass could not be read: no verdict from this module for the rest of the run

    def observe(self, module: nn.Module, args: Any, output: Any) -> None:
        """A forward pass of the watched network returned ``output`` for ``args``."""
        if self.off or not module.training or not torch.is_grad_enabled():
            return
        self._passes += 1
        if self._passes % EVERY or _not_plain_time():
            return
        try:  # a tensor this cannot read (nested, sparse, quantized), an output object of any make: no verdict
            self._read(args, output)  # from here, and no harm to the pass
        except Exception:
            self.off = True

    def _read(self, args: Any, output: Any) -> None:
        outputs = [t for t in _tensors(output, DEPTH) if t.is_floating_point() and t.dim() >= 1]
        rows = {t.shape[0] for t in outputs if t.shape[0] >= 2}
        inputs = [t for t in _tensors(args, DEPTH) if t.dim() >= 1 and t.shape[0] in rows]
        if not inputs:
            return
        n = inputs[0].shape[0]
        outputs = [t for t in outputs if t.shape[0] == n]
        inputs = [t for t in inputs if t.shape[0] == n]
        if all(t.dim() == 1 for t in (*inputs, *outputs)):  # one vector in, one out: no rows (an unbatched call)
            return
        with torch.no_grad():
            varied = _any(_differs(self._sample(t)) for t in inputs)
            read = [(_differs(sample), _at_bound(sample)) for sample in map(self._sample, outputs)]
            live = _any(differs for differs, _ in read)
            constant = _any(~differs & ~bound for differs, bound in read)  # equal rows, off any bound
            streak = self._streak if self._streak is not None else torch.zeros((), dtype=torch.int64,
                                                                               device=varied.device)
            evidence = _on(varied & (live | _on(constant, varied.device)), streak.device)
            self._streak = torch.where(evidence, (streak + 1) * _on(~live, streak.device), streak)

    def streak(self) -> int:
        """The input-blind passes in a row so far (a host synchronisation on an accelerator); 0 where the count
        cannot be read (the check then turns off: a verdict is never worth a run's end)."""
        if self.off or self._streak is None:
            return 0
        try:
            return int(self._streak)
        except (RuntimeError, TypeError, ValueError):
            self.off = True
            return 0

    def blind(self) -> str | None:
        """Why the run's network is input-blind (its last ``STREAK`` passes read were), else None."""
        streak = self.streak()
        if streak < STREAK:
            return None
        return (f"its network's output was the same for every input in the last {streak} of its forward passes "
                f"in training read (one in {EVERY}, over its last {streak * EVERY}: a dead or collapsed network, "
                f"each output's rows equal while its input's differed), so its loss fell no further than a "
                f"constant prediction's")

    def _sample(self, tensor: torch.Tensor) -> torch.Tensor:
        """Up to ``SAMPLE`` values spread over each of up to ``ROWS`` rows of ``tensor``, one row of the result each."""
        n = tensor.shape[0]
        width = tensor.numel() // n
        key = (n, width, tensor.device)
        index = self._indices.get(key)
        if index is None:  # made on the device from nothing the host holds: no copy, no synchronisation
            count = min(n, ROWS)
            rows = torch.arange(count, device=tensor.device) * (n - 1) // max(count - 1, 1)
            # Spread over the whole row: a row's first values can be its padding, the same in every row.
            columns = torch.arange(min(width, SAMPLE), device=tensor.device) * width // min(width, SAMPLE)
            index = rows[:, None] * width + columns[None, :]
            if len(self._indices) >= INDICES:  # inputs whose width changes every batch: keep a few
                self._indices.clear()
            self._indices[key] = index
        return torch.take(tensor.detach(), index)


def _differs(sample: torch.Tensor) -> torch.Tensor:
    """Whether any sampled row differs from the first, as a boolean on the sample's device."""
    return (sample != sample[:1]).any()


def _at_bound(sample: torch.Tensor) -> torch.Tensor:
    """Whether every sampled value of an output lies at a bound of an output activation (0, 1 or -1, to a few
    units of the last place). Output rows equal at such a bound are no evidence either way: a ReLU output at
    its floor for targets of 0, a sigmoid a confident classifier saturated to exactly 1.0 for eight positive
    rows, are a live network's as often as a dead one's."""
    ulps = 4 * torch.finfo(sample.dtype).eps
    return ((sample == 0) | ((sample.abs() - 1).abs() <= ulps)).all()


def _any(flags: Iterator[torch.Tensor]) -> torch.Tensor:
    result: torch.Tensor | None = None
    for flag in flags:
        result = flag if result is None else result | _on(flag, result.device)
    assert result is not None
    return result


def _on(flag: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``flag`` on ``device`` (moved only where it is on another: a model split over devices)."""
    return flag if flag.device == device else flag.to(device, non_blocking=True)


def _tensors(value: Any, depth: int) -> Iterator[torch.Tensor]:
    """The plain tensors in ``value``, in its tuples, lists and dicts (a model's output object) to ``depth``."""
    if type(value) in (torch.Tensor, nn.Parameter):
        if value.device.type != "meta":
            yield value
    elif depth > 0 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth - 1)


def _not_plain_time() -> bool:
    """Whether the pass is being compiled, traced or captured (its operations would become the graph's), or
    runs under a ``torch.func`` transform (``vmap``: its tensors are batched, and a count made of them would
    escape the transform)."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return True
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    if peek is not None and peek() is not None:
        return True
    return torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def listen(module: nn.Module) -> tuple[InputBlind, module_hooks.Handle]:
    """An input-blind check fed by every forward pass of ``module``, and the handle that stops it."""
    check = InputBlind()
    return check, module_hooks.forward_hook(module, check.observe)
