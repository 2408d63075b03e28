"""The reference recipe: each hyperparameter of the reference job (model/train.py) with its default,
its bounds and what it means, in one place.

The job takes these defaults and help texts (model/recipe.py, the one import of the reference
script from this package); the workflow's `run_spec` input section has the same defaults and
refuses a value outside these bounds (stabilizer_workflow.execution.execution_input.RunSpec), and the
reference job's knobs, which remedies turn, stay inside them (stabilizer_workflow.execution.reference). A
script run by hand is not held to the bounds (a rate of 0 makes a plateau for the detection tests).
Dependency-free, as the whole package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hyperparameter:
    default: Any
    help: str
    low: float | None = None  # bounds of a number; `low_open`: the low bound itself is refused
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] | None = None

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused, or None."""
        if self.choices is not None:
            return None if value in self.choices else f"expected one of {', '.join(self.choices)}, got {value!r}"
        if isinstance(value, bool) or not isinstance(value, int | float) or (self.low is None and self.high is None):
            return None
        below = value <= self.low if self.low_open else value < self.low if self.low is not None else False
        if math.isnan(value) or below or (self.high is not None and value > self.high):
            low = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
            high = "" if self.high is None else f"<= {self.high:g}"
            return f"expected {' and '.join(p for p in (low, high) if p)}, got {value!r}"
        return None


# The reference network, ResNet-20 with ELU and no batch norm, warmed up at 0.1 then trained at 0.1:
# the recipe that explodes, which the workflow recovers (docs/local-mode.md).
RECIPE: dict[str, Hyperparameter] = {
    "warmup_learning_rate": Hyperparameter(0.1, "learning rate for the first warmup_epochs epochs",
                                           low=0, low_open=True, high=10),
    "learning_rate": Hyperparameter(0.1, "learning rate after warm-up", low=0, low_open=True, high=10),
    "warmup_epochs": Hyperparameter(1, "number of epochs at the warm-up learning rate", low=0, high=1000),
    "add_batch_norm": Hyperparameter(0, "1 adds BatchNorm before each residual addition, 0 leaves it out",
                                     low=0, high=1),
    "num_epochs": Hyperparameter(3, "number of epochs to train", low=1, high=1000),
    "batch_size": Hyperparameter(128, "mini-batch size", low=1, high=8192),
    "depth": Hyperparameter(20, "ResNet depth, 6n+2 (20 = three stages of three blocks)", low=8, high=1202),
    "activation": Hyperparameter("elu", "activation in the residual blocks: elu or relu", choices=("elu", "relu")),
    "grad_clip": Hyperparameter(0.0, "clip the total gradient norm to this value; 0 turns clipping off",
                                low=0, high=1e6),
    "seed": Hyperparameter(0, "random seed for initialisation and data order", low=0, high=2**31 - 1),
    "checkpoint_every": Hyperparameter(50, "steps between checkpoints (the last step always checkpoints)", low=1),
    "max_steps": Hyperparameter(0, "stop after this many steps in total; 0 means no limit", low=0),
}


def depth_problem(depth: int) -> str | None:
    """A ResNet of three stages of n blocks has depth 6n+2."""
    if (depth - 2) % 6:
        return f"ResNet depth must be 6n+2 (20, 32, 44, 56, ...), got {depth}"
    return None


def problem(name: str, value: Any) -> str | None:
    """Why the reference job refuses `value` for hyperparameter `name`, or None."""
    found = RECIPE[name].problem(value)
    return found or (depth_problem(value) if name == "depth" else None)
