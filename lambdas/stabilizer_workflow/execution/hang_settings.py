"""``job.hang``: when the job's watchdog calls a stall a hang, and how often a hang is relaunched.

The settings travel to the job as the environment variables its watchdog reads
(``stabilizer_sentinel.detection.hang_bounds``); what follows a hang is ``stabilizer_workflow.remedies.hangs``'s.
Kept apart from it so that the job model can hold them without importing the policy.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

HANG_RELAUNCHES = 2
DEFAULT_FLOOR_SECONDS = 600.0  # the watchdog's (stabilizer_sentinel.detection.hang_bounds)
PROGRESS_FILE = "progress.json"  # rank 0 writes it beside findings.json whenever its step moved
STRAGGLERS_FILE = "stragglers.json"  # rank 0 writes it beside findings.json when a rank lags (watchdog)


class HangSettings(BaseModel):
    """``job.hang``: when the watchdog calls a stall a hang, and how often a hang is relaunched."""

    model_config = ConfigDict(extra="forbid")

    floor_seconds: Annotated[float, Field(ge=0)] = Field(
        600.0, description="no step for this long is a hang whatever the step time; 0 turns the watchdog off"
    )
    factor: Annotated[float, Field(ge=1)] = Field(10.0, description="no step for factor x the median step time")
    startup_seconds: Annotated[float, Field(gt=0)] | None = Field(
        None, description="the bound before the second step; default three floors"
    )
    straggler_factor: Annotated[float, Field(ge=0)] = Field(
        2.0, description="a rank this many times slower than the others is reported; 0 turns it off"
    )
    monitor_seconds: Annotated[float, Field(ge=0)] | None = Field(
        None,
        description="the monitor's own bound: no new loss line in the job's metric stream (and no new "
        "progress.json) for this long while it trains is a hang; default max(2 x floor, 300 s); 0 turns it off",
    )
    relaunches: Annotated[int, Field(ge=0, le=10)] = Field(
        HANG_RELAUNCHES, description="how many times one execution relaunches after a hang"
    )


def environment(settings: HangSettings | None) -> dict[str, str]:
    """The watchdog's settings as the job's environment (empty: its defaults, the same as these)."""
    if settings is None:
        return {}
    values = {"STABILIZER_HANG_FLOOR_SECONDS": settings.floor_seconds, "STABILIZER_HANG_FACTOR": settings.factor,
              "STABILIZER_STRAGGLER_FACTOR": settings.straggler_factor}
    if settings.startup_seconds is not None:
        values["STABILIZER_HANG_STARTUP_SECONDS"] = settings.startup_seconds
    return {key: f"{value:g}" for key, value in values.items()}
