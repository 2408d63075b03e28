"""The watchdog's bounds: when no step counts as a hang, and when a slower rank counts as a straggler.

Read once from the job's environment, which the workflow sets from ``job.hang``
(stabilizer_workflow.execution.hang_settings): ``STABILIZER_HANG_FLOOR_SECONDS`` (default 600; 0 turns the
watchdog off), ``STABILIZER_HANG_FACTOR`` (default 10), ``STABILIZER_HANG_STARTUP_SECONDS`` (default
three floors) and ``STABILIZER_STRAGGLER_FACTOR`` (default 2; 0 turns straggler reports off); why
these defaults: stabilizer_sentinel.detection.watchdog. A value that is not a number in range fails at once,
naming the variable. Settings only: the thread that applies them is the watchdog's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class HangSettingsError(ValueError):
    """A hang bound in the environment is not a number in range; the message names the variable."""


def _number(environ: Mapping[str, str], name: str, default: float, *, low: float = 0.0) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise HangSettingsError(f"{name}: expected a number of seconds or a factor, got {raw!r}") from None
    if not value >= low:
        raise HangSettingsError(f"{name}: expected a number >= {low:g}, got {raw!r}")
    return value


@dataclass(frozen=True)
class HangBounds:
    """When no step counts as a hang, and when a slower rank counts as a straggler."""

    floor: float = 600.0
    factor: float = 10.0
    startup: float = 1800.0
    straggler_factor: float = 2.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HangBounds:
        env = os.environ if environ is None else environ
        floor = _number(env, "STABILIZER_HANG_FLOOR_SECONDS", cls.floor)
        return cls(
            floor=floor,
            factor=_number(env, "STABILIZER_HANG_FACTOR", cls.factor, low=1.0),
            startup=_number(env, "STABILIZER_HANG_STARTUP_SECONDS", 3 * floor),
            straggler_factor=_number(env, "STABILIZER_STRAGGLER_FACTOR", cls.straggler_factor),
        )

    @property
    def enabled(self) -> bool:
        return self.floor > 0

    @property
    def tick(self) -> float:
        return min(1.0, max(self.floor / 10, 0.05))

    def limit(self, median_step: float | None) -> float:
        """Seconds without a step that make a hang: the startup bound until a median exists."""
        if median_step is None:
            return max(self.startup, self.floor)
        return max(self.floor, self.factor * median_step)
