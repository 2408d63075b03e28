"""The original AWS sample's flat execution input, read in today's shape.

The sample started executions with one flat object::

    {"init_warmup_learning_rate": 0.1, "learning_rate": 0.1, "add_batch_norm": 0, "num_epochs": 3,
     "bucket": "...", "base_job_name": "...", "instance_type": "ml.p3.2xlarge", "region": "us-east-1",
     "debugger_save_interval": 100, "max_num_retraining": 10, "max_monitor_transitions": 300}

Today the recipe is under ``run_spec``, the bounds under ``limits``, and the bucket, the job name
prefix and the region are deployment settings baked in by ``cdk deploy``. Given the flat shape:

- when every flat field has a home in the execution input, the input is rewritten into today's
  shape and the execution runs what was meant (numbers given as text, as the sample's
  hyperparameters were, are read as numbers);
- when some field is a deployment setting, nothing runs and one ``InvalidInput`` message says,
  for every flat field, where it lives now, followed by the input to use instead.

Pure: no AWS calls, no environment. ``parse_execution_input`` calls ``from_sample_input`` first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stabilizer_workflow.errors import InvalidInput


@dataclass(frozen=True)
class Home:
    """Where one of the sample's fields lives now: a path in the execution input, or (``path``
    None) a deployment setting described by ``where``."""

    path: tuple[str, ...] | None
    where: str


# Every collection the sample's Debugger hook saved at ``debugger_save_interval``; today each
# collection has its own interval under run_spec.capture.
CAPTURE_PATH = ("run_spec", "capture")

SAMPLE_FIELDS: dict[str, Home] = {
    "init_warmup_learning_rate": Home(("run_spec", "warmup_learning_rate"), "run_spec.warmup_learning_rate"),
    "learning_rate": Home(("run_spec", "learning_rate"), "run_spec.learning_rate"),
    "add_batch_norm": Home(("run_spec", "add_batch_norm"), "run_spec.add_batch_norm (0 or 1)"),
    "num_epochs": Home(("run_spec", "num_epochs"), "run_spec.num_epochs"),
    "instance_type": Home(("run_spec", "instance_type"), "run_spec.instance_type"),
    "debugger_save_interval": Home(
        CAPTURE_PATH, "run_spec.capture.<collection>.save_interval, one interval per collection"
    ),
    "max_num_retraining": Home(("limits", "max_num_retraining"), "limits.max_num_retraining"),
    "max_monitor_transitions": Home(("limits", "max_monitor_transitions"), "limits.max_monitor_transitions"),
    "bucket": Home(
        None,
        "a deployment setting: the stack creates its bucket (output BucketName) and every execution uses it",
    ),
    "base_job_name": Home(
        None,
        "a deployment setting: jobs are named <job_name_prefix>-<execution>-<attempt>; "
        "set it with `cdk deploy -c job_name_prefix=...`",
    ),
    "region": Home(None, "a deployment setting: executions run in the region the stack is deployed to"),
}


def is_sample_input(raw: dict[str, Any]) -> bool:
    return any(key in SAMPLE_FIELDS for key in raw)


def _number(value: Any) -> Any:
    """The sample passed hyperparameters as text as often as numbers: read "0.1" as 0.1."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, int | float) and not isinstance(parsed, bool):
            return parsed
    return value


def _value(key: str, value: Any) -> Any:
    if key == "add_batch_norm":
        text = str(value).strip().lower()
        if text in ("true", "1", "1.0"):
            return 1
        if text in ("false", "0", "0.0"):
            return 0
        return value
    if key == "instance_type":
        return value
    return _number(value)


def _capture(interval: Any, collections: list[str]) -> dict[str, Any]:
    return {name: {"save_interval": interval} for name in collections}


def from_sample_input(raw: dict[str, Any], default_collections: list[str]) -> dict[str, Any]:
    """``raw`` in today's shape (unchanged when it has none of the sample's flat fields).

    Raises InvalidInput, one message for every flat field, when one of them is a deployment
    setting or collides with a field also given in today's shape.
    """
    if not is_sample_input(raw):
        return raw
    translated: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    problems: list[str] = []
    flat = [key for key in raw if key in SAMPLE_FIELDS]
    for key in flat:
        home = SAMPLE_FIELDS[key]
        value = translated.pop(key)
        if home.path is None:
            problems.append(key)
            continue
        section, field = home.path
        target = translated.setdefault(section, {})
        if not isinstance(target, dict):
            continue  # today's validation names the section
        new = _capture(_number(value), default_collections) if home.path == CAPTURE_PATH else _value(key, value)
        if field in target and target[field] != new:
            problems.append(key)
            continue
        target[field] = new
    if problems:
        raise InvalidInput(_message(raw, flat, translated, problems))
    return translated


def _message(raw: dict[str, Any], flat: list[str], translated: dict[str, Any], problems: list[str]) -> str:
    lines = [
        "input: this is the original sample's flat input; its fields have moved "
        f"({', '.join(problems)} cannot be given per execution):"
    ]
    for key in flat:
        home = SAMPLE_FIELDS[key]
        if home.path is None:
            lines.append(f"  {key}: {home.where}; remove it")
        elif key in problems:
            lines.append(f"  {key}: now {home.where}, which the input also gives with another value; keep one")
        else:
            lines.append(f"  {key}: now {home.where}")
    lines.append("Start the execution with this input instead:")
    lines.append("  " + json.dumps(translated, separators=(", ", ": ")))
    return "\n".join(lines)
