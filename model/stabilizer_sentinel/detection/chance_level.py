"""The chance level of a loss: what the best prediction that ignores the inputs scores.

A model that has learned nothing about its inputs can still lower its loss: it learns the labels'
prior (a classifier's loss falls from a badly scaled start to the entropy of its labels) or the
targets' mean (a regression's loss falls to their variance). That fall is real, and says nothing
about learning. No input-blind prediction does better than this level, so a loss below it by more
than the noise is positive evidence of learning, whatever the start, and a loss that never gets
below it has not learned, whatever its fall. For a loss whose level is known:

* **cross-entropy** (``nll_loss`` after ``log_softmax``, as ``cross_entropy`` and
  ``nn.CrossEntropyLoss`` compute it; mean reduction, no class weights): the entropy of the labels
  seen in training, ignored labels left out (a language model's level is the entropy of its tokens'
  frequencies);
* **mean squared error** (mean reduction): the variance of each target column seen in training,
  averaged over the columns.

The level is read from the loss node of the scalar every backward pass starts from
(``torch.autograd.backward``, wrapped by stabilizer_sentinel.loops.bare_tensors; the node found through
the scalings a script applies before its backward pass by stabilizer_sentinel.loops.backward_loss). A
scaled loss (divided by the accumulation steps, multiplied by a loss scaler) has the level of its
node only where the loss the check judges is the node's own (the launcher's, read from the backward
pass: ``accept_scaled``); a loss the script reports itself after scaling it would be judged against
a level it is not on, so there the level stays unknown. Anything else, a sum of terms (a GAN's two
losses, a regulariser), a sum reduction the script does not divide, leaves the level unknown for
the rest of the run: the learning check then judges the fall from the start alone, and says so. So
does one backward pass of another kind.

This module must not change gradients or weights: it reads the saved targets of the loss's node.
Counts stay on the tensors' device; they are read (one synchronisation) when the check asks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from stabilizer_sentinel.loops import backward_loss, bare_tensors
from stabilizer_sentinel.loops.backward_loss import CROSS_ENTROPY, MEAN, SQUARED_ERROR, SUM

# A squared error's targets have moved (another task's, a regression's next stage) when the best input-blind
# prediction of the targets seen before scores more than this many times its level on the targets since
# (``ChanceLevel.moved``), in this many checks in a row (a batch with a far outlier is one check).
MOVED = 4.0
MOVED_CHECKS = 2
# Labels per class (or targets) seen before the level is used: the entropy of a prior estimated
# from n labels is low by about (classes - 1) / (2 n); with ten per class that is under 5 % of ln 2.
SAMPLES_PER_CLASS = 10


class ChanceLevel:
    """The chance level of the loss every backward pass starts from; None while unknown."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.off = False  # a backward pass this module cannot read: unknown for the rest of the run
        self.accept_scaled = False  # the loss judged is the loss node's own, however the script scaled it
        self.reason: str | None = None  # why the level is unknown, once off
        self._counts: torch.Tensor | None = None  # cross-entropy: labels per class
        self._sums: torch.Tensor | None = None  # squared error: per column, count, sum and sum of squares
        # (count, ``_sums``) of the targets since each of the last checks whose targets had moved, and since the last
        # (``moved``)
        self._since: list[tuple[int, torch.Tensor]] = []
        self._samples = 0
        self._needed = 0
        self._classes: int | None = None  # cross-entropy: the width of its scores
        self._read: tuple[int, float | None] | None = None  # (samples, level) of the last read: one per step

    def observe(self, tensors: Sequence[torch.Tensor]) -> None:
        """One backward pass is about to run from ``tensors``."""
        if self.off:
            return
        read = backward_loss.read(tensors)
        if read is None or read.node is None:
            self._give_up("the loss is neither a cross-entropy nor a squared error (a sum of terms, another loss)")
            return
        node = read.node
        name = node.name()
        try:
            # Where the check judges the script's own loss, only an unscaled mean is on the node's level.
            judged_here = self.accept_scaled or (not read.scaled and int(node._saved_reduction) == MEAN)
            if not judged_here or int(node._saved_reduction) not in (MEAN, SUM):
                self._give_up("the loss reported is scaled or summed, not the mean its level is of")
            elif name in CROSS_ENTROPY and self.kind in (None, "cross_entropy"):
                self._cross_entropy(node)
            elif name == SQUARED_ERROR and self.kind in (None, "squared_error"):
                self._squared_error(node)
            else:
                self._give_up("the backward passes start from losses of different kinds")
        except (AttributeError, IndexError, RuntimeError, ValueError):  # a node saved differently
            self._give_up("its loss node could not be read")

    def _give_up(self, reason: str) -> None:
        self.off = True
        self.reason = self.reason or reason

    def _cross_entropy(self, node: Any) -> None:
        if node._saved_weight is not None:
            self._give_up("the cross-entropy weighs its classes")
            return
        scores = node._saved_self
        classes = scores.shape[1] if scores.dim() > 1 else scores.shape[0]
        if self._classes is not None and classes != self._classes:
            # Another classifier (a sweep's next task, a head with more classes): its labels would index past
            # the counts (an IndexError raised in the script's backward pass, stop 63), and no one prior is both's.
            self._give_up("the cross-entropy's classes change between steps")
            return
        ignore = int(node._saved_ignore_index)
        ignore = ignore - 2**64 if ignore >= 2**63 else ignore  # saved as an unsigned integer
        labels = node._saved_target.detach().reshape(-1)
        kept = labels != ignore  # counted by weight, not selected: a selection would wait for the device
        if self._counts is None:
            self._counts = torch.zeros(classes, dtype=torch.float64, device=labels.device)
        self._counts.index_add_(0, torch.where(kept, labels, 0), kept.double())
        self.kind = "cross_entropy"
        self._classes = classes
        self._samples += labels.numel()
        self._needed = SAMPLES_PER_CLASS * classes

    def _squared_error(self, node: Any) -> None:
        target = node._saved_target.detach()
        if target.shape != node._saved_self.shape or target.dim() == 0:
            self._give_up("the squared error broadcasts its targets")
            return
        rows = target.reshape(target.shape[0], -1).double()
        sums = torch.stack([torch.full_like(rows[0], rows.shape[0]), rows.sum(0), (rows * rows).sum(0)])
        if self._sums is not None and self._sums.shape != sums.shape:
            self._give_up("the targets change shape between steps")
            return
        self._sums = sums if self._sums is None else self._sums + sums
        count, block = self._since[-1] if self._since else (0, torch.zeros_like(sums))
        self._since[-1:] = [(count + rows.shape[0], block + sums)]
        self.kind = "squared_error"
        self._samples += rows.shape[0]
        self._needed = SAMPLES_PER_CLASS * 3  # thirty targets: the variance to within about a quarter

    def moved(self) -> bool:
        """Whether a squared error's targets moved since the checks before (``MOVED``): the mean of the targets
        seen before, the best input-blind prediction of them, scored ``MOVED`` times their variance on the
        targets since each of the last ``MOVED_CHECKS`` calls (thirty targets at least each). Then the level is
        measured afresh from those targets, and True. One host synchronisation per call, for a squared error
        alone; the learning check calls it once a window."""
        if self.off or self.kind != "squared_error" or not self._since or self._sums is None:
            return False
        count, since = self._since[-1]
        moved = sum(samples for samples, _ in self._since)
        if count < SAMPLES_PER_CLASS * 3:
            return False  # too few targets since to tell: wait for more
        if self._samples - moved < self._needed:
            self._since = []  # too few before: what came since is the level's start
            return False
        n, total, squares = self._sums - sum(block for _, block in self._since)
        mean = total / n
        variance = (squares / n - mean * mean).clamp(min=0)
        _, since_total, since_squares = since
        scored = (since_squares - 2 * mean * since_total + count * mean * mean) / count  # the old mean's error
        ratio = float(scored.mean() / variance.mean().clamp(min=torch.finfo(torch.float64).tiny))
        if not ratio > MOVED:
            self._since = []
        elif len(self._since) < MOVED_CHECKS:
            self._since.append((0, torch.zeros_like(since)))
        else:
            self._sums = sum(block for _, block in self._since)
            self._samples, self._since = moved, []
            return True
        return False

    def level(self) -> float | None:
        """The loss of the best input-blind prediction of the targets seen so far; None while unknown.

        Read from the device once per backward pass at most: the checks that ask for it again before
        the next targets arrive (several at the close of a window) get the value already read."""
        if self.off or self.kind is None or self._samples < self._needed:
            return None
        if self._read is None or self._read[0] != self._samples:
            self._read = (self._samples, self._measure())
        return self._read[1]

    def _measure(self) -> float | None:
        if self._counts is not None:
            p = self._counts.double() / self._counts.sum()
            p = p[p > 0]
            return float(-(p * p.log()).sum())  # a host synchronisation on an accelerator
        assert self._sums is not None
        n, total, squares = self._sums
        value = float((squares / n - (total / n) ** 2).clamp(min=0).mean())  # likewise
        return value if math.isfinite(value) else None

    def error(self) -> float:
        """The standard error of ``level()`` (0 while it is unknown): a squared error's is its variance's
        from the targets seen, the level times sqrt(2 / (n - 1)) (the columns' variances averaged may move
        together, so no fewer); a cross-entropy's, the bias of an entropy estimated from n labels,
        (classes - 1) / (2 n)."""
        level = self.level()
        if level is None or self._samples < 2:
            return 0.0
        if self.kind == "squared_error":
            return level * math.sqrt(2.0 / (self._samples - 1))
        return ((self._classes or 1) - 1) / (2.0 * self._samples)

    def ceiling(self) -> float | None:
        """The level, or while it is still being measured a bound above it: for a cross-entropy the
        loss of the uniform prediction, ln of its classes (no prior's entropy is higher), known from
        the first backward pass; None while neither is known."""
        level = self.level()
        if level is not None or self.off or self._classes is None:
            return level
        return math.log(self._classes)


def listen(owner: object) -> ChanceLevel:
    """A chance level fed by every backward pass of this process while ``owner`` lives."""
    chance = ChanceLevel()
    bare_tensors.listen_while(owner, chance.observe)
    return chance
