"""A Debugger rule as a rule of the engine: ``CustomRule`` runs a user's Debugger rule class, loaded
from its file by stabilizer_sentinel.rules.smdebug_compat, and its findings read like a built-in's.

It sets ``custom_rule_class`` as the rule lists' parser's (rules.base ``set_custom_rule_class``), which
this module imports; the rules package imports this module, so a ``Rule.custom`` entry always finds it.
"""

from __future__ import annotations

from pathlib import Path

from stabilizer_sentinel.capture.trial import TensorUnavailable as _TensorUnavailable
from stabilizer_sentinel.capture.trial import TensorUnavailableForStep as _TensorUnavailableForStep
from stabilizer_sentinel.capture.trial import Trial
from stabilizer_sentinel.rules.base import Rule as EngineRule
from stabilizer_sentinel.rules.base import set_custom_rule_class
from stabilizer_sentinel.rules.smdebug_compat import (
    RuleEvaluationConditionMet,
    SmdebugTrial,
    StepUnavailable,
    invoke_once,
    load_rule,
)


class CustomRule(EngineRule):
    """Runs a user's Debugger rule class in the engine (``load_rule``), its findings like a built-in's.

    Parameters reach the user's ``__init__`` as Debugger passes them: strings, by name. A step whose
    tensors are missing is skipped (smdebug's ``invoke_rule`` does the same); a rule that never
    found its tensors in the whole run says so (``unmatched``).
    """

    user_class: type = object

    def __init__(self, base_trial: Trial, **parameters: str) -> None:
        super().__init__(base_trial)
        self.parameters = parameters
        self.user_rule = self.user_class(SmdebugTrial(base_trial), **parameters)
        self._missing: dict[str, str] = {}  # tensor name -> why, for names the trial never had

    def invoke_at_step(self, step: int) -> bool:
        try:
            invoke_once(self.user_rule, step)
        except (_TensorUnavailableForStep, _TensorUnavailable, StepUnavailable) as error:
            name = getattr(error, "tensor_name", None)
            if name is not None:
                self._missing.setdefault(name, str(error))
            return False
        except RuleEvaluationConditionMet as met:
            return self.fire(step, f"Evaluation of the rule {self.name} ({type(self.user_rule).__name__}, a custom "
                                   f"rule) at step {met.step} resulted in the condition being met")
        return False

    def unmatched(self) -> str | None:
        """The tensors the rule asked for that the job never saved, named with what it did save."""
        never = {name: why for name, why in self._missing.items() if not self.base_trial.has_tensor(name)}
        if not never:
            return None
        return f"{self.name} read tensors the job never saved: {'; '.join(never.values())}"


def custom_rule_class(name: str, path: str | Path, class_name: str) -> type[CustomRule]:
    """A rule class of the engine, named ``name``, that runs ``class_name`` of the file at ``path``."""
    user_class = load_rule(path, class_name)
    return type(name, (CustomRule,), {"user_class": user_class, "name": name})


set_custom_rule_class(custom_rule_class)
