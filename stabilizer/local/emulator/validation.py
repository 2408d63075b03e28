"""Validate an API request against botocore's service model, the way the service would.

botocore's own ParamValidator checks structure, types, required members and minimums; the
service additionally enforces each shape's ``max``, ``pattern`` and ``enum`` (an instance type SageMaker does
not offer is a ValidationException, not a job). Local mode checks both, so a
request that the cloud would reject is rejected here too, with the cloud's style of message.
It must not know anything about a particular operation.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import botocore.session
from botocore.model import ListShape, MapShape, OperationModel, Shape, StructureShape
from botocore.validate import ParamValidator


@lru_cache(maxsize=8)
def operation_model(service: str, operation: str) -> OperationModel:
    return botocore.session.get_session().get_service_model(service).operation_model(operation)


def _lower_first(name: str) -> str:
    return name[:1].lower() + name[1:]


def _constraint_errors(value: Any, shape: Shape, path: str) -> list[str]:  # noqa: PLR0912 one branch per shape kind
    errors: list[str] = []
    meta = shape.metadata
    if isinstance(shape, StructureShape) and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                errors += _constraint_errors(value[name], member, f"{path}.{_lower_first(name)}")
        return errors
    if isinstance(shape, ListShape) and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            errors.append(
                f"Value at '{path}' failed to satisfy constraint: "
                f"Member must have length less than or equal to {meta['max']}"
            )
        for i, item in enumerate(value):
            errors += _constraint_errors(item, shape.member, f"{path}.{i + 1}.member")
        return errors
    if isinstance(shape, MapShape) and isinstance(value, dict):
        if "max" in meta and len(value) > meta["max"]:
            errors.append(
                f"Value at '{path}' failed to satisfy constraint: "
                f"Map must have length less than or equal to {meta['max']}"
            )
        for key, item in value.items():
            errors += _constraint_errors(key, shape.key, f"{path}.{key}.key")
            errors += _constraint_errors(item, shape.value, f"{path}.{key}.value")
        return errors
    if isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            errors.append(
                f"Value '{value[:40]}' at '{path}' failed to satisfy constraint: "
                f"Member must have length less than or equal to {meta['max']}"
            )
        enum = getattr(shape, "enum", None)
        if enum and value not in enum:
            errors.append(
                f"Value '{value[:80]}' at '{path}' failed to satisfy constraint: "
                f"Member must satisfy enum value set: [{', '.join(enum)}]"
            )
        pattern = meta.get("pattern")
        if pattern:
            try:
                matches = re.fullmatch(pattern, value, flags=re.DOTALL) is not None
            except re.error:
                # A few service patterns use Java-only syntax; the service is the judge of those.
                matches = True
            if not matches:
                errors.append(
                    f"Value '{value[:80]}' at '{path}' failed to satisfy constraint: "
                    f"Member must satisfy regular expression pattern: {pattern}"
                )
    elif isinstance(value, int | float) and not isinstance(value, bool) and value > meta.get("max", value):
        errors.append(
            f"Value '{value}' at '{path}' failed to satisfy constraint: "
            f"Member must have value less than or equal to {meta['max']}"
        )
    return errors


def request_errors(service: str, operation: str, params: dict[str, Any]) -> str | None:
    """The validation message the service would return for ``params``, or None when valid."""
    model = operation_model(service, operation)
    report = ParamValidator().validate(params, model.input_shape)
    if report.has_errors():
        return report.generate_report()
    problems: list[str] = []
    for name, member in model.input_shape.members.items():
        if name in params:
            problems += _constraint_errors(params[name], member, _lower_first(name))
    if not problems:
        return None
    count = len(problems)
    noun = "error" if count == 1 else "errors"
    return f"{count} validation {noun} detected: " + "; ".join(problems)
