"""Rules over activation functions: DeadRelu (outputs) and SaturatedActivation (inputs).

Both count units: a unit is a channel (axis 1) of a module's output or input tensor, and its
activity is the percentage of its values (over the batch and spatial positions) at which it passes
gradient. Names, parameters and defaults are Debugger's (stabilizer_contract/catalogue.py); docs/rules.md
says where the computation differs from Debugger's guide and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from stabilizer_sentinel.capture.trial import Trial
from stabilizer_sentinel.rules.base import Rule, first_finding, register_rule, select, value_at


def _units(value: np.ndarray) -> np.ndarray:
    """(units, samples): channel axis 1 first, everything else flattened."""
    return np.moveaxis(value, 1, 0).reshape(value.shape[1], -1)


def _inactive_percent(active: np.ndarray, threshold_inactivity: float) -> float:
    """Percentage of units active on fewer than ``threshold_inactivity`` percent of their values."""
    activity = active.mean(axis=1) * 100
    return float(np.mean(activity < threshold_inactivity) * 100)


@register_rule
class DeadRelu(Rule):
    """Fires when more than ``threshold_layer`` percent of a layer's units are inactive, a unit being
    inactive when it is active on fewer than ``threshold_inactivity`` percent of its inputs.

    Tensors: outputs of modules that ``tensor_regex`` selects, matched against smdebug's names too
    (``<module>_output_0``). With the default ``.*relu_output``, every activation-function module
    (``nn.ReLU``, ``nn.ELU``, ...: the ``activation_outputs`` collection) is judged as well, whatever
    its name: under Debugger that default misses a ReLU named ``relu1`` (``relu1_output_0``) or
    ``act``; here it does not (docs/rules.md).

    A unit counts as active where its local derivative is not negligible. For ReLU that is
    output > 0. For ELU (recognised by negative outputs) the derivative below zero is output + 1
    (alpha 1, PyTorch's default), and the unit counts as active where that is at least 0.01, i.e.
    it is not saturated at -1.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"activation_outputs": 100}
    ELU_MIN_DERIVATIVE = 0.01

    def __init__(
        self,
        base_trial: Trial,
        *,
        tensor_regex: Sequence[str] | None = (".*relu_output",),
        threshold_inactivity: float = 1.0,
        threshold_layer: float = 50.0,
    ) -> None:
        super().__init__(base_trial)
        self.tensor_regex = list(tensor_regex) if tensor_regex else None
        self.threshold_inactivity = threshold_inactivity
        self.threshold_layer = threshold_layer

    @classmethod
    def active(cls, value: np.ndarray) -> np.ndarray:
        """Boolean mask of positions where the unit passes gradient."""
        if value.min(initial=0.0) < 0:  # ELU-like: saturates at -alpha instead of clipping at 0
            return value + 1.0 >= cls.ELU_MIN_DERIVATIVE
        return value > 0

    DEFAULT_REGEX = (".*relu_output",)

    def _selection(self) -> tuple[list[str] | None, list[str] | None]:
        by_type = not self.tensor_regex or tuple(self.tensor_regex) == self.DEFAULT_REGEX
        return (["activation_outputs"] if by_type else None), self.tensor_regex

    def unmatched(self) -> str | None:
        if select(self.base_trial, None, *self._selection(), "TRAIN"):
            return None
        return self._no_tensor("tensor_regex", self.tensor_regex)

    def invoke_at_step(self, step: int) -> bool:
        found: list[tuple[int, str, str | None, Any, str]] = []
        names = select(self.base_trial, step, *self._selection(), "TRAIN")
        for name in names:
            value = value_at(self.base_trial, name, step, "TRAIN")
            if value is None or value.ndim < 2 or not np.issubdtype(value.dtype, np.floating):
                continue
            dead = _inactive_percent(self.active(_units(value)), self.threshold_inactivity)
            if dead > self.threshold_layer:
                found.append((
                    step,
                    f"{dead:.0f}% of the units of {name} are inactive (active on < "
                    f"{self.threshold_inactivity:g}% of inputs) at step {step}, more than {self.threshold_layer:g}%",
                    name, dead, "TRAIN",
                ))
        return first_finding(self, found)


@register_rule
class SaturatedActivation(Rule):
    """Fires when more than ``threshold_layer`` percent of a tanh or sigmoid layer's units are saturated.

    Reads the inputs of activation-function modules (the ``activation_inputs`` collection) that
    ``collection_names`` or ``tensor_regex`` select; the default ``.*tanh_input|.*sigmoid_input``
    selects modules whose name contains ``tanh`` or ``sigmoid`` (Debugger's ``<module>_input_0``).
    A value is active when it lies strictly between the function's min and max thresholds; a unit
    is saturated when it is active on fewer than ``threshold_inactivity`` percent of its values.
    A tensor whose name contains ``sigmoid`` uses the sigmoid thresholds, any other the tanh ones.
    """

    required_collections: ClassVar[Mapping[str, int]] = {"activation_inputs": 100}

    def __init__(
        self,
        base_trial: Trial,
        *,
        collection_names: list[str] | None = None,
        tensor_regex: Sequence[str] | None = (".*tanh_input|.*sigmoid_input",),
        threshold_tanh_min: float = -9.4999,
        threshold_tanh_max: float = 9.4999,
        threshold_sigmoid_min: float = -23.0,
        threshold_sigmoid_max: float = 16.99999,
        threshold_inactivity: float = 1.0,
        threshold_layer: float = 50.0,
    ) -> None:
        super().__init__(base_trial)
        self.collection_names = collection_names
        self.tensor_regex = list(tensor_regex) if tensor_regex else None
        self.tanh = (threshold_tanh_min, threshold_tanh_max)
        self.sigmoid = (threshold_sigmoid_min, threshold_sigmoid_max)
        self.threshold_inactivity = threshold_inactivity
        self.threshold_layer = threshold_layer

    def collections_needed(self) -> Mapping[str, int]:
        needed = dict(self.required_collections)
        needed.update(dict.fromkeys(self.collection_names or (), 100))
        return needed

    def invoke_at_step(self, step: int) -> bool:
        found: list[tuple[int, str, str | None, Any, str]] = []
        for name in select(self.base_trial, step, self.collection_names, self.tensor_regex, "TRAIN"):
            value = value_at(self.base_trial, name, step, "TRAIN")
            if value is None or value.ndim < 2 or not np.issubdtype(value.dtype, np.floating):
                continue
            low, high = self.sigmoid if "sigmoid" in name.lower() else self.tanh
            units = _units(value)
            saturated = _inactive_percent((units > low) & (units < high), self.threshold_inactivity)
            if saturated > self.threshold_layer:
                found.append((
                    step,
                    f"{saturated:.0f}% of the units of {name} are saturated (inputs within ({low:g}, {high:g}) "
                    f"on < {self.threshold_inactivity:g}% of values) at step {step}, more than "
                    f"{self.threshold_layer:g}%",
                    name, saturated, "TRAIN",
                ))
        return first_finding(self, found)
