"""What the sentinel library reads from the training job: the ``sagemaker_stabilizer`` configuration and paths.

The workflow passes one JSON value in the hyperparameter ``sagemaker_stabilizer`` (docs/contracts.md,
section 8). The SageMaker training toolkit keeps ``sagemaker_*`` hyperparameters out of the script's
command line and ``SM_HPS``, so the user's argument parser never sees it; the library reads it from
``hyperparameters.json`` itself:

- ``$STABILIZER_HYPERPARAMETERS_FILE`` when set (tests, ``python -m stabilizer_sentinel.launch`` by hand),
- else ``$SM_INPUT_CONFIG_DIR/hyperparameters.json`` (the toolkit and the local emulator set it),
- else ``/opt/ml/input/config/hyperparameters.json``.

``$STABILIZER_CONFIG`` (the JSON object itself) wins over the file, for runs outside any job directory.
Paths come from the environment train.py has always read: ``STABILIZER_CHECKPOINT_DIR`` (findings and
the tensor store), ``STABILIZER_FAILURE_FILE``, ``STABILIZER_TENSOR_DIR``.

This module must not import torch: the launcher's ``sitecustomize`` reads it in every Python process
of the container and activates nothing unless asked.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stabilizer_contract.job import (
    CHECKPOINT_DIR_VARIABLE,
    CHECKPOINT_LOCAL_PATH,
    CONFIG_HYPERPARAMETER,
    FINGERPRINT_PATTERN,
)

HYPERPARAMETER = CONFIG_HYPERPARAMETER
ACTIONS = ("stop", "notify")
INTEGRATIONS = ("auto", "library", "launcher")
# Matches "loss=0.93", "loss: 0.93", "loss 0.93" but not "test_loss=...", "val_loss=..." or a term's own name: until
# stop 87 "loss1 2.31 loss2 0.81" read as 1 (the name's digit), and a multi-task run's loss as a constant.
DEFAULT_LOSS_REGEX = r"(?:^|[\s,;|(\[{])loss(?:\s*[=:]\s*|\s+)([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf))"
DEFAULT_RULES: tuple[dict[str, Any], ...] = ({"name": "ExplodingTensor"},)
RECOVERIES = ("in_job", "relaunch")
_KEYS = {"rules", "capture", "action", "integration", "loss_regex", "knobs", "recovery", "skip_batches",
         "skip_nonfinite_batches", "objective"}
OBJECTIVE_TYPES = ("Maximize", "Minimize")
FINGERPRINT = re.compile(FINGERPRINT_PATTERN)


class StabilizerConfigError(ValueError):
    """The ``sagemaker_stabilizer`` configuration is wrong; the message names the field."""


@dataclass(frozen=True)
class StabilizerConfig:
    """The sentinel's settings. ``None`` means "not set by the job": the caller's default applies."""

    rules: list[dict[str, Any]] | None = None
    capture: dict[str, Any] | None = None
    action: str | None = None
    integration: str | None = None
    loss_regex: str | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    # in_job: roll back and go on at a probed rate (stabilizer_sentinel.recovery.recovery); relaunch: stop for the
    # workflow.
    recovery: str | None = None
    # Fingerprints of batches an earlier attempt found bad (a rollback's ``bad_batch``): passed over.
    skip_batches: tuple[str, ...] = ()
    # An earlier attempt's bad batch held corrupt records (non-finite values the batches after it lacked):
    # every batch with non-finite values is passed over (stabilizer_sentinel.recovery.batches.nonfinite).
    skip_nonfinite_batches: bool = False
    # The job's objective metric: {"name", "regex" (one capture group), "type": Maximize or Minimize}; its log
    # lines' readings say whether the run learned where the loss does not (stabilizer_sentinel.summary.Objective).
    objective: dict[str, str] | None = None

    def with_defaults(self, **defaults: Any) -> StabilizerConfig:
        """Fill the fields the job left unset from ``defaults`` (the script's own arguments)."""
        unset = {name: value for name, value in defaults.items() if getattr(self, name) is None and value is not None}
        return replace(self, **unset)

    @property
    def effective_rules(self) -> list[dict[str, Any]]:
        return list(DEFAULT_RULES) if self.rules is None else list(self.rules)

    @property
    def effective_capture(self) -> dict[str, Any]:
        return dict(self.capture or {})

    @property
    def effective_action(self) -> str:
        return self.action or "stop"

    @property
    def effective_recovery(self) -> str:
        return self.recovery or "relaunch"

    @property
    def effective_loss_regex(self) -> str:
        return self.loss_regex or DEFAULT_LOSS_REGEX


def parse_config(raw: str | Mapping[str, Any] | None) -> StabilizerConfig:
    """Parse the hyperparameter's value: JSON text of an object, or that text JSON-encoded once more."""
    if raw is None or raw == "":
        return StabilizerConfig()
    value: Any = raw
    for _ in range(2):  # hyperparameters.json holds strings; SDK-style encoding may wrap the text again
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise StabilizerConfigError(f"{HYPERPARAMETER}: expected a JSON object, got {raw!r} ({exc})") from None
    if not isinstance(value, Mapping):
        raise StabilizerConfigError(f"{HYPERPARAMETER}: expected a JSON object, got {value!r}")
    unknown = set(value) - _KEYS
    if unknown:
        raise StabilizerConfigError(
            f"{HYPERPARAMETER}: unknown keys {sorted(unknown)}; valid keys: {sorted(_KEYS)}"
        )
    return _validated(value)


def _validated(value: Mapping[str, Any]) -> StabilizerConfig:
    rules = value.get("rules")
    if rules is not None and not isinstance(rules, list):
        raise StabilizerConfigError(f"{HYPERPARAMETER}.rules: expected a JSON list of rules, got {rules!r}")
    capture = value.get("capture")
    if capture is not None and not isinstance(capture, Mapping):
        raise StabilizerConfigError(f"{HYPERPARAMETER}.capture: expected a JSON object, got {capture!r}")
    action = value.get("action")
    if action is not None and action not in ACTIONS:
        raise StabilizerConfigError(f"{HYPERPARAMETER}.action: expected one of {list(ACTIONS)}, got {action!r}")
    integration = value.get("integration")
    if integration is not None and integration not in INTEGRATIONS:
        raise StabilizerConfigError(
            f"{HYPERPARAMETER}.integration: expected one of {list(INTEGRATIONS)}, got {integration!r}"
        )
    loss_regex = value.get("loss_regex")
    if loss_regex is not None:
        _one_group(loss_regex, f"{HYPERPARAMETER}.loss_regex")
    recovery = value.get("recovery")
    if recovery is not None and recovery not in RECOVERIES:
        raise StabilizerConfigError(f"{HYPERPARAMETER}.recovery: expected one of {list(RECOVERIES)}, got {recovery!r}")
    skip = value.get("skip_batches") or []
    if not isinstance(skip, list) or not all(isinstance(f, str) and FINGERPRINT.fullmatch(f) for f in skip):
        raise StabilizerConfigError(
            f"{HYPERPARAMETER}.skip_batches: expected a JSON list of 16-digit hexadecimal fingerprints, got {skip!r}")
    skip_nonfinite = value.get("skip_nonfinite_batches", False)
    if not isinstance(skip_nonfinite, bool):
        raise StabilizerConfigError(
            f"{HYPERPARAMETER}.skip_nonfinite_batches: expected true or false, got {skip_nonfinite!r}")
    knobs = value.get("knobs") or {}
    return StabilizerConfig(
        objective=_objective(value.get("objective")),
        skip_batches=tuple(skip),
        skip_nonfinite_batches=skip_nonfinite,
        recovery=recovery,
        rules=rules,
        capture=dict(capture) if capture is not None else None,
        action=action,
        integration=integration,
        loss_regex=loss_regex,
        knobs=dict(knobs) if isinstance(knobs, Mapping) else {},
    )


def _objective(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    where = f"{HYPERPARAMETER}.objective"
    if not isinstance(value, Mapping) or set(value) != {"name", "regex", "type"}:
        raise StabilizerConfigError(f"{where}: expected an object of name, regex and type, got {value!r}")
    if not isinstance(value["name"], str) or not value["name"]:
        raise StabilizerConfigError(f"{where}.name: expected the metric's name, got {value['name']!r}")
    if value["type"] not in OBJECTIVE_TYPES:
        raise StabilizerConfigError(f"{where}.type: expected one of {list(OBJECTIVE_TYPES)}, got {value['type']!r}")
    _one_group(value["regex"], f"{where}.regex")
    return {"name": value["name"], "regex": value["regex"], "type": value["type"]}


def _one_group(regex: Any, where: str) -> None:
    """A metric's regex: it compiles, with a capture group around the number."""
    try:
        compiled = re.compile(regex)
    except (re.error, TypeError) as exc:
        raise StabilizerConfigError(f"{where}: not a regular expression ({exc})") from None
    if compiled.groups < 1:
        raise StabilizerConfigError(f"{where}: needs one capture group around the number, got {regex!r}")


def hyperparameters_file(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("STABILIZER_HYPERPARAMETERS_FILE"):
        return Path(env["STABILIZER_HYPERPARAMETERS_FILE"])
    return Path(env.get("SM_INPUT_CONFIG_DIR") or "/opt/ml/input/config") / "hyperparameters.json"


def load_config(environ: Mapping[str, str] | None = None) -> StabilizerConfig:
    """The job's configuration; an empty one (every field unset) when the job has none."""
    env = os.environ if environ is None else environ
    if env.get("STABILIZER_CONFIG"):
        return parse_config(env["STABILIZER_CONFIG"])
    path = hyperparameters_file(env)
    if not path.is_file():
        return StabilizerConfig()
    try:
        hyperparameters = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StabilizerConfigError(f"{path}: not JSON ({exc})") from None
    return parse_config(hyperparameters.get(HYPERPARAMETER))


@dataclass(frozen=True)
class JobPaths:
    """Where findings, the tensor store and the failure reason go, and where a resume checkpoint comes from.

    ``resume_dir`` is the ``resume`` input channel (docs/contracts.md, section 1): the workflow puts the
    checkpoint a relaunch resumes from there; ``guard.restore()`` reads it when the job has none of its own.
    """

    checkpoint_dir: Path
    failure_file: Path
    tensor_dir: Path
    resume_dir: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobPaths:
        env = os.environ if environ is None else environ
        checkpoint_dir = Path(env.get(CHECKPOINT_DIR_VARIABLE) or CHECKPOINT_LOCAL_PATH)
        return cls(
            checkpoint_dir=checkpoint_dir,
            failure_file=Path(env.get("STABILIZER_FAILURE_FILE") or "/opt/ml/output/failure"),
            tensor_dir=Path(env.get("STABILIZER_TENSOR_DIR") or checkpoint_dir / "tensors"),
            resume_dir=Path(env.get("SM_CHANNEL_RESUME") or "/opt/ml/input/data/resume"),  # read when it exists
        )
