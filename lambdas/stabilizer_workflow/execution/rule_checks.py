"""Rule lists in the execution input, checked by the rule engine's own catalogue.

The catalogue is the contract package's (``stabilizer_contract.catalogue``, which the asset build
copies into the Lambda asset and the job imports too), so a rule list is accepted
here exactly when the engine in the job can run it: names, parameters, types and bounds. Rules
only SageMaker Debugger runs are accepted only where the deployment enables Debugger rules.
A custom rule (Debugger's ``Rule.custom``: ``source_s3_uri`` and ``rule_to_invoke``) runs in the
job's engine, never in Debugger; its file must be in the job's source (``custom_rule_sources``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stabilizer_contract.catalogue import (
    ACTION_KEY,
    CATALOGUE,
    ENGINE,
    PROFILER,
    SOURCE_KEY,
    RuleConfigError,
    check_actions,
    check_rule,
)

__all__ = ["ACTION_KEY", "RuleConfigError", "check_rule_config", "custom_rule_sources", "debugger_actions",
           "is_custom", "is_profiler_rule", "runs_in_engine"]


def check_rule_config(name: str, parameters: Mapping[str, Any], *, debugger_enabled: bool | None) -> None:
    """Raise ValueError naming the rule and parameter when the engine (or Debugger) could not run it."""
    try:
        check_rule({"name": name, "parameters": dict(parameters)}, "rule", debugger_enabled=debugger_enabled)
    except RuleConfigError as error:
        # "rule: unknown rule ..." / "rule (Name).param: ..." -> "unknown rule ..." / "(Name).param: ..."
        raise ValueError(str(error).removeprefix("rule: ").removeprefix("rule ")) from None


def is_custom(parameters: Mapping[str, Any]) -> bool:
    """A user's rule in Debugger's style (``Rule.custom``), which the engine runs from its file."""
    return SOURCE_KEY in parameters


def custom_rule_sources(rules: Any) -> dict[str, str]:
    """Rule name -> its file, relative to the job's source, for each custom rule of a rule list."""
    return {rule.name: rule.parameters[SOURCE_KEY] for rule in rules if is_custom(rule.parameters)}


def runs_in_engine(name: str, parameters: Mapping[str, Any] | None = None) -> bool:
    """Whether the in-job sentinel runs this rule (the others go to Debugger only)."""
    if is_custom(parameters or {}):
        return True
    entry = CATALOGUE.get(name)
    return entry is not None and entry.runs_in == ENGINE


def is_profiler_rule(name: str) -> bool:
    """Debugger's ProfilerRule family (ProfilerRuleConfigurations), not its Rule family."""
    entry = CATALOGUE.get(name)
    return entry is not None and entry.family == PROFILER


def debugger_actions(rules: Any, name: str) -> tuple[str | None, list[str]]:
    """What the rule `name` of a rule list asks when it fires, by its Debugger actions (``action_json``),
    as the in-job sentinel reads them: "stop" (StopTraining, or no action: None) or "notify" (Email/SMS
    only), and the endpoints to notify ("email:<address>", "sms:<number>")."""
    rule = next((rule for rule in rules if rule.name == name), None)
    actions = check_actions(rule.parameters.get(ACTION_KEY), name) if rule is not None else None
    if actions is None:
        return None, []
    endpoints = [f"{a['name']}:{a['endpoint']}" for a in actions if a["name"] != "stoptraining"]
    return ("stop" if any(a["name"] == "stoptraining" for a in actions) else "notify"), endpoints
