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
  averaged over the columns;
* **binary cross-entropy** (``BCEWithLogitsLoss``, ``BCELoss``; no weights): the binary entropy of
  each target column's mean seen in training (targets of 0 and 1, or soft ones: the loss is linear in
  them), averaged over the columns, judged at the end of a run given its patience alone (``TermLevel``,
  ``BINARY``). Not where most passes' targets are all alike: a GAN's discriminator is given all-real
  then all-fake labels, and its generator all-real ones, each pass's loss its own (``ALIKE``).

The level is read from the loss node of the scalar every backward pass starts from
(``torch.autograd.backward``, wrapped by stabilizer_sentinel.loops.bare_tensors; the node found through
the scalings a script applies before its backward pass by stabilizer_sentinel.loops.backward_loss). A
scaled loss (divided by the accumulation steps, multiplied by a loss scaler) has the level of its
node only where the loss the check judges is the node's own (the launcher's, read from the backward
pass: ``accept_scaled``); a loss the script reports itself after scaling it would be judged against
a level it is not on, so there the level stays unknown. Anything else, a sum of terms (a GAN's two
losses, a regulariser), a sum reduction the script does not divide, leaves the level unknown for
the rest of the run: the learning check then judges the fall from the start alone, and says so. So
does one backward pass of another kind. Where every pass is a sum of terms exactly one of which has a
known level (a cross-entropy plus a penalty on the weights), or several multi-class cross-entropies (a
contrastive loss's two, of a score matrix and of its transpose; a network's auxiliary heads), or a binary
cross-entropy alone, those terms are judged against their own level at the end of a run given its patience
(``TermLevel``): a fall of the sum that is the other terms' alone is no learning, nor a classifier's fall to
its labels' prior.

This module must not change gradients or weights: it reads the saved targets of the loss's node.
Counts stay on the tensors' device; they are read (one synchronisation) when the check asks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.nn import functional

from stabilizer_sentinel.loops import backward_loss, bare_tensors
from stabilizer_sentinel.loops.backward_loss import (
    BINARY_CROSS_ENTROPY,
    CROSS_ENTROPY,
    LOSS_NODES,
    MEAN,
    SQUARED_ERROR,
    SUM,
    saved,
)

# A squared error's targets have moved (another task's, a regression's next stage) when the best input-blind
# prediction of the targets seen before scores more than this many times its level on the targets since
# (``ChanceLevel.moved``), in this many checks in a row (a batch with a far outlier is one check).
MOVED = 4.0
MOVED_CHECKS = 2
# Why a binary cross-entropy's level is unknown when most of its passes' targets were all alike.
ALIKE = ("its targets were all alike within most passes (a GAN's real and fake labels, each pass's own): the "
         "labels' prior is no level of a loss of such passes")
# Why a binary cross-entropy's level is not the learning check's all along: a binary classifier's healthy start can
# spike to thirty times its level, ln 2 at most (full-batch descent at rate 20 on two moons: 25 in its first steps),
# and a siamese network's 32 steps end at about it (0.63, test accuracy 55 %); its level is judged at the end of a
# run given its patience (``TermLevel``), measured on the corpora at stop 65.
BINARY = ("the loss is a binary cross-entropy, whose level (the entropy of its targets' means) is judged at the end "
          "of a run given its patience alone")
# Labels per class (or targets) seen before the level is used: the entropy of a prior estimated
# from n labels is low by about (classes - 1) / (2 n); with ten per class that is under 5 % of ln 2.
SAMPLES_PER_CLASS = 10
# Nodes walked per pass at most in search of a sum's known term (``known_term``): a sum of more is left unread.
MAX_TERM_NODES = 64


class ChanceLevel:
    """The chance level of the loss every backward pass starts from; None while unknown."""

    def __init__(self, *, binary: bool = False) -> None:
        self.kind: str | None = None
        # Whether a binary cross-entropy has a level here: a term's (``TermLevel``), judged at the run's end alone.
        self.binary = binary
        self.off = False  # a backward pass this module cannot read: unknown for the rest of the run
        self.accept_scaled = False  # the loss judged is the loss node's own, however the script scaled it
        self.reason: str | None = None  # why the level is unknown, once off
        self._counts: torch.Tensor | None = None  # cross-entropy: labels per class
        self._sums: torch.Tensor | None = None  # squared error: per column, count, sum and sum of squares
        # (count, ``_sums``) of the targets since each of the last checks whose targets had moved, and since the last
        # (``moved``)
        self._since: list[tuple[int, torch.Tensor]] = []
        self._alike: torch.Tensor | None = None  # binary cross-entropy: passes whose targets were all alike
        self._passes = 0  # binary cross-entropy: passes counted
        # Binary cross-entropy: the sum of its targets' binary entropies (on the device) and their count (``floor``).
        self._entropy: torch.Tensor | None = None
        self._elements = 0
        self._floor: float | None = None  # ``floor()`` as last measured with the level
        self._samples = 0
        self._needed = 0
        self._classes: int | None = None  # cross-entropy: the width of its scores
        self._read: tuple[int, float | None] | None = None  # (samples, level) of the last read: one per step
        self._block: torch.Tensor | None = None  # squared error: ``_sums`` of the targets since ``take_block``

    def observe(self, tensors: Sequence[torch.Tensor]) -> None:
        """One backward pass is about to run from ``tensors``."""
        if self.off:
            return
        read = backward_loss.read(tensors)
        if read is None or read.node is None:
            self._give_up("the loss is neither a cross-entropy nor a squared error (a sum of terms, another loss)")
            return
        # Where the check judges the script's own loss, only an unscaled mean is on the node's level.
        self.take(read.node, judged_here=self.accept_scaled or not read.scaled)

    def take(self, node: Any, *, judged_here: bool = True) -> None:
        """Count the targets of one pass's loss node (``judged_here``: the loss judged is that node's own)."""
        if self.off:
            return
        name = node.name()
        try:
            reduction = int(node._saved_reduction)
            if reduction not in (MEAN, SUM) or not (judged_here and (self.accept_scaled or reduction == MEAN)):
                self._give_up("the loss reported is scaled or summed, not the mean its level is of")
            elif name in CROSS_ENTROPY and self.kind in (None, "cross_entropy"):
                self._cross_entropy(node)
            elif name == SQUARED_ERROR and self.kind in (None, "squared_error"):
                self._squared_error(node)
            elif name in BINARY_CROSS_ENTROPY and not self.binary:
                self._give_up(BINARY)
            elif name in BINARY_CROSS_ENTROPY and self.kind in (None, "binary_cross_entropy"):
                self._binary(node)
            else:
                self._give_up("the backward passes start from losses of different kinds")
        except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):  # a node saved differently
            self._give_up("its loss node could not be read")

    def _give_up(self, reason: str) -> None:
        self.off = True
        self.reason = self.reason or reason

    def _cross_entropy(self, node: Any) -> None:
        if saved(node, "weight") is not None:
            self._give_up("the cross-entropy weighs its classes")
            return
        scores = saved(node, "self")
        classes = scores.shape[1] if scores.dim() > 1 else scores.shape[0]
        if self._classes is not None and classes != self._classes:
            # Another classifier (a sweep's next task, a head with more classes): its labels would index past
            # the counts (an IndexError raised in the script's backward pass, stop 63), and no one prior is both's.
            self._give_up("the cross-entropy's classes change between steps")
            return
        labels = saved(node, "target").detach().reshape(-1)
        kept = backward_loss.kept_labels(node).reshape(-1)  # counted by weight, not selected: a selection waits
        if self._counts is None:
            self._counts = torch.zeros(classes, dtype=torch.float64, device=labels.device)
        self._counts.index_add_(0, torch.where(kept, labels, 0), kept.double())
        self.kind = "cross_entropy"
        self._classes = classes
        self._samples += labels.numel()
        self._needed = SAMPLES_PER_CLASS * classes

    def _squared_error(self, node: Any) -> None:
        counted = self._count_rows(node)
        if counted is None:
            return
        rows, sums = counted
        count, block = self._since[-1] if self._since else (0, torch.zeros_like(sums))
        self._since[-1:] = [(count + rows, block + sums)]
        self._block = sums if self._block is None else self._block + sums
        self.kind = "squared_error"
        self._needed = SAMPLES_PER_CLASS * 3  # thirty targets: the variance to within about a quarter

    def _binary(self, node: Any) -> None:
        if saved(node, "weight") is not None or _optional(node, "pos_weight") is not None:
            self._give_up("the binary cross-entropy weighs its targets")
            return
        if self._count_rows(node) is None:
            return
        target = saved(node, "target").detach()
        alike = (target == target.reshape(-1)[0]).all().double()  # on the device: read with the level
        self._alike = alike if self._alike is None else self._alike + alike
        soft = target.float().clamp(0, 1)  # in single precision, summed in double: a segmentation map is large
        entropy = (-torch.xlogy(soft, soft) - torch.xlogy(1 - soft, 1 - soft)).sum(dtype=torch.float64)
        self._entropy = entropy if self._entropy is None else self._entropy + entropy
        self._elements += soft.numel()
        self._passes += 1
        self.kind = "binary_cross_entropy"
        self._classes = 2
        self._needed = SAMPLES_PER_CLASS * 3  # thirty targets per column, as a squared error's

    def _count_rows(self, node: Any) -> tuple[int, torch.Tensor] | None:
        """(rows, their per-column count, sum and sum of squares) of a pass's targets, a row per sample, added to
        ``_sums``; None (and the level given up) for targets of another shape than the predictions, or than
        before."""
        target = saved(node, "target").detach()
        if target.shape != saved(node, "self").shape or target.dim() == 0:
            self._give_up("the loss broadcasts its targets")
            return None
        rows = target.reshape(target.shape[0], -1).double()
        sums = torch.stack([torch.full_like(rows[0], rows.shape[0]), rows.sum(0), (rows * rows).sum(0)])
        if self._sums is not None and self._sums.shape != sums.shape:
            self._give_up("the targets change shape between steps")
            return None
        self._sums = sums if self._sums is None else self._sums + sums
        self._samples += rows.shape[0]
        return rows.shape[0], sums

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

    def take_block(self) -> torch.Tensor | None:
        """A squared error's targets since the last call (per column, their count, sum and sum of squares, on the
        device: ``spread`` reads them), and a new block begun; None for another loss, or with no target since. No
        synchronisation."""
        block, self._block = self._block, None
        return block if not self.off and self.kind == "squared_error" else None

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
        if self.kind == "cross_entropy":
            assert self._counts is not None
            p = self._counts.double() / self._counts.sum()
            p = p[p > 0]
            return float(-(p * p.log()).sum())  # a host synchronisation on an accelerator
        assert self._sums is not None
        n, total, squares = self._sums
        if self.kind == "binary_cross_entropy":
            if self._alike is not None and 2 * float(self._alike) >= self._passes:  # likewise
                self._give_up(ALIKE)
                return None
            p = (total / n).clamp(0, 1)
            level = (-torch.xlogy(p, p) - torch.xlogy(1 - p, 1 - p)).mean()
            assert self._entropy is not None
            value, self._floor = torch.stack([level, self._entropy / self._elements]).tolist()  # likewise
        else:
            value = float((squares / n - (total / n) ** 2).clamp(min=0).mean())  # likewise
        return value if math.isfinite(value) else None

    def floor(self) -> float | None:
        """The least loss any prediction scores on the targets seen, where it is not 0: a binary cross-entropy's,
        the mean binary entropy of its targets (0 for targets of 0 and 1; above it for soft ones, a teacher's
        probabilities or smoothed labels, which no prediction matches better than by predicting them). Known with
        the level and read with it; None for other losses or while the level is unknown.

        A student trained on a teacher's probabilities softened at temperature 3 started at 0.686, 0.016 above
        its floor 0.670, and fell to it, 84 % of the way there: 2 % of its start, and called NotLearning by a
        fall asked to be 5 % of it (stop 65's verdict hunt). A fall is measured against the room above it."""
        if self.level() is None or self.kind != "binary_cross_entropy":
            return None
        return self._floor

    def error(self) -> float:
        """The standard error of ``level()`` (0 while it is unknown): a squared error's is its variance's
        from the targets seen, the level times sqrt(2 / (n - 1)) (the columns' variances averaged may move
        together, so no fewer); a cross-entropy's, the bias of an entropy estimated from n labels,
        (classes - 1) / (2 n)."""
        level = self.level()
        if self.off or level is None or self._samples < 2:
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


def spread(blocks: Sequence[torch.Tensor]) -> float | None:
    """The variance of the targets of ``blocks`` (``ChanceLevel.take_block``'s, of one loss), averaged over their
    columns: the squared error of predicting their mean; None when it is not finite. One host synchronisation."""
    n, total, squares = sum(blocks[1:], blocks[0])
    value = float((squares / n - (total / n) ** 2).clamp(min=0).mean())
    return value if math.isfinite(value) else None


class TermLevel:
    """The terms of known level a sum of terms adds up (``known_term``: a cross-entropy plus a hand-written
    penalty, a distillation's cross-entropy beside its divergence, a contrastive loss's two cross-entropies of
    one score matrix and of its transpose), or a binary cross-entropy alone: their chance level, and their
    values.

    The loss such a script backwards has no chance level, and a fall of it can be the other terms' alone (a
    penalty on the weights shrinking them while the cross-entropy learns only the labels' prior). Each pass's
    terms are recomputed from their nodes' saved tensors (the log-probabilities and labels of a cross-entropy,
    the predictions and targets of the others: a few small kernels on the device, no synchronisation) and
    kept per window (``close_window``, the learning check's); ``tails`` reads the last windows' medians (one
    synchronisation, at the end of the run): a pass far off (an L-BFGS closure evaluated at a trial point a
    line search rejects, 1e31 where the fit is at 0.01: the corpus's ridge regression) moves no median. Several
    terms are judged together, their values and their levels each weighted as the sum weighs them: only
    multi-class cross-entropies, none of whose labels are all of one class (a discriminator's real or fake).
    Off for the rest of the run at a pass of another form: a loss that is no sum, a sum of two binary
    cross-entropies (a GAN's discriminator, whose two sit at their levels by design) or of losses of two kinds,
    a term subtracted or weighted by a negative number (an adversarial term, which is meant to stay at its
    level)."""

    def __init__(self, windows: int) -> None:
        self.levels: list[ChanceLevel] = []  # each term's, in the order ``known_term`` finds them
        self.off = False
        self.names: tuple[str, ...] | None = None  # the terms' nodes
        self.alone: bool | None = None  # the terms are the whole loss (a binary cross-entropy's: ``BINARY``)
        # Per pass since the last window, on the device: whether counted, then each term's value, then its weight, then
        # (of several terms) whether their labels were of several tasks (``_tasks``).
        self._window: list[torch.Tensor] = []
        self._windows: deque[list[torch.Tensor]] = deque(maxlen=windows)

    def observe(self, tensors: Sequence[torch.Tensor]) -> None:
        """One backward pass is about to run from ``tensors``."""
        if self.off:
            return
        found = known_term(tensors)
        names = None if found is None else tuple(node.name() for node, _ in found[0])
        if found is None or self.names not in (None, names) or self.alone not in (None, found[1]):
            self.off = True
            return
        terms, self.alone = found
        self.names = names
        if not self.levels:
            self.levels = [ChanceLevel(binary=True) for _ in terms]
            for level in self.levels:
                level.accept_scaled = True  # the term's value is its node's own mean, however it was weighted
        values, weights = [], []
        for level, (node, factor) in zip(self.levels, terms, strict=True):
            level.take(node)
            try:
                with torch.no_grad():
                    values.append(_term_value(node))
            except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):  # a node saved differently
                level.off = True
            if level.off:
                self.off = True
                return
            one = torch.ones((), dtype=torch.float64, device=values[-1].device)
            weights.append(one if factor is None else _times(factor, one))
        value, weight = torch.stack(values), torch.stack(weights)
        # A term weighted by 0 is no part of the loss (a pass of none is not counted); by less than 0, of another aim
        # (the pass is not counted).
        counted = torch.isfinite(value).all() & (weight >= 0).all() & (weight > 0).any()
        tasks: list[torch.Tensor] = []  # of several terms alone: nothing more per pass for one
        if len(terms) > 1:
            try:
                with torch.no_grad():
                    tasks.append(_tasks(node for node, _ in terms).double().reshape(1))
            except (AttributeError, RuntimeError, TypeError):  # a node saved differently
                self.off = True
                return
        self._window.append(torch.cat([counted.double().reshape(1), torch.where(counted, value, 0.0), weight, *tasks]))

    @property
    def full(self) -> bool:
        """Whether the terms' values span the last ``windows`` windows of steps."""
        return len(self._windows) == self._windows.maxlen

    @property
    def kind(self) -> str | None:
        """The terms' kind of loss (``ChanceLevel.kind``: all alike); None before any pass."""
        return self.levels[0].kind if self.levels else None

    def floor(self) -> float | None:
        """The least loss any prediction scores on one term's targets (``ChanceLevel.floor``); None for several."""
        return self.levels[0].floor() if len(self.levels) == 1 else None

    def close_window(self) -> None:
        """The learning check closed a window of steps: the terms' values since are one window of the tail."""
        if self._window:
            self._windows.append(self._window)
            self._window = []

    def tails(self) -> list[tuple[int, float, float, float]]:
        """(passes, median, standard error of the median, level) of the terms over the last windows of steps: first
        of them together, each pass's value and level the mean of its terms' and of their levels, each weighted as
        the pass weighs it (one term: its own value and level); then, of several whose labels are of several tasks
        in any pass (``_tasks``), each term's own, over the passes that weigh it (a network's heads: one that
        learned beside one whose task is hopeless, a masked language model's tokens beside a sentence task at
        chance). Terms of one task's labels are judged together alone: each of a batch's augmentations judged apart
        would be one more chance to read a fall as learning. Each median is the level (the passes' median) plus the
        median of each pass's excess over its own, the error from the median absolute deviation of the excess
        (1.4826 of it a standard deviation, 1.2533 of that over sqrt(n) the median's error, for values about
        normal). [] while off, while a term's level is unknown or, among several, 0 (a term's labels all of one
        class), or with fewer than two passes counted. One host synchronisation on an accelerator."""
        passes = [sample for window in (*self._windows, self._window) for sample in window]
        known = [level.level() for level in self.levels]
        if self.off or len(passes) < 2 or None in known or (len(known) > 1 and min(known) <= 0):
            return []
        samples = torch.stack([sample.to(passes[0].device) for sample in passes]).cpu()
        samples = samples[samples[:, 0] > 0]
        if samples.shape[0] < 2:
            return []
        terms = len(known)
        values, weights = samples[:, 1:1 + terms], samples[:, 1 + terms:1 + 2 * terms]
        share = weights / weights.sum(1, keepdim=True)
        levels = share @ torch.tensor(known, dtype=torch.float64)
        found = [_median_tail((share * values).sum(1) - levels, levels)]
        for index in range(terms if terms > 1 and bool((samples[:, -1] > 0).any()) else 0):
            weighed = weights[:, index] > 0
            if int(weighed.sum()) >= 2:
                own = values[weighed, index]
                found.append(_median_tail(own - known[index], torch.full_like(own, known[index])))
        return found


def _tasks(nodes: Iterable[Any]) -> torch.Tensor:
    """Whether loss nodes' labels are of several tasks (a network's heads, a masked language model's tokens beside
    a sentence task): a tensor of one truth value, on the device (no synchronisation). False where every node's
    labels are the first's in any order, by their count, sum and sum of squares (one task's labels seen several
    ways: a contrastive loss's two of one score matrix and of its transpose, mixup's two of one batch, a batch's
    augmentations, an auxiliary head's; two reductions each, where sorting a segmentation's maps would cost more)."""
    first, *others = (saved(node, "target").detach().reshape(-1) for node in nodes)
    several = torch.zeros((), dtype=torch.bool, device=first.device)
    for labels in others:
        if labels.shape != first.shape:
            return torch.ones((), dtype=torch.bool, device=first.device)
        several = several | (labels.sum() != first.sum()) | ((labels * labels).sum() != (first * first).sum())
    return several


def _median_tail(excess: torch.Tensor, levels: torch.Tensor) -> tuple[int, float, float, float]:
    """``TermLevel.tails``' (passes, median, standard error of the median, level) of passes' excesses over their
    levels."""
    level, median = float(levels.median()), float(excess.median())
    spread = 1.4826 * float((excess - median).abs().median())
    return excess.numel(), level + median, 1.2533 * spread / math.sqrt(excess.numel()), level


def known_term(tensors: Sequence[torch.Tensor]) -> tuple[tuple[tuple[Any, torch.Tensor | None], ...], bool] | None:
    """((each loss node, the product of the constant factors above it (None for none)), whether they are the whole
    loss) where the one scalar a backward pass starts from adds up, through additions and constant scalings,
    exactly one loss node of ``LOSS_NODES`` and at least one term of another kind, or several multi-class
    cross-entropies and any other terms, or is a binary cross-entropy alone (whose level is judged here alone:
    ``BINARY``); None otherwise. What a subtraction subtracts, or a negation negates, is a term of another kind;
    what it subtracts from is walked as an addition's terms (stop 83's hunt: TabNet's ``mse - lambda * M_loss``,
    a regression at a hundred times its rate flat at its targets' variance, was called learned, its squared
    error never found)."""
    scalar = backward_loss.scalar_of(tensors)
    if scalar is None or scalar.grad_fn is None:
        return None
    found: list[tuple[Any, torch.Tensor | None]] = []
    others = 0
    queue: deque[tuple[Any, int, torch.Tensor | None]] = deque([(scalar.grad_fn, scalar.output_nr, None)])
    walked = 0
    try:
        while queue:
            node, output, factor = queue.popleft()
            walked += 1
            if node is None or walked > MAX_TERM_NODES:
                return None
            node, _ = backward_loss.through_passthrough(node, output)  # a loss computed in a DDP forward pass
            scaling = backward_loss.constant_scaling(node)
            if scaling is not None:
                below, by, divides = scaling
                by = by.detach().reshape(()).double()
                by = 1 / by if divides else by
                by = by if factor is None else _times(factor, by)
                queue.append((below, backward_loss.output_into(node, below), by))
            elif node.name() in ("AddBackward0", "AddBackward1"):
                queue.extend((below, number, factor) for below, number in node.next_functions if below is not None)
            elif node.name() == "SubBackward0":  # a penalty subtracted (TabNet's ``mse - lambda * sparsity``)
                (minuend, number), _ = node.next_functions
                if minuend is not None:
                    queue.append((minuend, number, factor))
                others += 1  # what it subtracts: a term of another kind, whatever it is
            elif node.name() in LOSS_NODES:
                found.append((node, factor))
            else:
                others += 1
    except (AttributeError, RuntimeError, TypeError):  # a node saved differently
        return None
    if len(found) > 1:
        several = all(node.name() in CROSS_ENTROPY for node, _ in found)
        return (tuple(found), not others) if several else None
    if len(found) != 1 or not (others or found[0][0].name() in BINARY_CROSS_ENTROPY):
        return None
    return tuple(found), not others


def _on(factor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``factor`` where it can meet a tensor on ``device``: a number of the host's as it is (a tensor of one
    element on the host takes part in a device's arithmetic as a number, with no copy that would wait for the
    device), else moved there."""
    return factor if factor.device.type == "cpu" and factor.dim() == 0 else factor.to(device)


def _times(factor: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
    """The product of two constant factors of one element each, on the device's side where either is there
    (``_on``: a number of the host's is never copied, and nothing of the device's is read back to the host)."""
    return by * factor if factor.device.type == "cpu" and factor.dim() == 0 else factor * _on(by, factor.device)


def _term_value(node: Any) -> torch.Tensor:
    """The mean per element of a loss node's loss, from its saved tensors (a cross-entropy's labels not ignored)."""
    name = node.name()
    inputs, target = saved(node, "self").detach(), saved(node, "target").detach()
    if name in CROSS_ENTROPY:
        kept = backward_loss.kept_labels(node)
        picked = inputs.gather(1, torch.where(kept, target, 0).unsqueeze(1)).squeeze(1)
        return -(picked.double() * kept).sum() / kept.sum().clamp(min=1)
    if name == SQUARED_ERROR:
        return ((inputs.double() - target.double()) ** 2).mean()
    if name == "BinaryCrossEntropyWithLogitsBackward0":
        return functional.binary_cross_entropy_with_logits(inputs.float(), target.float()).double()
    return functional.binary_cross_entropy(inputs.float(), target.float()).double()


def _optional(node: Any, name: str) -> Any:
    """``saved`` for what only some nodes of a kind save (a binary cross-entropy's ``pos_weight``); its raw form is
    read to ask, as reading the tensor itself would run the script's unpack hook."""
    return saved(node, name) if hasattr(node, f"_raw_saved_{name}") else None


def listen_term(owner: object, windows: int) -> TermLevel:
    """The known term of a sum (``TermLevel``) fed by every backward pass of this process while ``owner`` lives,
    its values kept over ``windows`` of the learning check's windows."""
    term = TermLevel(windows)
    bare_tensors.listen_while(owner, term.observe)
    return term


def listen(owner: object) -> ChanceLevel:
    """A chance level fed by every backward pass of this process while ``owner`` lives."""
    chance = ChanceLevel()
    bare_tensors.listen_while(owner, chance.observe)
    return chance
