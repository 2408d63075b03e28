"""How a recipe reads as text: ``warm-up LR 0.1, LR 0.1, no BN``, and the next one as a diff.

The one home of a recipe's words: the workflow's notifications, the CLI's table, the report and
the notebook all write a recipe through `recipe_text`, named through the job's knobs
(`knob_names`). Pure formatting: it reads values, it never changes a recipe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stabilizer_workflow.execution.state import WorkflowState


def format_value(value: Any) -> str:
    """A value as a message shows it: floats in six significant digits, lists and dicts as compact JSON."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def recipe_diff(changes: dict[str, list[Any]]) -> str:
    """The next recipe as a diff against the last one."""
    if not changes:
        return "  (unchanged)"
    lines = []
    for key, (old, new) in changes.items():
        lines.append(f"- {key}: {format_value(old)}")
        lines.append(f"+ {key}: {format_value(new)}")
    return "\n".join(lines)


# The reference job's hyperparameter for each knob role (stabilizer_workflow.execution.reference declares the same).
REFERENCE_KNOB_NAMES = {
    "warmup_learning_rate": "warmup_learning_rate",
    "learning_rate": "learning_rate",
    "normalization": "add_batch_norm",
    "grad_clip": "grad_clip",
}


def knob_names(state: WorkflowState | Mapping[str, Any] | None) -> dict[str, str]:
    """Role -> the job's hyperparameter name, from a state or a state payload; the reference job's
    names when the state says nothing of a job."""
    if isinstance(state, WorkflowState):
        return {role: knob.hyperparameter for role, knob in state.job.knobs.declared().items()}
    knobs = ((state or {}).get("job") or {}).get("knobs") if isinstance(state, Mapping) else None
    if not isinstance(knobs, Mapping):
        return dict(REFERENCE_KNOB_NAMES)
    return {role: knob["hyperparameter"] for role, knob in knobs.items()
            if isinstance(knob, Mapping) and "hyperparameter" in knob}


def recipe_text(spec: Mapping[str, Any], knobs: Mapping[str, str] | None = None) -> str:
    """A recipe in a few words, through the job's knobs: ``warm-up LR 0.1, LR 0.1, no BN``.

    The one summary of a recipe: notifications, the CLI's table, the report and the notebook all
    use it. `spec` is a run_spec (the job's hyperparameters) or a mapping of them; `knobs` maps
    knob roles to the job's hyperparameter names (`knob_names`), the reference job's by default.
    A job whose knobs say nothing of the recipe shows its first hyperparameters as they are.
    """
    values = dict(spec)
    names = REFERENCE_KNOB_NAMES if knobs is None else knobs

    def value(role: str) -> Any:
        return values.get(names[role]) if role in names else None

    parts = [
        f"{label} {value(role):g}"
        for role, label in (("warmup_learning_rate", "warm-up LR"), ("learning_rate", "LR"))
        if isinstance(value(role), int | float)
    ]
    if "normalization" in names:
        parts.append("BN" if value("normalization") in (1, True) else "no BN")
    clip = value("grad_clip")
    if isinstance(clip, int | float) and clip:
        parts.append(f"clip {clip:g}")
    if not parts:
        parts = [f"{key}={format_value(item)}" for key, item in list(values.items())[:4]]
    return ", ".join(parts) or "no hyperparameters"
