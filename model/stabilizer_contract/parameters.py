"""The vocabulary of the rule catalogue: where a rule runs, its family, a parameter and its bounds.

``Param`` converts one value the way both sides of a rule list read it (an execution input's JSON
and Debugger's text ``RuleParameters``); ``RuleEntry`` is one rule's name and parameters. The
entries themselves, and the functions that check a rule list, are in ``catalogue``. Pure Python
with no third-party import (the Lambda asset and the training job both carry it).
"""


from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

ENGINE = "engine"
DEBUGGER = "debugger"
TENSOR = "tensor"
PROFILER = "profiler"

# Debugger's RuleParameters values are at most 256 characters (CreateTrainingJob's limit).
PARAMETER_TEXT_MAX = 256
# Debugger runs at most 20 rules of each kind per training job.
MAX_RULES = 20

# The sentinel's own checks: entries of these names configure them and add no rule. They run in the
# job only; SageMaker Debugger has no rule of these names, so they never go to Debugger.
NOT_LEARNING = "NotLearning"
DIVERGING = "Diverging"
SENTINEL_CHECKS = (NOT_LEARNING, DIVERGING)
# A rule that never saw a tensor it reads (a configuration to fix, not the rule's condition).
NO_TENSOR_MATCHED = "NoTensorMatched"

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_NONE = frozenset({"", "none", "null"})


class RuleConfigError(ValueError):
    """A rule list is wrong; the message names the rule and parameter and says what is valid."""


@dataclass(frozen=True)
class Param:
    """One rule parameter.

    ``kind``: ``float``, ``int``, ``bool``, ``str``, ``regex`` (one pattern), ``regex_list`` and
    ``name_list`` (a list or a comma-separated string), ``float_list`` (comma-separated numbers),
    or ``choice`` (one of ``choices``, case-insensitive). ``optional``: None (or the text "None")
    is a valid value. ``low``/``high`` bound numbers (and every number of a ``float_list``);
    ``low_open``/``high_open`` make a bound exclusive.
    """

    name: str
    kind: str
    default: Any = None
    optional: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False

    def describe(self) -> str:
        """What is valid, in words, for error messages."""
        kind = {
            "float": "a number",
            "int": "an integer",
            "bool": "True or False",
            "str": "a string",
            "regex": "a regular expression",
            "regex_list": "regular expressions (a list or a comma-separated string)",
            "name_list": "names (a list or a comma-separated string)",
            "float_list": "comma-separated numbers",
            "choice": f"one of {list(self.choices)}",
        }[self.kind]
        if self.low is not None and self.high is not None:
            kind += f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            kind += f" {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            kind += f" {'<' if self.high_open else '<='} {self.high:g}"
        if self.optional:
            kind += " or None"
        return kind

    def convert(self, value: Any, where: str) -> Any:
        """The value as the rule receives it; RuleConfigError naming ``where`` when it is not valid."""
        if isinstance(value, str) and len(value) > PARAMETER_TEXT_MAX:
            raise RuleConfigError(f"{where}: {len(value)} characters; at most {PARAMETER_TEXT_MAX} allowed")
        if self.optional and (value is None or (isinstance(value, str) and value.strip().lower() in _NONE)):
            return None
        try:
            converted = getattr(self, f"_to_{self.kind}")(value)
        except (TypeError, ValueError, re.error):
            raise RuleConfigError(f"{where}: expected {self.describe()}, got {value!r}") from None
        for number in converted if self.kind == "float_list" else [converted]:
            if isinstance(number, int | float) and not isinstance(number, bool) and not self._in_bounds(number):
                raise RuleConfigError(f"{where}: expected {self.describe()}, got {value!r}")
        return converted

    def _in_bounds(self, number: float) -> bool:
        if not math.isfinite(number):
            return False
        if self.low is not None and (number < self.low or (self.low_open and number == self.low)):
            return False
        return not (self.high is not None and (number > self.high or (self.high_open and number == self.high)))

    # -- conversions: each raises TypeError or ValueError on a value of the wrong kind
    @staticmethod
    def _to_float(value: Any) -> float:
        if isinstance(value, bool):
            raise TypeError("a boolean is not a number")
        return float(value.strip() if isinstance(value, str) else value)

    @staticmethod
    def _to_int(value: Any) -> int:
        number = Param._to_float(value)
        if not number.is_integer():
            raise ValueError("not an integer")
        return int(number)

    @staticmethod
    def _to_bool(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in _TRUE | _FALSE:
            raise ValueError("not a boolean")
        return text in _TRUE

    @staticmethod
    def _to_str(value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError("not a string")
        return value

    @staticmethod
    def _to_regex(value: Any) -> str:
        re.compile(Param._to_str(value))
        return value

    @staticmethod
    def _items(value: Any) -> list[Any]:
        items = value.split(",") if isinstance(value, str) else list(value)
        out = [item.strip() if isinstance(item, str) else item for item in items]
        return [item for item in out if item != ""]

    @staticmethod
    def _to_regex_list(value: Any) -> list[str]:
        items = Param._items(value)
        for item in items:
            Param._to_regex(item)
        if not items:
            raise ValueError("empty")
        return items

    @staticmethod
    def _to_name_list(value: Any) -> list[str]:
        items = [Param._to_str(item) for item in Param._items(value)]
        if not items:
            raise ValueError("empty")
        return items

    @staticmethod
    def _to_float_list(value: Any) -> list[float]:
        items = [Param._to_float(item) for item in Param._items(value)]
        if not items:
            raise ValueError("empty")
        return items

    def _to_choice(self, value: Any) -> str:
        text = self._to_str(value).strip().upper()
        if text not in self.choices:
            raise ValueError("not a choice")
        return text


@dataclass(frozen=True)
class RuleEntry:
    name: str
    params: tuple[Param, ...]
    runs_in: str = ENGINE
    family: str = TENSOR
    summary: str = ""
    # Groups of parameters of which at least one must be given ("You must specify either ...").
    one_of: tuple[tuple[str, ...], ...] = ()
    param_index: dict[str, Param] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "param_index", {p.name: p for p in self.params})

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params if not p.required}


def percent(name: str, default: float, **kw: Any) -> Param:
    return Param(name, "float", default, low=0, high=100, **kw)


def selection(tensor_regex: str | None = None) -> tuple[Param, Param]:
    return (Param("collection_names", "name_list", None, optional=True),
            Param("tensor_regex", "regex_list", tensor_regex, optional=True))


SELECTION = ("collection_names", "tensor_regex")
SCAN = Param("scan_interval_us", "int", 60_000_000, low=1)
