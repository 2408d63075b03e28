"""Rules over the course of training: LossNotDecreasing, Overfit, Overtraining, StalledTrainingRule.

Names, parameters and defaults are Debugger's (stabilizer_contract/catalogue.py); docs/rules.md says where
the computation differs from Debugger's guide and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from stabilizer_sentinel.capture.trial import Tensor, Trial
from stabilizer_sentinel.rules.base import Rule, first_finding, register_rule, required, scalar, select


def _scalar_names(trial: Trial, names: list[str]) -> list[str]:
    """The names whose values are scalars (the guide: "only scalar-valued tensors can be matched")."""
    out = []
    for name in names:
        tensor = trial.tensor(name)
        steps = tensor.steps()
        if steps and tensor.value(steps[-1]).size == 1:
            out.append(name)
    return out


@register_rule
class LossNotDecreasing(Rule):
    """Fires when the loss did not fall by ``diff_percent`` percent over ``num_steps`` steps.

    As the guide describes it: at a step where the loss was saved, at least ``num_steps`` after the
    previous check, the loss at this step is compared with the loss at the newest saved step that
    is at least ``num_steps`` behind. It fires when the decrease is less than ``diff_percent``
    percent of the earlier loss, or when the loss is more than ``increase_threshold_percent``
    percent above the lowest loss compared so far.

    Tensors: the ``losses`` collection (``use_losses_collection``), plus ``collection_names`` and
    ``tensor_regex``; with none of these, every scalar tensor. Scalars only. ``mode``: ``TRAIN`` or
    ``EVAL`` compare the values of that mode; ``GLOBAL`` compares values in step order whatever
    their mode (the TRAIN value where a step has both); not given, a tensor's EVAL values are
    compared once it has any (Debugger checks EVAL, then TRAIN, then GLOBAL), its TRAIN values
    until then.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"losses": 1}

    def __init__(
        self,
        base_trial: Trial,
        *,
        collection_names: list[str] | None = None,
        tensor_regex: list[str] | None = None,
        use_losses_collection: bool = True,
        num_steps: int = 10,
        diff_percent: float = 0.1,
        increase_threshold_percent: float = 5.0,
        mode: str | None = None,
    ) -> None:
        super().__init__(base_trial)
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.use_losses_collection = use_losses_collection
        self.num_steps = num_steps
        self.diff_percent = diff_percent
        self.increase_threshold_percent = increase_threshold_percent
        self.mode = mode.upper() if mode else None
        self._last_check: dict[tuple[str, str], int] = {}
        self._best: dict[tuple[str, str], float] = {}

    def collections_needed(self) -> Mapping[str, int]:
        needed = required(self.collection_names, {}, 1)
        if self.use_losses_collection:
            needed["losses"] = 1
        return needed

    def _tensors(self) -> list[str]:
        trial = self.base_trial
        names: dict[str, None] = {}
        if self.use_losses_collection:
            names.update(dict.fromkeys(trial.tensor_names(collection="losses")))
        if self.collection_names or self.tensor_regex:
            names.update(dict.fromkeys(select(trial, None, self.collection_names, self.tensor_regex)))
        elif not names:
            names = dict.fromkeys(trial.tensor_names())
        return _scalar_names(trial, list(names))

    def _mode_of(self, tensor: Tensor) -> str:
        if self.mode is not None:
            return self.mode
        return "EVAL" if tensor.steps(mode="EVAL") else "TRAIN"

    def invoke_at_step(self, step: int) -> bool:
        found: list[tuple[int, str, str | None, Any, str]] = []
        for name in self._tensors():
            tensor = self.base_trial.tensor(name)
            mode = self._mode_of(tensor)
            result = self._check(name, tensor, mode, step)
            if result is not None:
                found.append(result)
        return first_finding(self, found)

    def _check(self, name: str, tensor: Tensor, mode: str, step: int) -> tuple[int, str, str, Any, str] | None:  # noqa: PLR0911
        steps = tensor.steps(mode=None if mode == "GLOBAL" else mode)
        if step not in steps:
            return None
        key = (name, mode)
        last = self._last_check.get(key)
        if last is not None and step < last + self.num_steps:
            return None
        behind = [s for s in steps if s <= step - self.num_steps]
        if not behind:
            return None
        self._last_check[key] = step
        reading = None if mode == "GLOBAL" else mode
        before = scalar(tensor.value(behind[-1], mode=reading))
        now = scalar(tensor.value(step, mode=reading))
        if not (math.isfinite(before) and math.isfinite(now)):
            return None  # ExplodingTensor's business
        best = min(self._best.get(key, before), before, now)
        self._best[key] = best
        decrease = (before - now) / abs(before) * 100 if before else (0.0 if now == before else -math.inf)
        where = f"loss {name} ({mode}) at step {step}"
        if decrease < self.diff_percent:
            return (step, f"{where} is {now:.4g}, {decrease:+.3g}% below its value {before:.4g} at step "
                    f"{behind[-1]}: less than the required decrease of {self.diff_percent:g}%", name, now, mode)
        rise = (now - best) / abs(best) * 100 if best else 0.0
        if rise > self.increase_threshold_percent:
            return (step, f"{where} is {now:.4g}, {rise:.3g}% above its lowest value {best:.4g}, more than "
                    f"{self.increase_threshold_percent:g}%", name, now, mode)
        return None


@register_rule
class Overfit(Rule):
    """Fires when (validation loss - training loss) / training loss exceeds ``ratio_threshold``
    at ``patience`` consecutive evaluations from ``start_step`` on.

    The validation loss is a tensor's EVAL value at an evaluation step; the training loss is the
    mean of its TRAIN values saved since the previous evaluation. Tensors: those matching
    ``tensor_regex``, or else every scalar tensor saved in both modes.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"losses": 1}

    def __init__(
        self,
        base_trial: Trial,
        *,
        tensor_regex: list[str] | None = None,
        start_step: int = 0,
        patience: int = 1,
        ratio_threshold: float = 0.1,
    ) -> None:
        super().__init__(base_trial)
        self.tensor_regex = tensor_regex
        self.start_step = start_step
        self.patience = patience
        self.ratio_threshold = ratio_threshold
        self._seen: dict[str, int] = {}
        self._streak: dict[str, int] = {}

    def _tensors(self) -> list[str]:
        trial = self.base_trial
        if self.tensor_regex:
            return _scalar_names(trial, trial.tensor_names(regex=self.tensor_regex))
        both = [n for n in trial.tensor_names(mode="EVAL") if n in set(trial.tensor_names(mode="TRAIN"))]
        return _scalar_names(trial, both)

    def invoke_at_step(self, step: int) -> bool:
        if step < self.start_step:
            return False
        found: list[tuple[int, str, str | None, Any, str]] = []
        for name in self._tensors():
            tensor = self.base_trial.tensor(name)
            if step not in tensor.steps(mode="EVAL") or self._seen.get(name, -1) >= step:
                continue
            previous = self._seen.get(name, -1)
            self._seen[name] = step
            train = [
                scalar(tensor.value(s, mode="TRAIN"))
                for s in tensor.steps(mode="TRAIN")
                if previous < s <= step and s >= self.start_step
            ]
            if not train:
                continue
            train_mean = float(np.mean(train))
            validation = scalar(tensor.value(step, mode="EVAL"))
            if not (math.isfinite(train_mean) and math.isfinite(validation)) or train_mean <= 0:
                continue
            ratio = (validation - train_mean) / train_mean
            self._streak[name] = self._streak.get(name, 0) + 1 if ratio > self.ratio_threshold else 0
            if self._streak[name] >= self.patience:
                found.append((
                    step,
                    f"validation loss {validation:.4g} exceeds the training loss {train_mean:.4g} by a ratio "
                    f"of {ratio:.3g} (threshold {self.ratio_threshold:g}) for {self._streak[name]} "
                    f"evaluations at step {step}",
                    name,
                    ratio,
                    "EVAL",
                ))
        return first_finding(self, found)


@register_rule
class Overtraining(Rule):
    """Fires when the training loss has not improved by ``delta`` over its best for ``patience_train``
    saved training steps, or the validation loss for ``patience_validation`` evaluations: the model
    stopped improving, and training on risks overfitting (the guide's reading).

    Tensors: the ``losses`` collection; training values are its TRAIN values, validation values its
    EVAL values. "Improved" means below the best so far by more than ``delta`` (absolute).
    """

    required_collections: ClassVar[Mapping[str, int]] = {"losses": 1}

    def __init__(
        self,
        base_trial: Trial,
        *,
        patience_train: int = 5,
        patience_validation: int = 10,
        delta: float = 0.01,
    ) -> None:
        super().__init__(base_trial)
        self.patience_train = patience_train
        self.patience_validation = patience_validation
        self.delta = delta
        self._best: dict[tuple[str, str], tuple[float, int, int]] = {}  # best value, its step, steps since
        self._done: set[tuple[str, str, int]] = set()

    def invoke_at_step(self, step: int) -> bool:
        found: list[tuple[int, str, str | None, Any, str]] = []
        for name in self.base_trial.tensor_names(collection="losses"):
            tensor = self.base_trial.tensor(name)
            for mode, patience, what in (("TRAIN", self.patience_train, "training"),
                                         ("EVAL", self.patience_validation, "validation")):
                if step not in tensor.steps(mode=mode) or (name, mode, step) in self._done:
                    continue
                self._done.add((name, mode, step))
                value = scalar(tensor.value(step, mode=mode))
                if not math.isfinite(value):
                    continue  # ExplodingTensor's business
                best, at, since = self._best.get((name, mode), (math.inf, step, -1))
                best, at, since = (value, step, 0) if value < best - self.delta else (best, at, since + 1)
                self._best[(name, mode)] = (best, at, since)
                if since >= patience:
                    found.append((step, f"{what} loss {name} has not improved by {self.delta:g} on its best {best:.4g} "
                                  f"(step {at}) for {since} {'evaluations' if mode == 'EVAL' else 'saved steps'}, "
                                  f"at step {step}", name, value, mode))
        return first_finding(self, found)


@register_rule
class StalledTrainingRule(Rule):
    """Fires when no new tensor has been saved for ``threshold`` seconds.

    Only a process outside the job can see a job stall, so this rule is evaluated by the
    out-of-job evaluator (``invoke_idle``); in the job it never fires. ``stop_training_on_fire``
    and ``training_job_name_prefix`` are accepted as Debugger accepts them: stopping a job is the
    workflow's decision once the rule reports ``IssuesFound``.
    """

    def __init__(
        self,
        base_trial: Trial,
        *,
        threshold: int = 1800,
        stop_training_on_fire: bool = False,
        training_job_name_prefix: str | None = None,
    ) -> None:
        super().__init__(base_trial)
        self.threshold = threshold
        self.stop_training_on_fire = stop_training_on_fire
        self.training_job_name_prefix = training_job_name_prefix

    def invoke_at_step(self, step: int) -> bool:
        return False

    def invoke_idle(self, seconds_without_progress: float, last_step: int | None) -> bool:
        if seconds_without_progress <= self.threshold:
            return False
        where = "before the first step" if last_step is None else f"after step {last_step}"
        return self.fire(
            last_step if last_step is not None else -1,
            f"no new tensor for {seconds_without_progress:.0f} s {where}, more than the threshold of "
            f"{self.threshold} s",
            None,
            seconds_without_progress,
        )
