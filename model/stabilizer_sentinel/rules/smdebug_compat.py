"""SageMaker Debugger's custom-rule API (smdebug's) over the rule engine, so Debugger rules run unchanged.

A rule written for Debugger imports ``smdebug``::

    from smdebug.rules.rule import Rule
    from smdebug.exceptions import RuleEvaluationConditionMet
    from smdebug import modes

    class CheckAccuracy(Rule):
        def __init__(self, base_trial, threshold="0.05"):
            super().__init__(base_trial)
            ...
        def invoke_at_step(self, step):
            value = self.base_trial.tensor("CrossEntropyLoss_output_0").value(step)
            ...

``load_rule(path, class_name)`` loads such a file with these names bound to this module's classes
(whether or not smdebug is installed; it is never imported), and ``CustomRule``
(stabilizer_sentinel.rules.custom) runs the loaded class as a rule of the engine: in the job (the
sentinel), out of the job (the evaluator, a notebook).
Rules see the trial through ``SmdebugTrial``, which names tensors as smdebug's PyTorch hook does
(``<module>_output_0``, ``CrossEntropyLoss_input_1``, ``gradient/<Model>_<parameter>``;
stabilizer_sentinel.capture.trial). ``invoke_rule(rule, start_step=..., end_step=...)`` is smdebug's, for rules of
either kind.

This module must not stop jobs or write files.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import logging
import sys
import types
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from stabilizer_sentinel.capture.trial import TensorUnavailable as _TensorUnavailable
from stabilizer_sentinel.capture.trial import TensorUnavailableForStep as _TensorUnavailableForStep
from stabilizer_sentinel.capture.trial import Trial

# --- smdebug.core.modes ---------------------------------------------------------------------------


class ModeKeys(Enum):
    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4


TRAIN, EVAL, PREDICT, GLOBAL = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL


def _engine_mode(mode: Any) -> str | None:
    """smdebug's mode (a ModeKeys, its name, or None/GLOBAL for every mode) as the store's."""
    if mode is None:
        return None
    name = mode.name if isinstance(mode, Enum) else str(mode).upper()
    if name == "GLOBAL":
        return None
    if name not in ("TRAIN", "EVAL"):
        raise ValueError(f"mode: the job records TRAIN and EVAL steps only, not {name}")
    return name


# --- smdebug.exceptions ----------------------------------------------------------------------------


class SMDebugError(Exception):
    pass


class TensorUnavailable(_TensorUnavailable, SMDebugError):  # noqa: N818 - smdebug's name
    pass


class TensorUnavailableForStep(_TensorUnavailableForStep, SMDebugError):  # noqa: N818 - smdebug's name
    pass


class StepUnavailable(SMDebugError):  # noqa: N818 - smdebug's name
    pass


class NoMoreData(SMDebugError):  # noqa: N818 - smdebug's name
    pass


class RuleEvaluationConditionMet(SMDebugError):  # noqa: N818 - smdebug's name
    def __init__(self, rule_name: str, step: int, end_of_rule: bool = False) -> None:
        super().__init__(rule_name, step)
        self.rule_name = rule_name
        self.step = step
        self.end_of_rule = end_of_rule

    def __str__(self) -> str:
        return f"Evaluation of the rule {self.rule_name} at step {self.step} resulted in the condition being met"


# --- the trial as smdebug names it ----------------------------------------------------------------


class SmdebugTensor:
    def __init__(self, view: SmdebugTrial, native: str) -> None:
        self._view = view
        self._native = native
        self.name = view.trial.smdebug_name_of(native)

    def steps(self, mode: Any = None) -> list[int]:
        return self._view.trial.tensor(self._native).steps(mode=_engine_mode(mode))

    def value(self, step_num: int, mode: Any = None, worker: Any = None) -> np.ndarray:
        try:
            return self._view.trial.tensor(self._native).value(step_num, mode=_engine_mode(mode))
        except _TensorUnavailableForStep as error:
            raise TensorUnavailableForStep(str(error)) from None

    def reduction_value(self, step_num: int, reduction_name: str, mode: Any = None, worker: Any = None,
                        abs: bool = False) -> float:
        """smdebug's reductions, computed from the saved value (the job saves tensors in full)."""
        value = np.asarray(self.value(step_num, mode=mode), dtype=np.float64)
        return reduce(value, reduction_name, absolute=abs)


_REDUCTIONS = {
    "min": np.min, "max": np.max, "mean": np.mean, "std": np.std, "variance": np.var, "sum": np.sum,
    "prod": np.prod, "l1": lambda v: np.sum(np.abs(v)), "l2": lambda v: np.sqrt(np.sum(v * v)),
}
REDUCTION_NAMES = tuple(_REDUCTIONS)


def reduce(value: np.ndarray, reduction_name: str, *, absolute: bool = False) -> float:
    name = reduction_name.removeprefix("abs_")
    if reduction_name.startswith("abs_"):
        absolute = True
    if name.endswith("_norm"):
        name = name.removesuffix("_norm")
    if name not in _REDUCTIONS:
        raise ValueError(f"reduction_name: expected one of {sorted(_REDUCTIONS)}, got {reduction_name!r}")
    return float(_REDUCTIONS[name](np.abs(value) if absolute else value))


class SmdebugTrial:
    """A rule engine trial with smdebug's reading interface and tensor names."""

    def __init__(self, trial: Trial, name: str = "base_trial") -> None:
        self.trial = trial
        self.name = name
        self.path = getattr(trial, "path", None)

    def _native(self, name: str) -> str | None:
        return self.trial.native_name_of(name)

    def tensor_names(self, regex: Any = None, collection: Any = None, mode: Any = None,
                     step: int | None = None, show_prefixed_tensors: bool = False) -> list[str]:
        if hasattr(collection, "name"):  # smdebug passes Collection objects too
            collection = collection.name
        natives = self.trial.tensor_names(regex=regex, collection=collection, mode=_engine_mode(mode), step=step)
        return [self.trial.smdebug_name_of(native) for native in natives]

    def has_tensor(self, tname: str) -> bool:
        return self._native(tname) is not None

    def tensor(self, tname: str) -> SmdebugTensor:
        native = self._native(tname)
        if native is None:
            known = [self.trial.smdebug_name_of(n) for n in self.trial.tensor_names()]
            closest = difflib.get_close_matches(tname, known, n=3, cutoff=0.5)
            error = TensorUnavailable(f"no tensor named {tname!r} in the trial (closest: {closest}; "
                                      f"{len(known)} tensors)")
            error.tensor_name = tname
            raise error
        return SmdebugTensor(self, native)

    def steps(self, mode: Any = None, show_incomplete_steps: bool = False) -> list[int]:
        return self.trial.steps(mode=_engine_mode(mode))

    @property
    def _global_to_mode(self) -> dict[int, tuple[ModeKeys, int]]:
        """smdebug's private map, global step -> (mode, mode step), which Debugger examples read.

        Steps of the store are training steps in both modes (an evaluation carries the training
        step after which it ran), so the mode step equals the step; a step with an evaluation maps
        to EVAL.
        """
        mapping = {step: (TRAIN, step) for step in self.trial.steps(mode="TRAIN")}
        mapping.update({step: (EVAL, step) for step in self.trial.steps(mode="EVAL")})
        return mapping

    def wait_for_steps(self, required_steps: Iterable[int], mode: Any = None) -> None:
        self.trial.refresh()
        known = set(self.trial.steps(mode=_engine_mode(mode)))
        missing = [step for step in required_steps if step not in known]
        if missing:
            if self.trial.loaded_all_steps:
                raise NoMoreData(f"steps {missing} were not saved and the job has ended")
            raise StepUnavailable(f"steps {missing} are not available yet")

    @property
    def loaded_all_steps(self) -> bool:
        return self.trial.loaded_all_steps

    def refresh(self) -> None:
        self.trial.refresh()

    def collections(self) -> dict[str, list[str]]:
        return {name: [self.trial.smdebug_name_of(n) for n in names]
                for name, names in self.trial.collections().items()}


def as_smdebug_trial(trial: Trial | SmdebugTrial) -> SmdebugTrial:
    return trial if isinstance(trial, SmdebugTrial) else SmdebugTrial(trial)


# --- smdebug.rules.rule.Rule and invoke_rule ---------------------------------------------------------


class Rule:
    """smdebug's Rule: subclasses implement ``invoke_at_step(step) -> bool``."""

    def __init__(self, base_trial: Any, action_str: str | None = None, other_trials: Any = None) -> None:
        self.base_trial = as_smdebug_trial(base_trial) if isinstance(base_trial, Trial) else base_trial
        self.other_trials = [as_smdebug_trial(t) if isinstance(t, Trial) else t for t in other_trials or []]
        self.trials = [self.base_trial, *self.other_trials]
        self.rule_name = type(self).__name__
        self.logger = logging.getLogger(f"smdebug.rules.{self.rule_name}")
        self.action_str = action_str or ""
        self.report = {"RuleTriggered": 0, "Violations": 0, "Details": {}, "Datapoints": 0, "RuleParameters": ""}

    def set_required_tensors(self, step: int) -> None:
        pass

    def invoke_at_step(self, step: int) -> bool:
        raise NotImplementedError

    def invoke(self, step: int) -> None:
        self.set_required_tensors(step)
        if self.invoke_at_step(step):
            raise RuleEvaluationConditionMet(self.rule_name, step)


def invoke_once(rule_obj: Any, step: int) -> None:
    if hasattr(rule_obj, "invoke"):
        rule_obj.invoke(step)
    elif rule_obj.invoke_at_step(step):  # a rule of the engine
        raise RuleEvaluationConditionMet(getattr(rule_obj, "name", "") or type(rule_obj).__name__, step)


def _trial_of(rule_obj: Any) -> Trial | None:
    trial = getattr(rule_obj, "base_trial", None)
    return trial.trial if isinstance(trial, SmdebugTrial) else trial if isinstance(trial, Trial) else None


def invoke_rule(rule_obj: Any, start_step: int | None = 0, end_step: int | None = None,
                raise_eval_cond: bool = False) -> None:
    """smdebug's ``invoke_rule``: invoke the rule at the saved steps from ``start_step`` to before ``end_step``.

    A step whose tensors the rule reads are not there is skipped, as in smdebug; a met condition
    is raised with ``raise_eval_cond``, else logged and the rule goes on (``end_of_rule`` stops it).
    """
    trial = _trial_of(rule_obj)
    start = start_step or 0
    if trial is not None:
        trial.refresh()
        steps = [s for s in trial.steps() if s >= start and (end_step is None or s < end_step)]
    else:
        steps = list(range(start, end_step if end_step is not None else start))
    for step in steps:
        try:
            invoke_once(rule_obj, step)
        except (_TensorUnavailableForStep, _TensorUnavailable, StepUnavailable) as error:
            logging.getLogger("smdebug.rules").debug(str(error))
        except RuleEvaluationConditionMet as met:
            if raise_eval_cond:
                raise
            logging.getLogger("smdebug.rules").info(str(met))
            if met.end_of_rule:
                break


# --- loading a Debugger rule file -----------------------------------------------------------------


def _modules() -> dict[str, types.ModuleType]:
    """The smdebug modules a rule file imports from, bound to this module's classes."""
    this = sys.modules[__name__]

    def module(name: str, **names: Any) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__dict__.update(names)
        return made

    modes = module("smdebug.core.modes", ModeKeys=ModeKeys, TRAIN=TRAIN, EVAL=EVAL, PREDICT=PREDICT,
                   GLOBAL=GLOBAL)
    exceptions = module("smdebug.exceptions", **{name: getattr(this, name) for name in (
        "SMDebugError", "TensorUnavailable", "TensorUnavailableForStep", "StepUnavailable", "NoMoreData",
        "RuleEvaluationConditionMet")})
    rule = module("smdebug.rules.rule", Rule=Rule)
    invoker = module("smdebug.rules.rule_invoker", invoke_rule=invoke_rule)
    rules = module("smdebug.rules", Rule=Rule, invoke_rule=invoke_rule, rule=rule, rule_invoker=invoker)
    trials = module("smdebug.trials", create_trial=create_trial)
    core = module("smdebug.core", modes=modes)
    root = module("smdebug", modes=modes, exceptions=exceptions, rules=rules, trials=trials, core=core)
    for package in (root, rules, core):
        package.__path__ = []  # importable as packages: "from smdebug.rules.rule import Rule"
    return {m.__name__: m for m in (root, modes, exceptions, rule, invoker, rules, trials, core)}


@contextlib.contextmanager
def _smdebug_bound() -> Iterator[None]:
    shims = _modules()
    saved = {name: sys.modules.get(name) for name in shims}
    sys.modules.update(shims)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def load_rule(path: str | Path, class_name: str) -> type:
    """The class ``class_name`` of the Debugger rule file at ``path`` (smdebug's names bound to ours)."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"source_s3_uri: no rule file at {source}")
    spec = importlib.util.spec_from_file_location(f"stabilizer_custom_rule_{source.stem}", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _smdebug_bound():
        spec.loader.exec_module(module)
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Rule)
                         and v is not Rule)
        raise LookupError(f"rule_to_invoke: {source.name} defines no class {class_name!r}; rule classes: {classes}")
    return found


def create_trial(path: str, name: str | None = None, **_: Any) -> SmdebugTrial:
    """smdebug's ``create_trial``: a tensor store, named as smdebug names tensors."""
    from stabilizer_sentinel.capture.trial import create_trial as open_store

    return SmdebugTrial(open_store(path), name=name or "trial")
