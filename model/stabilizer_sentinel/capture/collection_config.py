"""Capture settings: the collections a job saves and when (``save_interval``, ``save_steps``,
``start_step``/``end_step``, ``include_regex``, ``modes``), parsed from the ``capture`` configuration.

Pure Python and NumPy-free: what a collection holds is ``stabilizer_sentinel.capture.collection_members``',
how tensors are copied ``stabilizer_sentinel.capture.capture``'s; this module only says which collection is
due at a step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stabilizer_sentinel.capture import store

BUILTIN_COLLECTIONS = (
    "weights",
    "biases",
    "gradients",
    "losses",
    "activations",
    "activation_outputs",
    "activation_inputs",
    "inputs",
    "labels",
    "predictions",
)
# Debugger's hook saves every 500 steps by default; our runs are short, so collections a rule
# needs but the capture hyperparameter does not list are held in memory every 100 steps.
DEFAULT_SAVE_INTERVAL = 100
_PARAMETER_COLLECTIONS = ("weights", "biases", "gradients")
_CONFIG_KEYS = {"save_interval", "save_steps", "start_step", "end_step", "include_regex", "modes"}


class CaptureConfigError(ValueError):
    """The capture configuration is wrong; the message names the field and what was expected."""


@dataclass(frozen=True)
class CollectionConfig:
    name: str
    save_interval: int | None = DEFAULT_SAVE_INTERVAL
    save_steps: frozenset[int] = frozenset()
    include_regex: tuple[str, ...] = ()
    modes: tuple[str, ...] = store.MODES
    # Debugger's range: saved from start_step on, before end_step (save_steps are saved regardless).
    start_step: int = 0
    end_step: int | None = None

    def due(self, step: int, mode: str) -> bool:
        if mode not in self.modes:
            return False
        # Evaluations are rare (once per epoch or less), so every one is recorded.
        if mode == "EVAL":
            return True
        if step in self.save_steps:
            return True
        in_range = step >= self.start_step and (self.end_step is None or step < self.end_step)
        return in_range and self.save_interval is not None and step % self.save_interval == 0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"modes": list(self.modes)}
        if self.save_steps:
            out["save_steps"] = sorted(self.save_steps)
        if self.save_interval is not None:
            out["save_interval"] = self.save_interval
        if self.include_regex:
            out["include_regex"] = list(self.include_regex)
        if self.start_step:
            out["start_step"] = self.start_step
        if self.end_step is not None:
            out["end_step"] = self.end_step
        return out


def default_modes(name: str) -> tuple[str, ...]:
    """Parameters and their gradients exist only while training; everything else also in EVAL."""
    return ("TRAIN",) if name in _PARAMETER_COLLECTIONS else store.MODES


def _positive_int(value: Any, where: str, low: int = 1) -> int:
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    try:
        number = int(str(value))
    except ValueError:
        raise CaptureConfigError(f"{where}: expected {what}, got {value!r}") from None
    if number < low:
        raise CaptureConfigError(f"{where}: expected {what}, got {value!r}")
    return number


def _regex_list(value: Any, where: str) -> tuple[str, ...]:
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value)
    for item in items:
        try:
            re.compile(item)
        except re.error as exc:
            raise CaptureConfigError(f"{where}: {item!r} is not a valid regular expression ({exc})") from None
    return tuple(item for item in items if item)


def parse_collection(name: str, raw: Mapping[str, Any]) -> CollectionConfig:
    where = f"capture.{name}"
    if not isinstance(raw, Mapping):
        raise CaptureConfigError(f'{where}: expected an object such as {{"save_interval": 10}}, got {raw!r}')
    unknown = set(raw) - _CONFIG_KEYS
    if unknown:
        raise CaptureConfigError(f"{where}: unknown keys {sorted(unknown)}; valid keys: {sorted(_CONFIG_KEYS)}")
    save_steps: frozenset[int] = frozenset()
    interval: int | None = DEFAULT_SAVE_INTERVAL
    if "save_steps" in raw:
        steps = raw["save_steps"]
        if isinstance(steps, str):
            steps = [part for part in steps.split(",") if part.strip()]
        try:
            save_steps = frozenset(int(str(step)) for step in steps)
        except (TypeError, ValueError):
            raise CaptureConfigError(f"{where}.save_steps: expected a list of step numbers, got {steps!r}") from None
        if any(step < 0 for step in save_steps):
            raise CaptureConfigError(f"{where}.save_steps: steps must be >= 0, got {sorted(save_steps)}")
        interval = None
    if "save_interval" in raw:
        interval = _positive_int(raw["save_interval"], f"{where}.save_interval")
    start = _positive_int(raw.get("start_step", 0), f"{where}.start_step", low=0)
    end = _positive_int(raw["end_step"], f"{where}.end_step") if raw.get("end_step") is not None else None
    include = _regex_list(raw.get("include_regex", ()), f"{where}.include_regex")
    if name not in BUILTIN_COLLECTIONS and not include:
        raise CaptureConfigError(
            f"{where}: a custom collection needs include_regex; built-in collections are {list(BUILTIN_COLLECTIONS)}"
        )
    modes_raw = raw.get("modes", list(default_modes(name)))
    modes_list = [modes_raw] if isinstance(modes_raw, str) else list(modes_raw)
    modes = tuple(str(mode).upper() for mode in modes_list)
    bad = [mode for mode in modes if mode not in store.MODES]
    if bad or not modes:
        raise CaptureConfigError(f"{where}.modes: expected a list of {list(store.MODES)}, got {modes_raw!r}")
    return CollectionConfig(name, interval, save_steps, include, modes, start, end)


def parse_capture(raw: str | Mapping[str, Any] | None) -> dict[str, CollectionConfig]:
    """Parse the ``capture`` hyperparameter (a JSON object, or the object itself)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CaptureConfigError(f"capture: expected a JSON object, got {raw!r} ({exc})") from None
    if not isinstance(raw, Mapping):
        raise CaptureConfigError(f"capture: expected a JSON object of collection -> settings, got {raw!r}")
    return {str(name): parse_collection(str(name), settings) for name, settings in raw.items()}
