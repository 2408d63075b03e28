"""Rule lists in the execution input, checked by the rule engine's own catalogue.

The catalogue is the contract package's (``stabilizer_contract.catalogue``, which the asset build
copies into the Lambda asset and the job imports too), so a rule list is accepted
here exactly when the engine in the job can run it: names, parameters, types and bounds. Rules
only SageMaker Debugger runs are accepted only where the deployment enables Debugger rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stabilizer_contract.catalogue import CATALOGUE, ENGINE, PROFILER, RuleConfigError, check_rule

__all__ = ["RuleConfigError", "check_rule_config", "is_profiler_rule", "runs_in_engine"]


def check_rule_config(name: str, parameters: Mapping[str, Any], *, debugger_enabled: bool | None) -> None:
    """Raise ValueError naming the rule and parameter when the engine (or Debugger) could not run it."""
    try:
        check_rule({"name": name, "parameters": dict(parameters)}, "rule", debugger_enabled=debugger_enabled)
    except RuleConfigError as error:
        # "rule: unknown rule ..." / "rule (Name).param: ..." -> "unknown rule ..." / "(Name).param: ..."
        raise ValueError(str(error).removeprefix("rule: ").removeprefix("rule ")) from None


def runs_in_engine(name: str) -> bool:
    """Whether the in-job sentinel runs this rule (the others go to Debugger only)."""
    entry = CATALOGUE.get(name)
    return entry is not None and entry.runs_in == ENGINE


def is_profiler_rule(name: str) -> bool:
    """Debugger's ProfilerRule family (ProfilerRuleConfigurations), not its Rule family."""
    entry = CATALOGUE.get(name)
    return entry is not None and entry.family == PROFILER
