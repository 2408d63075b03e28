"""What the job's sentinel leaves beside its output, as the workflow reads it: findings.json (the
findings and the end-of-run summary) and stragglers.json (ranks slower than the others).

Typed readers of the files' contract (docs/contracts.md, section 2): unknown keys are ignored, a
non-finite number is kept as the text the job wrote ("nan", "inf"). Parsing only: no AWS call
fetches these files here (stabilizer_workflow.aws.s3 does) and nothing here decides.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stabilizer_workflow.execution.state import Finding, Phase, Watched


def _rate(value: float | str | None) -> float | None:
    """A learning rate from findings.json: a number, or the text of a non-finite one ("nan")."""
    return None if value is None else float(value)


class SentinelFinding(BaseModel):
    """One entry of findings.json; unknown extra keys are kept readable but ignored."""

    model_config = ConfigDict(extra="ignore")

    rule: str
    step: int | None = None
    epoch: int | None = None
    phase: Phase | None = None
    learning_rate: float | str | None = None
    tensor: str | None = None
    value: float | str | None = None
    message: str = ""
    onset_step: int | None = None
    stable_learning_rate: float | str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    action: Literal["stop", "notify"] | None = None
    notify: list[str] = Field(default_factory=list)
    told: str | None = None

    def to_finding(self) -> Finding:
        return Finding(
            rule=self.rule,
            step=self.step,
            epoch=self.epoch,
            phase=self.phase,
            learning_rate=_rate(self.learning_rate),
            tensor=self.tensor,
            value=None if self.value is None else str(self.value),
            message=self.message,
            source="sentinel",
            onset_step=self.onset_step,
            stable_learning_rate=_rate(self.stable_learning_rate),
            action=self.action,
            notify=self.notify[:5],
            told=self.told,
        )


Number = float | str | None  # findings.json writes a non-finite number as "nan", "inf" or "-inf"


def finite(value: Number) -> float | None:
    """A finite float from findings.json, or None for a missing, non-finite or unreadable one."""
    try:
        number = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and math.isfinite(number) else None


def nonfinite(value: Number) -> bool:
    """True for a value written and not finite ("nan", "inf", a float NaN)."""
    return value is not None and finite(value) is None


class LogLoss(BaseModel):
    """The summary's `log_loss`: the loss as the job's own log lines printed it (the second channel)."""

    model_config = ConfigDict(extra="ignore")

    last: Number = None
    nonfinite_step: int | None = None
    lines: int = 0

    @property
    def exploded(self) -> bool:
        return self.nonfinite_step is not None or nonfinite(self.last)


class SummaryObjective(BaseModel):
    """The summary's `objective`: the job's objective metric as its log printed it, and whether it decided."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    readings: int = 0
    improved: bool | None = None
    says: str = ""
    # this set `learned`: where the loss left it open, or against a loss that learned while this never improved
    decided: bool = False


class Summary(BaseModel):
    """findings.json's `summary` (docs/contracts.md, section 2): what the watching saw, start to end.

    Every key is optional for a reader; unknown keys are ignored.
    """

    model_config = ConfigDict(extra="ignore")

    integration: str | None = None
    ended: str | None = None
    exception: str | None = None
    steps_taken: int | None = None
    steps_observed: int | None = None
    steps_skipped: int | None = None
    steps_idle: int | None = None  # steps before any whose loss and gradients were exactly zero
    first_step: int | None = None
    last_step: int | None = None
    first_loss: Number = None
    last_loss: Number = None
    best_loss: Number = None
    learned: bool | None = None
    unjudged: str | None = None  # why the learning check judged no loss (a policy gradient's surrogate)
    learned_by: str | None = None  # how a run learned where only its cycles showed it (batches in a fixed order)
    watching_failed: str | None = None  # what failed in the watcher's own code, which then stood aside
    started_from: str | None = None
    restores: bool | None = None
    evaluations: list[tuple[int, Number]] = Field(default_factory=list)
    log_loss: LogLoss | None = None
    objective: SummaryObjective | None = None

    def best_evaluation(self) -> tuple[int, float] | None:
        """The step and value of the lowest finite validation value (a loss: lower is better)."""
        scored = [(value, step) for step, raw in self.evaluations if (value := finite(raw)) is not None]
        if not scored:
            return None
        value, step = min(scored)
        return step, value

    def watched(self) -> Watched:
        """The few numbers the state keeps of it."""
        last = self.last_loss
        return Watched(
            integration=self.integration,
            ended=self.ended,
            steps_taken=self.steps_taken,
            steps_observed=self.steps_observed,
            steps_skipped=self.steps_skipped,
            first_loss=finite(self.first_loss),
            last_loss=finite(last) if finite(last) is not None else (None if last is None else str(last)),
            best_loss=finite(self.best_loss),
            learned=self.learned,
            best_evaluation=self.best_evaluation(),
            started_from=self.started_from,
            restores=self.restores,
            exception=(self.exception or "")[:300] or None,
        )


class Probed(BaseModel):
    """One rate an in-job rollback tried from the restored state."""

    model_config = ConfigDict(extra="ignore")

    learning_rate: Number = None
    steps: int = 0
    failed: str | None = None


class SentinelBatch(BaseModel):
    """A rollback's bad batch (stabilizer_sentinel.recovery.batches.describe): where the first of the
    step's batches stood in the training data, how many the step took, each one's fingerprint, and whether
    it held a corrupt record's non-finite values (the job then passes over every later batch that does)."""

    model_config = ConfigDict(extra="ignore")

    epoch: int
    index: int
    batches: int = 1
    fingerprints: list[str] = Field(default_factory=list)
    nonfinite: bool = False  # it held non-finite values the batches after it lacked: a corrupt record


class SentinelRollback(BaseModel):
    """One entry of findings.json's `rollbacks`: an in-job recovery's decision
    (stabilizer_sentinel.recovery.recovery)."""

    model_config = ConfigDict(extra="ignore")

    rule: str
    step: int
    message: str = ""
    restored_step: int
    steps_lost: int = 0
    probe_steps: int = 0
    learning_rate_before: Number = None
    learning_rate_after: Number = None
    factor: float | None = None
    probed: list[Probed] = Field(default_factory=list)
    # recovered: on at the chosen rate; stopped: no lower rate trained; ended: the run ended while probing
    # (with ``batch`` where it ended during the replay on the next batches, the failing step's own having failed
    # again: a relaunch skips it);
    # transient: the same rate trained past a sudden explosion (a one-off, or a batch not told apart), on
    # unchanged; bad_batch: the failing step's batches failed again from the restored state and the next
    # steps trained: skipped (``batch``), on unchanged
    outcome: Literal["recovered", "stopped", "ended", "transient", "bad_batch"] = "recovered"
    batch: SentinelBatch | None = None
    seconds: float | None = None
    resumed_at_step: int | None = None


class FindingsDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int = 1
    job_action: Literal["stop", "notify"] = "stop"
    findings: list[SentinelFinding] = Field(default_factory=list)
    # In-job rollbacks, in order (written when the job recovers in place; absent otherwise).
    rollbacks: list[SentinelRollback] = Field(default_factory=list)
    # Version 2: written at every end of a watched job; absent when nothing watched it.
    summary: Summary | None = None


class StragglerReport(BaseModel):
    """One entry of stragglers.json, which the job's rank 0 writes beside findings.json
    (stabilizer_sentinel.detection.watchdog): a rank slower than the others, with its host."""

    model_config = ConfigDict(extra="ignore")

    rank: int
    host: str | None = None
    step: int | None = None
    factor: float | None = None
    message: str = ""


def parse_findings(body: bytes | str) -> FindingsDocument:
    """Parse findings.json; raises ValueError with a readable reason when it is not one."""
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"findings.json is not JSON: {error}") from None
    try:
        return FindingsDocument.model_validate(raw)
    except ValidationError as error:
        raise ValueError(f"findings.json does not match the contract: {error.errors()[0]['msg']}") from None


def parse_stragglers(body: bytes | str) -> list[StragglerReport]:
    """stragglers.json's entries; an unreadable file reports none (it only adds to a notification)."""
    try:
        raw = json.loads(body)
        return [StragglerReport.model_validate(item) for item in raw.get("stragglers", [])]
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError, AttributeError, TypeError):
        return []
