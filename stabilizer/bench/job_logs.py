"""What one training job computed, read from its log (the reference script's) or its findings.json
summary (any script the library protects): the step it started at, the step it ended at, and the
steps of a clean run of its recipe. The remediation benchmark counts steps with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_START = re.compile(r"^training steps=(\d+) .*start_step=(\d+)")
_ENDS = (
    re.compile(r"^finished steps=(\d+)"),  # completed: N steps done
    re.compile(r"^stopped by SIGTERM at step (\d+)"),  # stopped: N steps done
)
_RULE_STOP = re.compile(r"^sentinel stopped the job (?:at|after the evaluation at) step (\d+)")
_LOGGED = re.compile(r"^step=(\d+) ")


@dataclass(frozen=True)
class JobSteps:
    """What one training job computed, read from its log."""

    total: int  # the steps of a clean run of its recipe
    start: int  # the step it started at (> 0 when it resumed)
    end: int  # steps done when it ended (the stopping step counts: its gradients were computed)

    @property
    def computed(self) -> int:
        return max(0, self.end - self.start)


def job_steps(log: str, clean_steps: int | None = None, summary: dict[str, Any] | None = None) -> JobSteps | None:
    """None when the job never started training (a bad channel, a bad hyperparameter).

    The reference script logs its total; for a user's script, `clean_steps` gives it, and its
    findings.json `summary` the first and last step the sentinel checked.
    """
    if clean_steps is not None and summary and summary.get("first_step") is not None:
        return JobSteps(total=clean_steps, start=int(summary["first_step"]), end=int(summary["last_step"]) + 1)
    total = start = None
    end = None
    last_logged = None
    for line in log.splitlines():
        if (match := _START.match(line)) is not None:
            total, start = int(match.group(1)), int(match.group(2))
        elif (match := _RULE_STOP.match(line)) is not None:
            end = int(match.group(1)) + 1
        elif (match := _LOGGED.match(line)) is not None:
            last_logged = int(match.group(1)) + 1
        else:
            for pattern in _ENDS:
                if (match := pattern.match(line)) is not None:
                    end = int(match.group(1))
    if total is None or start is None:
        return None
    if end is None:  # crashed or killed: the last logged step is all that is known
        end = last_logged if last_logged is not None else start
    return JobSteps(total=total, start=start, end=end)
