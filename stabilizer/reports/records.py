"""What one execution did, as plain records: attempts, their metrics, notifications, states.

The local engine and the AWS client fill these; the progress display, the report and notebooks
read them. They hold observations only; deciding what to do next is the state machine's job.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

# One line per logged step (docs/contracts.md section 1), e.g.
#   step=12 epoch=1 loss=2.3012 lr=0.1 grad_norm=4.52
#   eval epoch=3 test_loss=0.61 test_accuracy=0.8111
# and, once training starts, how many steps it will take (model/train.py):
#   training steps=36 steps_per_epoch=12 examples=1437 start_step=0
_PAIR = re.compile(r"(\w+)=(\S+)")
# A notification's text is followed by this line and a JSON object (docs/contracts.md).
DETAILS_MARKER = "Details (JSON):"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@dataclass
class MetricPoint:
    step: int
    loss: float | None
    grad_norm: float | None = None
    lr: float | None = None
    epoch: int | None = None


@dataclass
class EvalPoint:
    epoch: int | None
    test_loss: float | None
    test_accuracy: float | None


@dataclass
class TrainingPlan:
    """What a job announced before its first step: the steps it will run in all, and where it starts."""

    total_steps: int
    start_step: int = 0


def parse_log_line(line: str) -> MetricPoint | EvalPoint | TrainingPlan | None:
    """A training log line as a metric point (or the job's plan), or None when it is not one."""
    stripped = line.strip()
    if stripped.startswith("training steps="):
        pairs = dict(_PAIR.findall(stripped))
        total, start = _number(pairs["steps"]), _number(pairs.get("start_step", "0"))
        if total is None or total < 0:
            return None
        return TrainingPlan(total_steps=int(total), start_step=int(start or 0))
    if stripped.startswith("step="):
        pairs = dict(_PAIR.findall(stripped))
        step = _number(pairs["step"])
        if step is None:
            return None
        epoch = _number(pairs.get("epoch", ""))
        return MetricPoint(
            step=int(step),
            loss=_number(pairs.get("loss", "")),
            grad_norm=_number(pairs.get("grad_norm", "")),
            lr=_number(pairs.get("lr", "")),
            epoch=None if epoch is None else int(epoch),
        )
    if stripped.startswith("eval "):
        pairs = dict(_PAIR.findall(stripped))
        epoch = _number(pairs.get("epoch", ""))
        return EvalPoint(
            epoch=None if epoch is None else int(epoch),
            test_loss=_number(pairs.get("test_loss", "")),
            test_accuracy=_number(pairs.get("test_accuracy", "")),
        )
    return None


@dataclass
class Notification:
    subject: str
    message: str
    received: float  # seconds since the execution started
    attributes: dict[str, str] = field(default_factory=dict)  # SNS message attributes

    @property
    def event_type(self) -> str | None:
        return self.attributes.get("event_type")

    @property
    def body(self) -> Any:
        """The structured part: the whole message when it is JSON, else the JSON object after
        ``Details (JSON):`` (docs/contracts.md, Notifications), else None."""
        try:
            return json.loads(self.message)
        except ValueError:
            pass
        _, marker, details = self.message.partition(DETAILS_MARKER)
        if marker:
            try:
                return json.loads(details)
            except ValueError:
                return None
        return None


@dataclass
class AttemptRecord:
    number: int
    job_name: str
    status: str = "InProgress"
    secondary_status: str = "Starting"
    failure_reason: str | None = None
    hyperparameters: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    metrics: list[MetricPoint] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    findings: dict[str, Any] | None = None
    checkpoint_dir: str | None = None  # a local path, or an s3:// prefix
    checkpoint_uri: str | None = None
    tensor_store: str | None = None
    rule_statuses: list[dict[str, Any]] = field(default_factory=list)
    plan: TrainingPlan | None = None  # from the job's log, once training started

    @property
    def total_steps(self) -> int | None:
        """The steps this attempt will run: the job's own announcement, else a positive
        ``max_steps`` hyperparameter (a cap the training script honours), else unknown."""
        if self.plan is not None:
            return self.plan.total_steps
        cap = _number(str(self.hyperparameters.get("max_steps", "")).strip('"'))
        return int(cap) if cap and cap > 0 else None

    @property
    def steps_done(self) -> int:
        """Steps run as far as the log and the findings say (step N is the N+1-th step). The job
        logs every few steps, so a finding is often the latest word on where it got to."""
        done = self.plan.start_step if self.plan else 0
        if self.metrics:
            done = max(done, self.metrics[-1].step + 1)
        for finding in (self.findings or {}).get("findings", []):
            if isinstance(finding.get("step"), int):
                done = max(done, finding["step"] + 1)
        last_checked = ((self.findings or {}).get("summary") or {}).get("last_step")
        if isinstance(last_checked, int):  # a script whose log says no step: the sentinel counted them
            done = max(done, last_checked + 1)
        return done

    @property
    def last(self) -> MetricPoint | None:
        return self.metrics[-1] if self.metrics else None

    def explosion(self) -> tuple[int, str] | None:
        """Where the attempt blew up: the finding's step, else the first non-finite loss or norm."""
        if self.findings:
            for finding in self.findings.get("findings", []):
                if "step" in finding:
                    return int(finding["step"]), str(finding.get("rule", "finding"))
        for point in self.metrics:
            for value in (point.loss, point.grad_norm):
                if value is not None and not math.isfinite(value):
                    return point.step, "non-finite"
        return None

    def series(self, attribute: str) -> list[tuple[int, float]]:
        """(step, value) of ``loss`` or ``grad_norm``: the logged lines, completed by the finding's
        evidence (the sentinel keeps every step's values, while the job logs every few steps)."""
        points: dict[int, float] = {}
        for finding in (self.findings or {}).get("findings", []):
            for step, value in (finding.get("evidence") or {}).get(f"{attribute}_history", []):
                number = _number(str(value))
                if number is not None:
                    points[int(step)] = number
        for point in self.metrics:
            value = getattr(point, attribute)
            if value is not None:
                points[point.step] = value
        return sorted(points.items())

    def newest_checkpoint(self) -> str | None:
        from pathlib import Path

        if not self.checkpoint_dir or self.checkpoint_dir.startswith("s3://"):
            return None
        found = sorted(
            Path(self.checkpoint_dir).glob("checkpoint-*.pt"),
            key=lambda p: int(p.stem.split("-")[-1]) if p.stem.split("-")[-1].isdigit() else -1,
        )
        return str(found[-1]) if found else None


@dataclass
class RunRecord:
    execution_arn: str
    name: str
    input: dict[str, Any]
    status: str = "RUNNING"
    error: str | None = None
    cause: str | None = None
    state: dict[str, Any] | None = None  # the last state payload seen
    states: list[str] = field(default_factory=list)  # state names in the order they were entered
    notifications: list[Notification] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    wall_seconds: float = 0.0
    interrupted: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for attempt, record in zip(data["attempts"], self.attempts, strict=True):
            explosion = record.explosion()
            attempt["explosion"] = None if explosion is None else {"step": explosion[0], "kind": explosion[1]}
        for note, record in zip(data["notifications"], self.notifications, strict=True):
            note["body"] = record.body
        return _finite(data)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as the strings the findings contract uses."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
