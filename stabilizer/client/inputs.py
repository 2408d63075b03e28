"""The execution input from the command line: a JSON file, ``key=value`` pairs and ``--policy``.

The input model itself (every field, its type and default) belongs to the workflow domain in
``lambdas/stabilizer_workflow/execution/execution_input.py``; this module only assembles what the
person typed into that shape and asks the domain to validate it, so the CLI rejects exactly what the
state machine would, before anything is launched. Problems are raised as ``InputProblemError`` with a one-line message.

Keys may be dotted (``run_spec.num_epochs=1``, ``limits.max_num_retraining=3``,
``job.hyperparameters.lr=0.1``); a bare key is looked up among the top-level fields, then, when
the input describes a job, among that job's hyperparameters, then the run_spec fields, then the
limits fields, then the original AWS sample's flat names (``init_warmup_learning_rate``,
``max_num_retraining``). Values are read as JSON when they parse (``1``, ``0.05``, ``true``,
``[...]``), else as text (``elu``).

A job's local paths (``job.source``, ``job.channels``) are relative to the input file (or to the
current directory without one); they are made absolute and checked here, before anything starts
(stabilizer.local.engine.staging).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


class InputProblemError(Exception):
    """The input cannot be used; the message names the problem in one line."""


def execution_input_module() -> ModuleType:
    """``stabilizer_workflow.execution.execution_input``: the single definition of the execution input."""
    try:
        from stabilizer_workflow.execution import execution_input
    except ImportError as error:
        raise InputProblemError(f"cannot load the execution input model: {error}") from None
    return execution_input


def check_execution_name(name: str, where: str = "name") -> str:
    """``name`` when Step Functions and SageMaker's tags take it for an execution; InputProblemError naming
    ``where`` (``--name``, the client's ``name``) otherwise, before anything starts."""
    from stabilizer_workflow.execution.service_limits import execution_name_problem

    problem = execution_name_problem(name)
    if problem:
        raise InputProblemError(f"{where}: {problem}")
    return name


def read_input_file(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise InputProblemError(f"input file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InputProblemError(
            f"input file {path} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except UnicodeDecodeError:
        raise InputProblemError(f"input file {path} is not UTF-8 text") from None
    if not isinstance(data, dict):
        raise InputProblemError(f"input file {path} must hold a JSON object, not a {type(data).__name__}")
    return data


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _fields(model: Any) -> dict[str, Any]:
    return dict(model.model_fields)


def resolve_key(key: str, state_module: ModuleType, data: dict[str, Any] | None = None) -> list[str]:
    """The path of ``key`` in the execution input, or InputProblemError naming the known keys."""
    top = _fields(state_module.ExecutionInput)
    nested = {"run_spec": _fields(state_module.RunSpec), "limits": _fields(state_module.Limits)}
    parts = key.split(".")
    job = (data or {}).get("job")
    sample = _migration(state_module).SAMPLE_FIELDS
    if parts[0] == "job" and len(parts) > 1:
        return parts  # the job's own fields and hyperparameters: the model checks them
    if len(parts) == 1:
        if key in top and key not in nested:
            return parts
        if isinstance(job, dict) and key in (job.get("hyperparameters") or {}):
            return ["job", "hyperparameters", key]
        home = sample.get(key)
        if home is not None and home.path is not None and home.path != _migration(state_module).CAPTURE_PATH:
            return list(home.path)  # the original sample's name for a field that has moved
        for section, fields in nested.items():
            if key in fields:
                return [section, key]
    elif len(parts) == 2 and parts[0] in nested and parts[1] in nested[parts[0]]:
        return parts
    if isinstance(job, dict):  # a job's own input: its fields and hyperparameters, not the reference job's run_spec
        known = (
            sorted(k for k in top if k not in nested)
            + sorted(job.get("hyperparameters") or {})
            + sorted(f"job.{k}" for k in _fields(state_module.Job))
            + sorted(f"limits.{k}" for k in nested["limits"])
        )
    else:
        known = (
            sorted(k for k in top if k not in nested)
            + sorted(nested["run_spec"])
            + sorted(f"limits.{k}" for k in nested["limits"])
        )
    raise InputProblemError(f"unknown key {key!r}; known keys: {', '.join(known)}")


def _fill_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Set each default the person did not give, section by section."""
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(data.get(key, {}), dict):
            _fill_defaults(data.setdefault(key, {}), value)
        else:
            data.setdefault(key, value)


def build_input(
    *,
    state_module: ModuleType,
    input_file: Path | None = None,
    pairs: list[str] = (),  # type: ignore[assignment]
    policy: str | None = None,
    defaults: dict[str, Any] | None = None,
    leave_out: Sequence[Path] = (),
) -> dict[str, Any]:
    """The execution input, validated by the workflow domain; raises InputProblemError otherwise.

    `leave_out` names run directories that a job's source directory must not carry (the CLI's
    ``--run-dir``); the source is packed here, so one over the size limit is refused now.
    """
    data: dict[str, Any] = read_input_file(input_file) if input_file else {}
    # The original sample's flat input in today's shape first, so defaults and pairs land beside it.
    try:
        data = _migration(state_module).from_sample_input(data, list(state_module.RunSpec().capture))
    except Exception as error:  # the domain's InvalidInput: where each of the sample's fields lives now
        if type(error).__name__ != "InvalidInput":
            raise
        raise InputProblemError(str(error)) from None
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise InputProblemError(f"expected key=value, got {pair!r}")
        path = resolve_key(key.strip(), state_module, data)
        target = data
        for part in path[:-1]:
            section = target.setdefault(part, {})
            if not isinstance(section, dict):
                raise InputProblemError(f"{part}: expected a JSON object, got {type(section).__name__}")
            target = section
        target[path[-1]] = parse_value(text)
    if policy is not None:
        data["policy"] = policy
    _fill_defaults(data, defaults or {})
    validate_execution_input(data, state_module)
    return localize_job(data, Path(input_file).resolve().parent if input_file else Path.cwd(), leave_out)


def localize_job(data: dict[str, Any], base: Path, leave_out: Sequence[Path] = ()) -> dict[str, Any]:
    """The input with its job's local paths absolute and checked; InputProblemError names the field."""
    from stabilizer.local.engine.staging import StagingError, localize

    try:
        return localize(data, base, leave_out)
    except StagingError as error:
        raise InputProblemError(str(error)) from None


def _migration(state_module: ModuleType) -> ModuleType:
    """``execution.migration`` of the same asset as ``state_module`` (the original sample's names)."""
    return importlib.import_module(f"{state_module.__package__}.migration")


def validate_execution_input(data: dict[str, Any], state_module: Any) -> dict[str, Any]:
    """Check an input as the state machine's first step does; InputProblemError names the field."""
    try:
        state_module.parse_execution_input(data)
    except Exception as error:  # the domain's InvalidInput names the field
        if type(error).__name__ != "InvalidInput":
            raise
        raise InputProblemError(str(error)) from None
    return data


def check_input(execution_input: dict[str, Any]) -> dict[str, Any]:
    """Validate an execution input (a notebook's) as the state machine's first step would."""
    return validate_execution_input(execution_input, execution_input_module())
