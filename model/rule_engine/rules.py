"""Rules: the base class, the registry, rule-list parsing, and the Debugger-compatible built-in rules.

A rule is a class with ``__init__(self, base_trial, <parameters with defaults>)`` and
``invoke_at_step(self, step) -> bool`` (True when the condition is met), the shape SageMaker
Debugger gave custom rules. ``@register_rule`` makes it available by name to rule lists; the
parameters it accepts, their types and defaults are read from its ``__init__`` signature, so a
rule list naming an unknown rule or parameter is rejected with the valid ones listed.

Built-in rules keep Debugger's names, parameters and defaults, so one rule list (docs/contracts.md
section 3) configures the in-job sentinel, the out-of-job evaluator and Debugger. Where Debugger's
documentation leaves the exact computation open, the rule's docstring says what it computes.

Rules read tensors only through the Trial API, so they run unchanged on a ``MemoryTrial`` in the
job and on a store afterwards. This module must not stop jobs or write files.
"""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rule_engine.trial import ModeKeys, Tensor, TensorUnavailableForStep, Trial


class RuleConfigError(ValueError):
    """A rule list is wrong; the message names the rule or parameter and lists the valid ones."""


@dataclass(frozen=True)
class RuleFinding:
    """What a rule saw when its condition was met."""

    rule: str
    step: int
    tensor: str | None
    value: float | str | None
    message: str
    mode: str = "TRAIN"


class Rule:
    """Base class of every rule. Subclasses declare parameters as keyword arguments of ``__init__``.

    ``required_collections`` maps collection names the rule reads to the save interval the in-job
    sentinel uses when the capture hyperparameter does not schedule that collection itself.
    """

    name: ClassVar[str] = ""
    required_collections: ClassVar[Mapping[str, int]] = {}

    def __init__(self, base_trial: Trial) -> None:
        self.base_trial = base_trial
        self.finding: RuleFinding | None = None

    def invoke_at_step(self, step: int) -> bool:
        raise NotImplementedError

    def collections_needed(self) -> Mapping[str, int]:
        """Collections this configured rule reads (default: the class's ``required_collections``)."""
        return dict(self.required_collections)

    def fire(self, step: int, message: str, tensor: str | None = None, value: Any = None, mode: str = "TRAIN") -> bool:
        """Record the finding and return True, so a rule can ``return self.fire(...)``."""
        self.finding = RuleFinding(self.name or type(self).__name__, step, tensor, _jsonable(value), message, mode)
        return True


def _jsonable(value: Any) -> float | str | None:
    if value is None or isinstance(value, str):
        return value
    number = float(value)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return number


# ---------------------------------------------------------------------------- registry and parsing

RULES: dict[str, type[Rule]] = {}


def register_rule(cls: type[Rule] | None = None, *, name: str | None = None) -> Any:
    """Class decorator: ``@register_rule`` or ``@register_rule(name="MyRule")``."""

    def wrap(rule_cls: type[Rule]) -> type[Rule]:
        rule_name = name or rule_cls.name or rule_cls.__name__
        if not issubclass(rule_cls, Rule):
            raise TypeError(f"{rule_cls!r} must subclass rule_engine.rules.Rule")
        rule_cls.name = rule_name
        rule_parameters(rule_cls)  # fail at registration, not at the first job, on a bad signature
        RULES[rule_name] = rule_cls
        return rule_cls

    return wrap(cls) if cls is not None else wrap


def rule_parameters(cls: type[Rule]) -> dict[str, tuple[Any, Any]]:
    """Parameter name -> (type, default) from the rule's ``__init__`` signature."""
    signature = inspect.signature(cls.__init__)
    hints = typing.get_type_hints(cls.__init__)
    params: dict[str, tuple[Any, Any]] = {}
    for pname, param in list(signature.parameters.items())[2:]:  # skip self, base_trial
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty:
            raise TypeError(f"rule {cls.__name__}: parameter {pname!r} needs a default")
        params[pname] = (hints.get(pname, str), param.default)
    return params


_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def _convert(value: Any, kind: Any, where: str) -> Any:  # noqa: PLR0911 - one return per type
    """Convert a rule parameter (Debugger passes strings) to the type the rule declares."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        empty = value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"})
        if empty and type(None) in args:
            return None
        inner = [arg for arg in args if arg is not type(None)]
        return _convert(value, inner[0], where)
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise RuleConfigError(f"{where}: expected True or False, got {value!r}")
    if kind in (int, float):
        try:
            number = kind(float(value)) if kind is int else float(value)
        except (TypeError, ValueError):
            raise RuleConfigError(f"{where}: expected {kind.__name__}, got {value!r}") from None
        if kind is int and float(value) != number:
            raise RuleConfigError(f"{where}: expected an integer, got {value!r}")
        return number
    if origin is list:
        items = value if isinstance(value, list | tuple) else str(value).split(",")
        return [_convert(item.strip() if isinstance(item, str) else item, args[0], where) for item in items]
    if origin is tuple:
        items = value if isinstance(value, list | tuple) else str(value).strip("()[] ").split(",")
        if len(items) != len(args):
            raise RuleConfigError(f"{where}: expected {len(args)} comma-separated values, got {value!r}")
        return tuple(_convert(item, arg, where) for item, arg in zip(items, args, strict=True))
    return str(value)


@dataclass(frozen=True)
class RuleSpec:
    """One validated entry of a rule list."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def build(self, trial: Trial) -> Rule:
        return RULES[self.name](trial, **self.parameters)


def parse_rule(raw: Mapping[str, Any], where: str = "rule") -> RuleSpec:
    if not isinstance(raw, Mapping):
        raise RuleConfigError(f'{where}: expected an object such as {{"name": "ExplodingTensor"}}, got {raw!r}')
    if "RuleParameters" in raw or "RuleConfigurationName" in raw:  # Debugger's own shape
        params = dict(raw.get("RuleParameters") or {})
        name = params.pop("rule_to_invoke", raw.get("RuleConfigurationName"))
    else:
        unknown_keys = set(raw) - {"name", "parameters"}
        if unknown_keys:
            raise RuleConfigError(f"{where}: unknown keys {sorted(unknown_keys)}; expected 'name' and 'parameters'")
        name = raw.get("name")
        params = dict(raw.get("parameters") or {})
        params.pop("rule_to_invoke", None)
    if name not in RULES:
        raise RuleConfigError(f"{where}: unknown rule {name!r}; valid rules: {sorted(RULES)}")
    declared = rule_parameters(RULES[name])
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise RuleConfigError(f"{where} ({name}): unknown parameters {unknown}; valid parameters: {sorted(declared)}")
    converted = {
        pname: _convert(value, declared[pname][0], f"{where} ({name}).{pname}") for pname, value in params.items()
    }
    return RuleSpec(name, converted)


def parse_rule_list(raw: str | Iterable[Mapping[str, Any]] | None) -> list[RuleSpec]:
    """Parse a rule list (docs/contracts.md section 3): a JSON string or the list itself."""
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RuleConfigError(f"rules: expected a JSON list of rules, got {raw!r} ({exc})") from None
    if isinstance(raw, Mapping) or not isinstance(raw, Iterable):
        raise RuleConfigError(f'rules: expected a list of {{"name": ..., "parameters": {{...}}}}, got {raw!r}')
    return [parse_rule(item, f"rules[{i}]") for i, item in enumerate(raw)]


# ---------------------------------------------------------------------------- helpers for built-ins


def _select(
    trial: Trial,
    step: int | None,
    collection_names: list[str] | None,
    tensor_regex: list[str] | None,
    mode: str | None = None,
) -> list[str]:
    """Union of tensors in ``collection_names`` and matching ``tensor_regex``; all tensors if neither."""
    if not collection_names and not tensor_regex:
        return trial.tensor_names(step=step, mode=mode)
    names: dict[str, None] = {}
    if collection_names:
        names.update(dict.fromkeys(trial.tensor_names(collection=collection_names, step=step, mode=mode)))
    if tensor_regex:
        names.update(dict.fromkeys(trial.tensor_names(regex=tensor_regex, step=step, mode=mode)))
    return list(names)


def _value_at(trial: Trial, name: str, step: int, mode: str | None = None) -> np.ndarray | None:
    try:
        return trial.tensor(name).value(step, mode=mode)
    except (TensorUnavailableForStep, LookupError):
        return None


def _scalar(value: np.ndarray) -> float:
    """A scalar tensor's value; a tensor with more than one element is rejected, not averaged."""
    if value.size != 1:
        raise ValueError(f"expected a scalar tensor, got shape {value.shape}")
    return float(value.reshape(()))


def _required(collection_names: list[str] | None, default: Mapping[str, int], interval: int) -> dict[str, int]:
    if collection_names:
        return dict.fromkeys(collection_names, interval)
    return dict(default)


# ---------------------------------------------------------------------------- built-in rules


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
        return _required(self.collection_names, self.required_collections, 100)

    def invoke_at_step(self, step: int) -> bool:
        for name in _select(self.base_trial, step, self.collection_names, self.tensor_regex):
            for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
                value = _value_at(self.base_trial, name, step, mode)
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
    by construction (the normalisation removes it), which is not a vanishing gradient.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"gradients": 100}

    def __init__(self, base_trial: Trial, *, threshold: float = 1e-7) -> None:
        super().__init__(base_trial)
        self.threshold = threshold

    def invoke_at_step(self, step: int) -> bool:
        for name in self.base_trial.tensor_names(collection="gradients", step=step, mode=ModeKeys.TRAIN):
            value = _value_at(self.base_trial, name, step, ModeKeys.TRAIN)
            if name.endswith("bias") or value is None or value.size == 0:
                continue
            mean_abs = float(np.mean(np.abs(value)))
            if mean_abs < self.threshold:
                return self.fire(
                    step,
                    f"mean |{name}| = {mean_abs:.3g} is below {self.threshold:g} at step {step}",
                    name,
                    mean_abs,
                )
        return False


@register_rule
class LossNotDecreasing(Rule):
    """Fires when the loss did not decrease by ``diff_percent`` over ``num_steps``.

    At a step at least ``num_steps`` after the previous check, the mean of the losses saved since
    that check is compared with the mean at that check (means, not single batches, so batch-to-batch
    noise does not read as a stall). It fires when the decrease is below ``diff_percent`` percent,
    or when the loss rose more than ``increase_threshold_percent`` percent above the lowest mean
    seen at any check. ``mode`` None checks EVAL and TRAIN values, each on its own.
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
        if num_steps < 1:
            raise RuleConfigError(f"LossNotDecreasing.num_steps: expected >= 1, got {num_steps}")
        if mode is not None and mode.upper() not in ("TRAIN", "EVAL"):
            raise RuleConfigError(f"LossNotDecreasing.mode: expected TRAIN or EVAL, got {mode!r}")
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.use_losses_collection = use_losses_collection
        self.num_steps = num_steps
        self.diff_percent = diff_percent
        self.increase_threshold_percent = increase_threshold_percent
        self.mode = mode.upper() if mode else None
        self._checks: dict[tuple[str, str], tuple[int, float, float]] = {}  # (name, mode) -> step, mean, best

    def collections_needed(self) -> Mapping[str, int]:
        needed = _required(self.collection_names, {}, 1)
        if self.use_losses_collection:
            needed["losses"] = 1
        return needed

    def _tensors(self) -> list[str]:
        names = dict.fromkeys(_select(self.base_trial, None, self.collection_names, self.tensor_regex))
        if not self.collection_names and not self.tensor_regex:
            names = {}
        if self.use_losses_collection:
            names.update(dict.fromkeys(self.base_trial.tensor_names(collection="losses")))
        return list(names)

    def invoke_at_step(self, step: int) -> bool:
        for name in self._tensors():
            tensor = self.base_trial.tensor(name)
            for mode in [self.mode] if self.mode else ["EVAL", "TRAIN"]:
                if self._check(name, tensor, mode, step):
                    return True
        return False

    def _check(self, name: str, tensor: Tensor, mode: str, step: int) -> bool:  # noqa: PLR0911
        steps = tensor.steps(mode=mode)
        if step not in steps:
            return False
        previous = self._checks.get((name, mode))
        if previous is not None and step - previous[0] < self.num_steps:
            return False
        since = previous[0] if previous is not None else step - self.num_steps
        window = [_scalar(tensor.value(s, mode=mode)) for s in steps if since < s <= step]
        mean = float(np.mean(window))
        if not math.isfinite(mean):
            return False  # ExplodingTensor's business
        if previous is None:
            self._checks[(name, mode)] = (step, mean, mean)
            return False
        _, before, best = previous
        self._checks[(name, mode)] = (step, mean, min(best, mean))
        decrease = (before - mean) / abs(before) * 100 if before else 0.0
        if decrease < self.diff_percent:
            return self.fire(
                step,
                f"loss {name} ({mode}) changed by {-decrease:+.3g}% between steps {previous[0]} and {step}, "
                f"less than the required decrease of {self.diff_percent:g}%",
                name,
                mean,
                mode,
            )
        if best and (mean - best) / abs(best) * 100 > self.increase_threshold_percent:
            return self.fire(
                step,
                f"loss {name} ({mode}) is {(mean - best) / abs(best) * 100:.3g}% above its lowest value "
                f"{best:.4g} at step {step}, more than {self.increase_threshold_percent:g}%",
                name,
                mean,
                mode,
            )
        return False


@register_rule
class Overfit(Rule):
    """Fires when (validation loss - training loss) / training loss exceeds ``ratio_threshold``
    at ``patience`` consecutive evaluations from ``start_step`` on.

    The validation loss is the EVAL value of the loss at an evaluation step; the training loss is
    the mean of the TRAIN values saved since the previous evaluation.
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

    def invoke_at_step(self, step: int) -> bool:
        if step < self.start_step:
            return False
        if self.tensor_regex:
            names = self.base_trial.tensor_names(regex=self.tensor_regex)
        else:
            names = self.base_trial.tensor_names(collection="losses")
        for name in names:
            tensor = self.base_trial.tensor(name)
            if step not in tensor.steps(mode="EVAL") or self._seen.get(name, -1) >= step:
                continue
            previous = self._seen.get(name, -1)
            self._seen[name] = step
            train = [
                _scalar(tensor.value(s, mode="TRAIN"))
                for s in tensor.steps(mode="TRAIN")
                if previous < s <= step and s >= self.start_step
            ]
            if not train:
                continue
            train_mean = float(np.mean(train))
            validation = _scalar(tensor.value(step, mode="EVAL"))
            if not (math.isfinite(train_mean) and math.isfinite(validation)) or train_mean <= 0:
                continue
            ratio = (validation - train_mean) / train_mean
            self._streak[name] = self._streak.get(name, 0) + 1 if ratio > self.ratio_threshold else 0
            if self._streak[name] >= self.patience:
                return self.fire(
                    step,
                    f"validation loss {validation:.4g} exceeds the training loss {train_mean:.4g} by a ratio "
                    f"of {ratio:.3g} (threshold {self.ratio_threshold:g}) for {self._streak[name]} "
                    f"evaluations at step {step}",
                    name,
                    ratio,
                    "EVAL",
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
                earlier = [s for s in earlier if s >= step - self.num_steps]
                earlier = earlier[:1]
            if not earlier:
                continue
            before = _value_at(self.base_trial, name, earlier[-1], "TRAIN")
            now = _value_at(self.base_trial, name, step, "TRAIN")
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


@register_rule
class AllZero(Rule):
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
        if not collection_names and not tensor_regex:
            raise RuleConfigError("AllZero: specify collection_names or tensor_regex")
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.threshold = threshold

    def collections_needed(self) -> Mapping[str, int]:
        return _required(self.collection_names, {}, 100)

    def invoke_at_step(self, step: int) -> bool:
        for name in _select(self.base_trial, step, self.collection_names, self.tensor_regex):
            value = _value_at(self.base_trial, name, step)
            if value is None or value.size == 0:
                continue
            percent = float(np.count_nonzero(value == 0)) / value.size * 100
            if percent >= self.threshold:
                return self.fire(step, f"{percent:.1f}% of {name} is zero at step {step}", name, percent)
        return False


@register_rule
class UnchangedTensor(Rule):
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
        if not collection_names and not tensor_regex:
            raise RuleConfigError("UnchangedTensor: specify collection_names or tensor_regex")
        if num_steps < 2:
            raise RuleConfigError(f"UnchangedTensor.num_steps: expected >= 2, got {num_steps}")
        self.collection_names = collection_names
        self.tensor_regex = tensor_regex
        self.num_steps = num_steps
        self.rtol = rtol
        self.atol = atol
        self.equal_nan = equal_nan

    def collections_needed(self) -> Mapping[str, int]:
        return _required(self.collection_names, {}, 100)

    def invoke_at_step(self, step: int) -> bool:
        for name in _select(self.base_trial, step, self.collection_names, self.tensor_regex, "TRAIN"):
            steps = [s for s in self.base_trial.tensor(name).steps(mode="TRAIN") if s <= step][-self.num_steps :]
            if len(steps) < self.num_steps:
                continue
            values = [_value_at(self.base_trial, name, s, "TRAIN") for s in steps]
            if any(v is None for v in values):
                continue
            first = values[0]
            if all(
                np.allclose(first, other, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan)
                for other in values[1:]
            ):
                return self.fire(
                    step,
                    f"{name} did not change over steps {steps[0]}..{steps[-1]}",
                    name,
                    float(np.mean(first)),
                )
        return False


@register_rule
class ClassImbalance(Rule):
    """Fires when the largest class outnumbers the smallest by more than ``threshold_imbalance`` in the
    training labels (once ``samples`` labels were seen), or when, at an evaluation, the fraction of
    a class's held-out samples that are mispredicted exceeds ``threshold_misprediction``.

    Mispredictions are judged on EVAL labels and predictions only: on training batches they are
    high for every class before the network has learnt anything, which is not an imbalance.
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
        self._seen: set[tuple[int, str]] = set()

    def _pair(self, step: int, mode: str) -> tuple[str, np.ndarray, str | None, np.ndarray | None] | None:
        labels = self.base_trial.tensor_names(regex=self.labels_regex, step=step, mode=mode)
        label = _value_at(self.base_trial, labels[0], step, mode) if labels else None
        if label is None or (step, mode) in self._seen:
            return None
        self._seen.add((step, mode))
        preds = self.base_trial.tensor_names(regex=self.predictions_regex, step=step, mode=mode)
        pred = _value_at(self.base_trial, preds[0], step, mode) if preds else None
        if label.ndim > 1:
            label = label.argmax(axis=-1)
        if pred is not None and (self.argmax or pred.ndim > 1):
            pred = pred.argmax(axis=-1)
        pred_array = None if pred is None else pred.astype(np.int64).ravel()
        return labels[0], label.astype(np.int64).ravel(), preds[0] if preds else None, pred_array

    def invoke_at_step(self, step: int) -> bool:
        train = self._pair(step, "TRAIN")
        if train is not None:
            for cls, count in zip(*np.unique(train[1], return_counts=True), strict=True):
                self._counts[int(cls)] = self._counts.get(int(cls), 0) + int(count)
            if sum(self._counts.values()) >= self.samples:
                largest = max(self._counts, key=self._counts.__getitem__)
                smallest = min(self._counts, key=self._counts.__getitem__)
                ratio = self._counts[largest] / self._counts[smallest]
                if ratio > self.threshold_imbalance:
                    return self.fire(
                        step,
                        f"class {largest} has {self._counts[largest]} training samples and class {smallest} "
                        f"{self._counts[smallest]}: imbalance {ratio:.3g} exceeds "
                        f"{self.threshold_imbalance:g} at step {step}",
                        train[0],
                        ratio,
                    )
        held_out = self._pair(step, "EVAL")
        if held_out is None or held_out[3] is None:
            return False
        _, labels, pred_name, preds = held_out
        for cls in np.unique(labels):
            mask = labels == cls
            fraction = float(np.mean(preds[mask] != cls))
            if fraction > self.threshold_misprediction:
                return self.fire(
                    step,
                    f"class {int(cls)} is mispredicted on {fraction:.0%} of {int(mask.sum())} held-out "
                    f"samples, more than {self.threshold_misprediction:g}, at step {step}",
                    pred_name,
                    fraction,
                    "EVAL",
                )
        return False


@register_rule
class DeadRelu(Rule):
    """Fires when more than ``threshold_layer`` percent of a layer's units are inactive, a unit being
    inactive when it is active on fewer than ``threshold_inactivity`` percent of its inputs.

    Debugger's rule, made meaningful for ELU as well as ReLU: a unit counts as active where its
    local derivative is not negligible. For ReLU that is output > 0; for ELU (recognised by negative
    outputs) the derivative below zero is output + 1 (alpha 1, PyTorch's default), and the unit
    counts as active where that is at least 0.01, i.e. it is not saturated at -1. Units are channels
    (axis 1) of ``activations/<module>`` tensors; by default those of activation-function modules
    (the ``activation_outputs`` collection), as our tensor names do not end in ``relu_output``.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"activation_outputs": 100}
    ELU_MIN_DERIVATIVE = 0.01

    def __init__(
        self,
        base_trial: Trial,
        *,
        tensor_regex: list[str] | None = None,
        threshold_inactivity: float = 1.0,
        threshold_layer: float = 50.0,
    ) -> None:
        super().__init__(base_trial)
        self.tensor_regex = tensor_regex
        self.threshold_inactivity = threshold_inactivity
        self.threshold_layer = threshold_layer

    def collections_needed(self) -> Mapping[str, int]:
        return {"activations": 100} if self.tensor_regex else {"activation_outputs": 100}

    @classmethod
    def active(cls, value: np.ndarray) -> np.ndarray:
        """Boolean mask of positions where the unit passes gradient."""
        if value.min(initial=0.0) < 0:  # ELU-like: saturates at -alpha instead of clipping at 0
            return value + 1.0 >= cls.ELU_MIN_DERIVATIVE
        return value > 0

    def invoke_at_step(self, step: int) -> bool:
        if self.tensor_regex:
            names = self.base_trial.tensor_names(regex=self.tensor_regex, step=step, mode="TRAIN")
        else:
            names = self.base_trial.tensor_names(collection="activation_outputs", step=step, mode="TRAIN")
        for name in names:
            value = _value_at(self.base_trial, name, step, "TRAIN")
            if value is None or value.ndim < 2 or not np.issubdtype(value.dtype, np.floating):
                continue
            units = np.moveaxis(value, 1, 0).reshape(value.shape[1], -1)
            activity = self.active(units).mean(axis=1) * 100
            dead = float(np.mean(activity < self.threshold_inactivity) * 100)
            if dead > self.threshold_layer:
                return self.fire(
                    step,
                    f"{dead:.0f}% of the units of {name} are inactive (active on < "
                    f"{self.threshold_inactivity:g}% of inputs) at step {step}, more than {self.threshold_layer:g}%",
                    name,
                    dead,
                )
        return False
