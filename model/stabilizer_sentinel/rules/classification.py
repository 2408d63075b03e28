"""Rules over labels, predictions and inputs: ClassImbalance, Confusion, CheckInputImages.

Names, parameters and defaults are Debugger's (stabilizer_contract/catalogue.py); docs/rules.md says where
the computation differs from Debugger's guide and why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from stabilizer_sentinel.capture.trial import Trial
from stabilizer_sentinel.rules.base import Rule, register_rule, value_at

logger = logging.getLogger(__name__)


@register_rule
class ClassImbalance(Rule):
    """As the guide describes it, over the training steps' labels and predictions, two checks once
    ``samples`` labels were seen: the class counts (labels alone) fire when the largest class
    outnumbers the smallest by more than ``threshold_imbalance``; the mispredictions (labels and
    predictions) fire when the fraction of a class's samples that were mispredicted exceeds
    ``threshold_misprediction``. Counts accumulate over every training step the rule sees;
    mispredictions over the steps that saved predictions too.

    Tensors: the first whose name (or smdebug name, such as ``CrossEntropyLoss_input_1``) matches
    ``labels_regex``, and likewise ``predictions_regex``. Predictions of several values per sample
    (class scores) are reduced with arg-max whatever ``argmax`` says; the store keeps the loss
    module's first input as class indices already. A job that saves labels and no predictions has
    its class counts judged and the misprediction check skipped, which the rule says (``not_judged``,
    its finding's message, a warning in the job's log); labels that match nothing are an error.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"labels": 10, "predictions": 10}

    def __init__(
        self,
        base_trial: Trial,
        *,
        threshold_imbalance: float = 10.0,
        threshold_misprediction: float = 0.7,
        samples: int = 500,
        argmax: bool = False,
        labels_regex: str = ".*labels",
        predictions_regex: str = ".*predictions",
    ) -> None:
        super().__init__(base_trial)
        self.threshold_imbalance = threshold_imbalance
        self.threshold_misprediction = threshold_misprediction
        self.samples = samples
        self.argmax = argmax
        self.labels_regex = labels_regex
        self.predictions_regex = predictions_regex
        self._counts: dict[int, int] = {}
        # Per class: samples seen with a prediction, and how many of those were mispredicted.
        self._predicted: dict[int, int] = {}
        self._wrong: dict[int, int] = {}
        self._seen: set[int] = set()
        self._mismatch: str | None = None
        self._warned = False

    def unmatched(self) -> str | None:
        # Only the labels are required: without predictions the rule judges the class counts alone.
        if not self.base_trial.tensor_names(regex=self.labels_regex, mode="TRAIN"):
            return self._no_tensor("labels_regex", self.labels_regex)
        return None

    def not_judged(self) -> str | None:
        if self._predicted:
            return None
        if self._mismatch is not None:
            return f"mispredictions not judged: {self._mismatch}"
        if not self.base_trial.tensor_names(regex=self.predictions_regex, mode="TRAIN"):
            return (f"mispredictions not judged: predictions_regex {self.predictions_regex!r} matched no tensor "
                    "the job saved")
        return None

    def _value(self, regex: str, step: int) -> tuple[str, np.ndarray] | None:
        names = self.base_trial.tensor_names(regex=regex, step=step, mode="TRAIN")
        value = value_at(self.base_trial, names[0], step, "TRAIN") if names else None
        if value is None:
            return None
        if value.ndim > 1 and (self.argmax or value.shape[-1] > 1):
            value = value.argmax(axis=-1)
        return names[0], value.astype(np.int64).ravel()

    def _count(self, labels: np.ndarray, predictions: tuple[str, np.ndarray] | None, step: int) -> None:
        for cls, count in zip(*np.unique(labels, return_counts=True), strict=True):
            self._counts[int(cls)] = self._counts.get(int(cls), 0) + int(count)
        if predictions is None:
            return
        name, predicted = predictions
        if predicted.shape != labels.shape:
            self._mismatch = (f"{name} holds {predicted.size} classes for {labels.size} labels at step {step}; "
                              "give predictions_regex the tensor of one class (or one score per class) per label")
            return
        for cls in np.unique(labels):
            mask = labels == cls
            self._predicted[int(cls)] = self._predicted.get(int(cls), 0) + int(mask.sum())
            self._wrong[int(cls)] = self._wrong.get(int(cls), 0) + int(np.sum(predicted[mask] != cls))

    def invoke_at_step(self, step: int) -> bool:
        if step in self._seen:
            return False
        labels = self._value(self.labels_regex, step)
        if labels is None:
            return False
        predictions = self._value(self.predictions_regex, step)
        self._seen.add(step)
        self._count(labels[1], predictions, step)
        seen = sum(self._counts.values())
        if seen < self.samples:
            return False
        skipped = self.not_judged()
        if skipped is not None and not self._warned:
            self._warned = True
            logger.warning("%s: %s; judging the class counts from the labels alone", self.name, skipped)
        largest = max(self._counts, key=self._counts.__getitem__)
        smallest = min(self._counts, key=self._counts.__getitem__)
        ratio = self._counts[largest] / self._counts[smallest]
        if ratio > self.threshold_imbalance:
            return self.fire(step, f"class {largest} has {self._counts[largest]} of the {seen} training samples seen "
                             f"and class {smallest} {self._counts[smallest]}: imbalance {ratio:.3g} exceeds "
                             f"{self.threshold_imbalance:g} at step {step}" + (f" ({skipped})" if skipped else ""),
                             labels[0], ratio)
        for cls in sorted(self._wrong):
            fraction = self._wrong[cls] / self._predicted[cls]
            if fraction > self.threshold_misprediction:
                return self.fire(step, f"class {cls} was mispredicted on {fraction:.0%} of its {self._predicted[cls]} "
                                 f"training samples with a prediction, more than {self.threshold_misprediction:g}, "
                                 f"at step {step}", predictions[0] if predictions else None, fraction)
        return False


@register_rule
class Confusion(Rule):
    """Fires when the confusion matrix of one step's labels and predictions is poor.

    ``confusion[label][prediction]`` counts the pairs of the step. Each column (a predicted class
    with at least one prediction) is normalised by its sum; the rule fires when a diagonal entry is
    below ``min_diag`` or an off-diagonal entry above ``max_off_diag``. The guide writes the
    diagonal's denominator as the sum of the diagonal, which for ten balanced classes is at most
    0.1 and would always fire; Debugger's own tests (a perfect confusion matrix passes, one
    mistake fails) hold only with the column sum, so that is what is computed.

    Labels: the first tensor of ``labels_collection``, else a tensor named ``labels`` (or ending in
    ``/<labels>``); predictions likewise. Class-probability tensors are reduced with arg-max.
    Judged on held-out data (EVAL records) only: on a training batch the matrix of a network that
    has not learnt yet always fails, which says nothing about the model.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"labels": 10, "predictions": 10}

    def __init__(
        self,
        base_trial: Trial,
        *,
        category_no: int | None = None,
        labels: str = "labels",
        predictions: str = "predictions",
        labels_collection: str = "labels",
        predictions_collection: str = "predictions",
        min_diag: float = 0.9,
        max_off_diag: float = 0.1,
    ) -> None:
        super().__init__(base_trial)
        self.category_no = category_no
        self.labels = labels
        self.predictions = predictions
        self.labels_collection = labels_collection
        self.predictions_collection = predictions_collection
        self.min_diag = min_diag
        self.max_off_diag = max_off_diag

    def collections_needed(self) -> Mapping[str, int]:
        return {self.labels_collection: 10, self.predictions_collection: 10}

    def _find(self, step: int, mode: str, collection: str, name: str) -> tuple[str, np.ndarray] | None:
        trial = self.base_trial
        candidates = trial.tensor_names(collection=collection, step=step, mode=mode)
        candidates += [n for n in trial.tensor_names(step=step, mode=mode) if n == name or n.endswith(f"/{name}")]
        for candidate in candidates:
            value = value_at(trial, candidate, step, mode)
            if value is not None:
                return candidate, (value.argmax(axis=-1) if value.ndim > 1 else value).astype(np.int64).ravel()
        return None

    def invoke_at_step(self, step: int) -> bool:
        labels = self._find(step, "EVAL", self.labels_collection, self.labels)
        preds = self._find(step, "EVAL", self.predictions_collection, self.predictions)
        if labels is not None and preds is not None and labels[1].size == preds[1].size:
            return self._judge(step, "EVAL", labels[1], preds)
        return False

    def _judge(self, step: int, mode: str, labels: np.ndarray, preds: tuple[str, np.ndarray]) -> bool:
        pred_name, predicted = preds
        size = self.category_no or int(max(labels.max(initial=0), predicted.max(initial=0))) + 1
        if labels.min(initial=0) < 0 or predicted.min(initial=0) < 0 or max(labels.max(initial=0),
                                                                          predicted.max(initial=0)) >= size:
            raise ValueError(f"class indices outside [0, {size}) at step {step}; check category_no")
        confusion = np.zeros((size, size), np.int64)
        np.add.at(confusion, (labels, predicted), 1)
        totals = confusion.sum(axis=0)
        for column in np.flatnonzero(totals):
            ratios = confusion[:, column] / totals[column]
            if ratios[column] < self.min_diag:
                return self.fire(
                    step,
                    f"only {ratios[column]:.0%} of the {totals[column]} predictions of class {column} are right at "
                    f"step {step} ({mode}), less than min_diag {self.min_diag:g}",
                    pred_name, float(ratios[column]), mode,
                )
            off = np.delete(ratios, column)
            if off.size and off.max() > self.max_off_diag:
                wrong = int(np.delete(np.arange(size), column)[off.argmax()])
                return self.fire(
                    step,
                    f"{off.max():.0%} of the predictions of class {column} are class {wrong} at step {step} "
                    f"({mode}), more than max_off_diag {self.max_off_diag:g}",
                    pred_name, float(off.max()), mode,
                )
        return False


@register_rule
class CheckInputImages(Rule):
    """Fires when the mean of the input images, per colour channel, differs from 0 by more than
    ``threshold_mean``, once ``threshold_samples`` images were seen.

    Images are the tensor matching ``regex`` (searched in the name), with the colour channel at
    axis ``channel`` and the batch at axis 0; means accumulate over every saved batch. The default
    regex is Debugger's (the input of an MXNet HybridSequential) or our capture's ``inputs/inputs``.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"inputs": 10}

    def __init__(
        self,
        base_trial: Trial,
        *,
        threshold_mean: float = 0.2,
        threshold_samples: int = 500,
        regex: str = ".*hybridsequential0_input_0|inputs/inputs",
        channel: int = 1,
    ) -> None:
        super().__init__(base_trial)
        self.threshold_mean = threshold_mean
        self.threshold_samples = threshold_samples
        self.regex = regex
        self.channel = channel
        self._sums: np.ndarray | None = None
        self._counts = 0
        self._images = 0
        self._seen: set[int] = set()

    def invoke_at_step(self, step: int) -> bool:
        names = self.base_trial.tensor_names(regex=self.regex, step=step, mode="TRAIN")
        value = value_at(self.base_trial, names[0], step, "TRAIN") if names else None
        if value is None or step in self._seen or value.ndim < 2 or not np.issubdtype(value.dtype, np.number):
            return False
        self._seen.add(step)
        per_channel = np.moveaxis(value.astype(np.float64), self.channel, 0).reshape(value.shape[self.channel], -1)
        sums = per_channel.sum(axis=1)
        self._sums = sums if self._sums is None or self._sums.shape != sums.shape else self._sums + sums
        self._counts += per_channel.shape[1]
        self._images += value.shape[0]
        if self._images < self.threshold_samples:
            return False
        means = self._sums / self._counts
        worst = int(np.argmax(np.abs(means)))
        if abs(means[worst]) > self.threshold_mean:
            return self.fire(
                step,
                f"mean of channel {worst} of {names[0]} over {self._images} images is {means[worst]:.3g}, more than "
                f"{self.threshold_mean:g} from 0 (inputs are not normalised) at step {step}",
                names[0], float(means[worst]),
            )
        return False
