"""The rule base class, the registry, rule-list parsing, and the helpers the built-in rules share.

A rule is a class with ``__init__(self, base_trial, <parameters with defaults>)`` and
``invoke_at_step(self, step) -> bool`` (True when the condition is met), the shape SageMaker
Debugger gave custom rules. ``@register_rule`` makes it available by name to rule lists.

Built-in rules are described by the rule catalogue (``stabilizer_contract.catalogue``), the one list of
names, parameters, types, defaults and bounds that the workflow also checks execution inputs
against; registering a built-in whose ``__init__`` disagrees with its catalogue entry fails at
import, so the two cannot drift. A user-written rule that is not in the catalogue is configured
from its ``__init__`` signature instead.

This module must not stop jobs or write files.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from stabilizer_contract.catalogue import (
    CATALOGUE,
    DEBUGGER,
    INVOKE_KEY,
    SOURCE_KEY,
    RuleConfigError,
    check_rule,
    rule_items,
)
from stabilizer_contract.parameters import NO_TENSOR_MATCHED
from stabilizer_sentinel.capture.trial import TensorUnavailableForStep, Trial, matches
from stabilizer_sentinel.summary import jsonable


@dataclass(frozen=True)
class RuleFinding:
    """What a rule saw when its condition was met."""

    rule: str
    step: int
    tensor: str | None
    value: float | str | None
    message: str
    mode: str = "TRAIN"
    # The rule's Debugger actions (``action_json``): whether it stops the job, whom it notifies.
    stops: bool = True
    notify: tuple[str, ...] = ()


class Rule:
    """Base class of every rule. Subclasses declare parameters as keyword arguments of ``__init__``.

    ``required_collections`` maps collection names the rule reads to the save interval the in-job
    sentinel uses when the capture hyperparameter does not schedule that collection itself.
    ``finding`` is the finding of the last step at which ``invoke_at_step`` returned True; a rule
    object goes on being evaluated after it fired (as in Debugger, where the rule container keeps
    invoking it), and fires again only when its condition is met again.
    """

    name: ClassVar[str] = ""
    required_collections: ClassVar[Mapping[str, int]] = {}
    # Debugger's ProfilerRule family reads system metrics instead of tensors.
    reads_system_metrics: ClassVar[bool] = False

    def __init__(self, base_trial: Trial) -> None:
        self.base_trial = base_trial
        self.finding: RuleFinding | None = None
        # Debugger's actions for this rule (``action_json``); None: the sentinel's action decides.
        self.actions: tuple[dict[str, str], ...] | None = None

    def unmatched(self) -> str | None:
        """Why the rule never saw a tensor it reads, once the run is over; None when it saw them.

        A rule whose selection matched no tensor in the whole run says so instead of staying quiet.
        """
        for param in ("tensor_regex", "collection_names"):
            selection = getattr(self, param, None)
            if selection and not (self.base_trial.tensor_names(regex=selection) if param == "tensor_regex"
                                  else self.base_trial.tensor_names(collection=selection)):
                return self._no_tensor(param, selection)
        return None

    def not_judged(self) -> str | None:
        """What part of the rule's check the run gave it nothing to judge; None when it judged all of it.

        A rule of several checks that ran on part of what it reads (ClassImbalance on labels without
        predictions) says which part it skipped instead of a plain ``NoIssuesFound``.
        """
        return None

    def _no_tensor(self, param: str, value: Any) -> str:
        known = sorted({self.base_trial.smdebug_name_of(n) for n in self.base_trial.tensor_names()})
        text = value if isinstance(value, str) else ",".join(value)
        closest = difflib.get_close_matches(text.replace(".*", ""), known, n=3, cutoff=0.4)
        return (f"{self.name or type(self).__name__}: {param} {value!r} matched no tensor the job saved "
                f"(closest: {closest}; {len(known)} tensors)")

    def invoke_at_step(self, step: int) -> bool:
        raise NotImplementedError

    def invoke_idle(self, seconds_without_progress: float, last_step: int | None) -> bool:
        """Called while no new step arrives; rules about time (StalledTrainingRule) override it."""
        return False

    def collections_needed(self) -> Mapping[str, int]:
        """Collections this configured rule reads (default: the class's ``required_collections``)."""
        return dict(self.required_collections)

    def fire(self, step: int, message: str, tensor: str | None = None, value: Any = None, mode: str = "TRAIN") -> bool:
        """Record the finding and return True, so a rule can ``return self.fire(...)``."""
        actions = self.actions
        self.finding = RuleFinding(
            self.name or type(self).__name__, step, tensor, jsonable(value), message, mode,
            stops=actions is None or any(a["name"] == "stoptraining" for a in actions),
            notify=tuple(f"{a['name']}:{a['endpoint']}" for a in actions or () if a["name"] != "stoptraining"),
        )
        return True


# ---------------------------------------------------------------------------- registry and parsing

RULES: dict[str, type[Rule]] = {}


def register_rule(cls: type[Rule] | None = None, *, name: str | None = None) -> Any:
    """Class decorator: ``@register_rule`` or ``@register_rule(name="MyRule")``."""

    def wrap(rule_cls: type[Rule]) -> type[Rule]:
        rule_name = name or rule_cls.name or rule_cls.__name__
        if not issubclass(rule_cls, Rule):
            raise TypeError(f"{rule_cls!r} must subclass stabilizer_sentinel.rules.Rule")
        rule_cls.name = rule_name
        declared = rule_parameters(rule_cls)  # fail at registration, not at the first job, on a bad signature
        entry = CATALOGUE.get(rule_name)
        if entry is not None:
            expected = {
                p.name: None if p.default is None else p.convert(p.default, f"{rule_name}.{p.name}")
                for p in entry.params
            }
            got = {pname: list(d) if isinstance(d, tuple) else d for pname, (_, d) in declared.items()}
            if got != expected:
                raise TypeError(
                    f"rule {rule_name}: __init__ parameters {got} differ from its catalogue entry {expected} "
                    "(stabilizer_contract/catalogue.py); a built-in rule takes exactly the catalogue's parameters"
                )
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
    """Convert a parameter of a user-written rule to the type its ``__init__`` declares."""
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
    return str(value)


@dataclass(frozen=True)
class RuleSpec:
    """One validated entry of a rule list."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    actions: tuple[dict[str, str], ...] | None = None
    # A custom rule's class (loaded from its file; never registered by name).
    rule_class: type[Rule] | None = None

    def build(self, trial: Trial) -> Rule:
        rule = (self.rule_class or RULES[self.name])(trial, **self.parameters)
        rule.actions = self.actions
        return rule


def parse_rule(raw: Mapping[str, Any], where: str = "rule") -> RuleSpec:
    """Check one entry: built-in rules against the catalogue, user-written ones against their signature."""
    checked = check_rule(raw, where, extra=[name for name in RULES if name not in CATALOGUE])
    entry = checked.entry
    if checked.custom:
        return _load_custom(checked, where)
    if entry is not None:
        if entry.runs_in == DEBUGGER or checked.name not in RULES:
            raise RuleConfigError(
                f"{where} ({checked.name}): only SageMaker Debugger runs {checked.name}; the rule engine does not"
            )
        return RuleSpec(checked.name, checked.parameters, checked.actions)
    declared = rule_parameters(RULES[checked.name])
    unknown = sorted(set(checked.parameters) - set(declared))
    if unknown:
        raise RuleConfigError(
            f"{where} ({checked.name}): unknown parameters {unknown}; valid parameters: {sorted(declared)}"
        )
    converted = {
        pname: _convert(value, declared[pname][0], f"{where} ({checked.name}).{pname}")
        for pname, value in checked.parameters.items()
    }
    return RuleSpec(checked.name, converted, checked.actions)


# Where a custom rule's file is looked for when its path is relative: the job's code directory
# (the training toolkit runs the entry point there), else the working directory.
CODE_DIR_ENV = "STABILIZER_CODE_DIR"


# Makes the rule class that runs a Debugger rule class from its file (set_custom_rule_class).
_CUSTOM_RULE_CLASS: list[Callable[[str, Path, str], type[Rule]]] = []


def set_custom_rule_class(custom_rule_class: Callable[[str, Path, str], type[Rule]]) -> None:
    """Make the rule class of each ``Rule.custom`` entry with ``custom_rule_class(name, path, class_name)``:
    stabilizer_sentinel.rules.custom sets it, and the rules package imports that module, so it is in
    place whenever this one is imported."""
    _CUSTOM_RULE_CLASS[:] = [custom_rule_class]


def _load_custom(checked: Any, where: str) -> RuleSpec:
    """The Debugger rule class a ``Rule.custom`` entry names, loaded from its file (rules.custom)."""
    (custom_rule_class,) = _CUSTOM_RULE_CLASS
    params = dict(checked.parameters)
    source = Path(params.pop(SOURCE_KEY))
    class_name = params.pop(INVOKE_KEY)
    if not source.is_absolute():
        source = Path(os.environ.get(CODE_DIR_ENV) or os.getcwd()) / source
    try:
        rule_class = custom_rule_class(checked.name, source, class_name)
    except (OSError, LookupError, SyntaxError, ImportError) as error:
        raise RuleConfigError(f"{where} ({checked.name}): {error}") from None
    return RuleSpec(checked.name, params, checked.actions, rule_class)


def parse_rule_list(raw: str | Iterable[Mapping[str, Any]] | None) -> list[RuleSpec]:
    """Parse a rule list (docs/contracts.md section 3): a JSON string or the list itself."""
    return [parse_rule(item, f"rules[{i}]") for i, item in enumerate(rule_items(raw))]


# ---------------------------------------------------------------------------- helpers for built-ins


def select(
    trial: Trial,
    step: int | None,
    collection_names: list[str] | None,
    tensor_regex: list[str] | None,
    mode: str | None = None,
) -> list[str]:
    """Union of tensors in ``collection_names`` and matching ``tensor_regex``; all tensors if neither.

    Regexes are searched anywhere in the name, as Debugger does (``re.search``).
    """
    if not collection_names and not tensor_regex:
        return trial.tensor_names(step=step, mode=mode)
    names: dict[str, None] = {}
    if collection_names:
        names.update(dict.fromkeys(trial.tensor_names(collection=collection_names, step=step, mode=mode)))
    if tensor_regex:
        names.update(dict.fromkeys(trial.tensor_names(regex=tensor_regex, step=step, mode=mode)))
    return list(names)


def search(name: str, regex: str | list[str]) -> bool:
    return matches(name, [re.compile(item) for item in ([regex] if isinstance(regex, str) else regex)])


def value_at(trial: Trial, name: str, step: int, mode: str | None = None) -> np.ndarray | None:
    try:
        return trial.tensor(name).value(step, mode=mode)
    except (TensorUnavailableForStep, LookupError):
        return None


def scalar(value: np.ndarray) -> float:
    """A scalar tensor's value; a tensor with more than one element is rejected, not averaged."""
    if value.size != 1:
        raise ValueError(f"expected a scalar tensor, got shape {value.shape}")
    return float(value.reshape(()))


def required(collection_names: list[str] | None, default: Mapping[str, int], interval: int) -> dict[str, int]:
    if collection_names:
        return dict.fromkeys(collection_names, interval)
    return dict(default)




def unmatched_findings(rules: list[Rule], step: int) -> list[RuleFinding]:
    """At the end of a run, a finding for each rule that never saw a tensor it reads: never silence."""
    return [RuleFinding(NO_TENSOR_MATCHED, step, None, rule.name, why, stops=False)
            for rule in rules if (why := rule.unmatched()) is not None]


def first_finding(rule: Rule, found: list[tuple[int, str, str | None, Any, str]]) -> bool:
    """Fire with the first of several findings of one step (each tensor was evaluated, so state advanced)."""
    if not found:
        return False
    step, message, tensor, value, mode = found[0]
    return rule.fire(step, message, tensor, value, mode)
