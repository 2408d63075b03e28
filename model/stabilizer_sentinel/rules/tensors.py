"""Rules over tensor values: ExplodingTensor, VanishingGradient, WeightUpdateRatio, AllZero,
UnchangedTensor, TensorVariance, PoorWeightInitialization.

Names, parameters and defaults are Debugger's (stabilizer_contract/catalogue.py); docs/rules.md says where
the computation differs from Debugger's guide and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from stabilizer_sentinel.capture.trial import ModeKeys, Trial
from stabilizer_sentinel.rules.base import Rule, first_finding, register_rule, required, scalar, select, value_at


@register_rule
class ExplodingTensor(Rule):
    """Fires when a tensor holds NaN (or, unless ``only_nan``, infinity).

    With neither ``collection_names`` nor ``tensor_regex`` every tensor saved at the step is
    inspected (in the job: the gradients and losses it holds). The finding names the first
    non-finite tensor in network order.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"gradients": 100, "losses": 1}

    def __init__(
        self,
        base_trial: Trial,
        *,
        collection_names: list[str] | None = None,
        tensor_regex: list[str] | None = None,
        only_nan: bool = False,
    ) -> None:
        super().__init__(base_trial)
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.only_nan = only_nan

    def collections_needed(self) -> Mapping[str, int]:
        return required(self.collection_names, self.required_collections, 100)

    def invoke_at_step(self, step: int) -> bool:
        for name in select(self.base_trial, step, self.collection_names, self.tensor_regex):
            for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
                value = value_at(self.base_trial, name, step, mode)
                if value is None or not np.issubdtype(value.dtype, np.floating):
                    continue
                if np.isnan(value).any():
                    bad: float = math.nan
                elif not self.only_nan and np.isinf(value).any():
                    bad = float(value[np.isinf(value)].flat[0])
                else:
                    continue
                return self.fire(step, f"{name} is non-finite at step {step}", name, bad, str(mode))
        return False


@register_rule
class VanishingGradient(Rule):
    """Fires when the mean absolute value of a gradient tensor falls below ``threshold``.

    Gradients of biases are left out: a bias followed by batch norm has a gradient of exactly zero
    by construction (the normalisation removes it), which is not a vanishing gradient. So is a gradient
    of exactly zero the first time a tensor's is read: a partner initialised to zero (LoRA's ``B``, a
    ReZero or zero-initialised residual gate) leaves it so at the first step by design, and the first
    update ends it; the workflow's default rules stopped such healthy runs at step 0 (stop 63). It is
    judged from the next saved step: a network dead from its start is found there.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"gradients": 100}

    def __init__(self, base_trial: Trial, *, threshold: float = 1e-7) -> None:
        super().__init__(base_trial)
        self.threshold = threshold
        self._seen: set[str] = set()  # the tensors whose gradient was read at a step before

    def invoke_at_step(self, step: int) -> bool:
        for name in self.base_trial.tensor_names(collection="gradients", step=step, mode=ModeKeys.TRAIN):
            value = value_at(self.base_trial, name, step, ModeKeys.TRAIN)
            if name.endswith("bias") or value is None or value.size == 0:
                continue
            mean_abs = float(np.mean(np.abs(value)))
            first = name not in self._seen
            self._seen.add(name)
            if first and mean_abs == 0.0:
                continue
            if mean_abs < self.threshold:
                return self.fire(
                    step,
                    f"mean |{name}| = {mean_abs:.3g} is below {self.threshold:g} at step {step}",
                    name,
                    mean_abs,
                )
        return False


@register_rule
class WeightUpdateRatio(Rule):
    """Fires when ||w_s - w_p|| / (||w_p|| + epsilon) leaves [``small_threshold``, ``large_threshold``].

    ``p`` is the previous saved step, or with ``num_steps`` the earliest saved step >= s - num_steps.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"weights": 100}

    def __init__(
        self,
        base_trial: Trial,
        *,
        num_steps: int | None = None,
        large_threshold: float = 10.0,
        small_threshold: float = 1e-8,
        epsilon: float = 1e-9,
    ) -> None:
        super().__init__(base_trial)
        self.num_steps = num_steps
        self.large_threshold = large_threshold
        self.small_threshold = small_threshold
        self.epsilon = epsilon

    def invoke_at_step(self, step: int) -> bool:
        for name in self.base_trial.tensor_names(collection="weights", step=step, mode=ModeKeys.TRAIN):
            tensor = self.base_trial.tensor(name)
            earlier = [s for s in tensor.steps(mode="TRAIN") if s < step]
            if self.num_steps is not None:
                earlier = [s for s in earlier if s >= step - self.num_steps][:1]
            if not earlier:
                continue
            before = value_at(self.base_trial, name, earlier[-1], "TRAIN")
            now = value_at(self.base_trial, name, step, "TRAIN")
            if before is None or now is None:
                continue
            ratio = float(np.linalg.norm(now - before) / (np.linalg.norm(before) + self.epsilon))
            if not math.isfinite(ratio):
                continue  # ExplodingTensor's business
            if ratio > self.large_threshold or ratio < self.small_threshold:
                return self.fire(
                    step,
                    f"update/weight ratio of {name} between steps {earlier[-1]} and {step} is {ratio:.3g}, "
                    f"outside [{self.small_threshold:g}, {self.large_threshold:g}]",
                    name,
                    ratio,
                )
        return False


class _Selected(Rule):
    """A rule over the tensors named by ``collection_names`` and ``tensor_regex`` (at least one given)."""

    def collections_needed(self) -> Mapping[str, int]:
        return required(self.collection_names, {}, 100)

    def _names(self, step: int, mode: str | None = None) -> list[str]:
        return select(self.base_trial, step, self.collection_names, self.tensor_regex, mode)


@register_rule
class AllZero(_Selected):
    """Fires when at least ``threshold`` percent of a tensor's values are zero."""

    def __init__(
        self,
        base_trial: Trial,
        *,
        collection_names: list[str] | None = None,
        tensor_regex: list[str] | None = None,
        threshold: float = 100.0,
    ) -> None:
        super().__init__(base_trial)
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.threshold = threshold

    def invoke_at_step(self, step: int) -> bool:
        for name in self._names(step):
            value = value_at(self.base_trial, name, step)
            if value is None or value.size == 0:
                continue
            percent = float(np.count_nonzero(value == 0)) / value.size * 100
            if percent >= self.threshold:
                return self.fire(step, f"{percent:.1f}% of {name} is zero at step {step}", name, percent)
        return False


@register_rule
class UnchangedTensor(_Selected):
    """Fires when a tensor's last ``num_steps`` saved values are all ``numpy.allclose``."""

    def __init__(
        self,
        base_trial: Trial,
        *,
        collection_names: list[str] | None = None,
        tensor_regex: list[str] | None = None,
        num_steps: int = 3,
        rtol: float = 1e-5,
        atol: float = 1e-8,
        equal_nan: bool = False,
    ) -> None:
        super().__init__(base_trial)
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.num_steps = num_steps
        self.rtol = rtol
        self.atol = atol
        self.equal_nan = equal_nan

    def invoke_at_step(self, step: int) -> bool:
        for name in self._names(step, "TRAIN"):
            steps = [s for s in self.base_trial.tensor(name).steps(mode="TRAIN") if s <= step][-self.num_steps :]
            if len(steps) < self.num_steps:
                continue
            values = [value_at(self.base_trial, name, s, "TRAIN") for s in steps]
            if any(v is None for v in values):
                continue
            first = values[0]
            if all(
                np.allclose(first, other, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan)
                for other in values[1:]
            ):
                return self.fire(
                    step, f"{name} did not change over steps {steps[0]}..{steps[-1]}", name, float(np.mean(first))
                )
        return False


@register_rule
class TensorVariance(_Selected):
    """Fires when a tensor's variance is above ``max_threshold`` or below ``min_threshold``."""

    def __init__(
        self,
        base_trial: Trial,
        *,
        collection_names: list[str] | None = None,
        tensor_regex: list[str] | None = None,
        max_threshold: float | None = None,
        min_threshold: float | None = None,
    ) -> None:
        super().__init__(base_trial)
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.max_threshold = max_threshold
        self.min_threshold = min_threshold

    def invoke_at_step(self, step: int) -> bool:
        for name in self._names(step):
            value = value_at(self.base_trial, name, step)
            if value is None or value.size == 0 or not np.issubdtype(value.dtype, np.number):
                continue
            variance = float(np.var(value, dtype=np.float64))
            if not math.isfinite(variance):
                continue  # ExplodingTensor's business
            if self.max_threshold is not None and variance > self.max_threshold:
                return self.fire(
                    step, f"variance of {name} is {variance:.3g}, above {self.max_threshold:g}, at step {step}",
                    name, variance,
                )
            if self.min_threshold is not None and variance < self.min_threshold:
                return self.fire(
                    step, f"variance of {name} is {variance:.3g}, below {self.min_threshold:g}, at step {step}",
                    name, variance,
                )
        return False


@register_rule
class PoorWeightInitialization(Rule):
    """Over the first ``steps`` training steps, fires when

    - the largest variance of the activation inputs (``activation_inputs_regex``, one tensor per
      layer) is more than ``threshold`` times the smallest, at a step;
    - the spread of the gradients (all weight gradients of the step together, biases left out),
      their 95th minus their 5th percentile, is below ``distribution_range``; or
    - the loss has not reached a new lowest value for ``patience`` steps.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"activation_inputs": 1, "gradients": 1, "losses": 1}

    def __init__(
        self,
        base_trial: Trial,
        *,
        activation_inputs_regex: Sequence[str] | None = (".*relu_input",),
        threshold: float = 10.0,
        distribution_range: float = 0.001,
        patience: int = 5,
        steps: int = 10,
    ) -> None:
        super().__init__(base_trial)
        self.activation_inputs_regex = list(activation_inputs_regex or [])
        self.threshold = threshold
        self.distribution_range = distribution_range
        self.patience = patience
        self.steps = steps
        self._analysed: set[int] = set()
        self._best: tuple[int, float] | None = None

    def invoke_at_step(self, step: int) -> bool:
        trial = self.base_trial
        if step in self._analysed or len(self._analysed) >= self.steps or step not in trial.steps("TRAIN"):
            return False
        self._analysed.add(step)
        found: list[tuple[int, str, str | None, Any, str]] = []
        variances = {}
        for name in trial.tensor_names(regex=self.activation_inputs_regex, step=step, mode="TRAIN"):
            value = value_at(trial, name, step, "TRAIN")
            if value is not None and value.size > 1:
                variances[name] = float(np.var(value, dtype=np.float64))
        finite = {n: v for n, v in variances.items() if math.isfinite(v)}
        if len(finite) >= 2 and min(finite.values()) > 0:
            low, high = min(finite, key=finite.__getitem__), max(finite, key=finite.__getitem__)
            ratio = finite[high] / finite[low]
            if ratio > self.threshold:
                found.append((step, f"activation-input variance of {high} ({finite[high]:.3g}) is {ratio:.3g} times "
                              f"that of {low} ({finite[low]:.3g}) at step {step}, more than {self.threshold:g}",
                              high, ratio, "TRAIN"))
        pooled = [
            value.ravel()
            for name in trial.tensor_names(collection="gradients", step=step, mode="TRAIN")
            if not name.endswith("bias") and (value := value_at(trial, name, step, "TRAIN")) is not None
        ]
        gradients = np.concatenate(pooled) if pooled else np.zeros(0)
        if gradients.size >= 2 and np.isfinite(gradients).all():
            p5, p95 = np.percentile(gradients, [5, 95])
            if p95 - p5 < self.distribution_range:
                found.append((step, f"the gradients span {p95 - p5:.3g} between their 5th and 95th percentiles at "
                              f"step {step}, less than {self.distribution_range:g}", "gradients", float(p95 - p5),
                              "TRAIN"))
        for name in trial.tensor_names(collection="losses", step=step, mode="TRAIN"):
            value = value_at(trial, name, step, "TRAIN")
            if value is None or value.size != 1 or not math.isfinite(loss := scalar(value)):
                continue
            if self._best is None or loss < self._best[1]:
                self._best = (step, loss)
            elif len([s for s in self._analysed if s > self._best[0]]) >= self.patience:
                found.append((step, f"loss has not fallen below {self._best[1]:.4g} (step {self._best[0]}) for "
                              f"{self.patience} steps at step {step}", name, loss, "TRAIN"))
            break
        return first_finding(self, found)
