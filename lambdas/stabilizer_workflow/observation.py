"""What the monitor saw: DescribeTrainingJob, the sentinel's findings file and the checkpoints.

Turns the raw AWS shapes into one typed `Observation` so that the decisions in
`stabilizer_workflow.monitor` never touch a boto3 response. Parsing only: no AWS calls, no decisions.

Findings file format: docs/contracts.md, section 2.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stabilizer_contract.checkpoints import checkpoint_step
from stabilizer_contract.job import RULE_STOP_PREFIX
from stabilizer_workflow.execution_input import KNOWN_RULES
from stabilizer_workflow.state import Finding, Phase, TrainingJobStatus, Watched

RuleEvaluationStatus = Literal["InProgress", "NoIssuesFound", "IssuesFound", "Error", "Stopping", "Stopped"]

_STEP_IN_TEXT = re.compile(r"\bstep[ =](\d+)")


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
    first_step: int | None = None
    last_step: int | None = None
    first_loss: Number = None
    last_loss: Number = None
    best_loss: Number = None
    learned: bool | None = None
    started_from: str | None = None
    restores: bool | None = None
    evaluations: list[tuple[int, Number]] = Field(default_factory=list)
    log_loss: LogLoss | None = None

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


class FindingsDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: int = 1
    job_action: Literal["stop", "notify"] = "stop"
    findings: list[SentinelFinding] = Field(default_factory=list)
    # Version 2: written at every end of a watched job; absent when nothing watched it.
    summary: Summary | None = None


class StragglerReport(BaseModel):
    """One entry of stragglers.json, which the job's rank 0 writes beside findings.json
    (stabilizer_sentinel.watchdog): a rank slower than the others, with its host."""

    model_config = ConfigDict(extra="ignore")

    rank: int
    host: str | None = None
    step: int | None = None
    factor: float | None = None
    message: str = ""


# DescribeTrainingJob's rule verdicts: Debugger's rules, then its profiler rules (ProfilerRuleConfigurations).
RULE_STATUS_MEMBERS = ("DebugRuleEvaluationStatuses", "ProfilerRuleEvaluationStatuses")


class RuleStatus(BaseModel):
    """One entry of DescribeTrainingJob's DebugRuleEvaluationStatuses or ProfilerRuleEvaluationStatuses."""

    model_config = ConfigDict(extra="ignore")

    name: str
    status: RuleEvaluationStatus
    processing_job_name: str | None = None
    details: str | None = None


class Observation(BaseModel):
    """Everything one `check` needs to decide, gathered by the handler before deciding."""

    model_config = ConfigDict(extra="forbid")

    job_name: str
    status: TrainingJobStatus
    secondary_status: str | None = None
    failure_reason: str | None = None
    rule_statuses: list[RuleStatus] = Field(default_factory=list)
    findings: FindingsDocument | None = None
    # Set when findings.json exists but cannot be read; the text says why.
    findings_unreadable: str | None = None
    # Step -> file name of each checkpoint as listed in S3. The names are the job's own (it pads
    # the step); a resume URI is built from them, never from a name rebuilt here.
    checkpoint_files: dict[int, str] = Field(default_factory=dict)
    start_time: datetime | None = None
    end_time: datetime | None = None
    training_seconds: int | None = None
    billable_seconds: int | None = None
    # Spot: how often the job's instances were taken away (SecondaryStatusTransitions' Interrupted),
    # and when it last entered Training (SageMaker restarts it there after an interruption).
    interruptions: int = 0
    training_since: datetime | None = None
    final_metrics: dict[str, float] = Field(default_factory=dict)
    # When the job's progress.json last changed in S3 (stabilizer_workflow.hangs.no_progress), if it has one.
    progress_at: datetime | None = None
    # The end of the newest period of the job's metric stream (CloudWatch) that holds a loss line, if
    # any, and the stream's resolution (stabilizer_workflow.aws_cloudwatch).
    metric_at: datetime | None = None
    metric_period_seconds: int = 60
    # What the job's stragglers.json reported so far (empty: no file, or no straggler).
    stragglers: list[StragglerReport] = Field(default_factory=list)
    # The job's warm pool (ResourceConfig.KeepAlivePeriodInSeconds, WarmPoolStatus.Status): 0 and None
    # when it keeps none.
    keep_alive_seconds: int = 0
    warm_pool_status: str | None = None

    @property
    def summary(self) -> Summary | None:
        return self.findings.summary if self.findings is not None else None

    @property
    def notify_only(self) -> bool:
        """The sentinel was told to notify, not stop: its findings are news, not a stop."""
        return self.findings is not None and self.findings.job_action == "notify"

    @property
    def warm_pool_kept(self) -> bool:
        """The job keeps its instances for a matching job, or will once it ends (SageMaker's warm
        pools: Available, or InUse while the job runs); not once the pool was Reused or Terminated."""
        return self.keep_alive_seconds > 0 and self.warm_pool_status not in ("Reused", "Terminated")

    @property
    def checkpoint_steps(self) -> list[int]:
        return sorted(self.checkpoint_files)

    @property
    def rule_stop(self) -> bool:
        return self.status == "Failed" and RULE_STOP_PREFIX in (self.failure_reason or "")

    @property
    def terminal(self) -> bool:
        return self.status in ("Completed", "Failed", "Stopped")

    def issues(self) -> list[Finding]:
        """Every finding, sentinel first (it has the step and phase), then Debugger's verdicts."""
        found: list[Finding] = []
        if self.findings is not None:
            found.extend(item.to_finding() for item in self.findings.findings)
        if self.findings_unreadable:
            found.append(Finding(rule="Unknown", message=self.findings_unreadable, source="sentinel"))
        seen = {finding.rule for finding in found}
        for rule in self.rule_statuses:
            if rule.status == "IssuesFound" and rule.name not in seen:
                found.append(
                    Finding(rule=rule.name, message=rule.details or "IssuesFound", source="debugger")
                )
        if not found and self.rule_stop:
            found.append(finding_from_failure_reason(self.failure_reason or ""))
        return found

    def primary_issue(self) -> Finding | None:
        """The earliest finding: what went wrong first is what a remedy should address."""
        issues = self.issues()
        if not issues:
            return None
        return min(issues, key=lambda f: (f.step is None, f.step if f.step is not None else 0))

    def rules_pending(self) -> list[str]:
        return [rule.name for rule in self.rule_statuses if rule.status == "InProgress"]

    def rules_without_verdict(self) -> list[str]:
        """Rules that ended without saying whether the run was healthy."""
        return [
            f"{rule.name} ({rule.status})"
            for rule in self.rule_statuses
            if rule.status in ("Error", "Stopping", "Stopped")
        ]

    def steps_consumed(self) -> int | None:
        if self.summary is not None and self.summary.steps_taken is not None:
            return self.summary.steps_taken
        if "train:step" in self.final_metrics:
            return int(self.final_metrics["train:step"]) + 1
        issue = self.primary_issue()
        if issue is not None and issue.step is not None:
            return issue.step + 1
        return max(self.checkpoint_steps) if self.checkpoint_steps else None

    def rule_status_summary(self) -> str | None:
        if not self.rule_statuses and self.findings is None:
            return None
        parts = [f"{rule.name}:{rule.status}" for rule in self.rule_statuses]
        if self.findings is not None and self.findings.findings:
            parts.extend(f"{f.rule}:IssuesFound(sentinel)" for f in self.findings.findings)
        return ", ".join(parts) or None


def finding_from_failure_reason(reason: str) -> Finding:
    """A rule stop whose findings file is missing: recover what the FailureReason says."""
    rule = next((name for name in KNOWN_RULES if name in reason), "Unknown")
    step = _STEP_IN_TEXT.search(reason)
    return Finding(
        rule=rule,
        step=int(step.group(1)) if step else None,
        message=reason.strip()[:300],
        source="failure_reason",
    )


def _jsonable_number(value: Any) -> Any:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


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


def checkpoint_files(keys: list[str]) -> dict[int, str]:
    """Step -> file name of the checkpoints among listed S3 keys."""
    files = {}
    for key in keys:
        step = checkpoint_step(key)
        if step is not None:
            files[step] = key.rsplit("/", 1)[-1]
    return files


def observe(
    description: dict[str, Any],
    *,
    findings: FindingsDocument | None = None,
    findings_unreadable: str | None = None,
    checkpoint_keys: list[str] | None = None,
    progress_at: datetime | None = None,
    metric_at: datetime | None = None,
    metric_period_seconds: int = 60,
    stragglers: list[StragglerReport] | None = None,
) -> Observation:
    """Normalise a DescribeTrainingJob response plus what was read from S3."""
    rules = [
        RuleStatus(
            name=item.get("RuleConfigurationName", "Unknown"),
            status=item.get("RuleEvaluationStatus", "InProgress"),
            processing_job_name=(item.get("RuleEvaluationJobArn") or "").split("/")[-1] or None,
            details=item.get("StatusDetails"),
        )
        # Debugger reports its profiler rules apart, in the same entry shape.
        for member in RULE_STATUS_MEMBERS
        for item in description.get(member) or []
    ]
    # A metric's value may be NaN or infinite: the job's log said so, and that is evidence.
    metrics = {
        item["MetricName"]: float(item["Value"])
        for item in description.get("FinalMetricDataList") or []
        if "MetricName" in item and "Value" in item
    }
    seconds = description.get("TrainingTimeInSeconds")
    billable = description.get("BillableTimeInSeconds")
    transitions = description.get("SecondaryStatusTransitions") or []
    trained = [t.get("StartTime") for t in transitions if t.get("Status") == "Training" and t.get("StartTime")]
    return Observation(
        job_name=description["TrainingJobName"],
        status=description["TrainingJobStatus"],
        secondary_status=description.get("SecondaryStatus"),
        failure_reason=description.get("FailureReason"),
        rule_statuses=rules,
        findings=findings,
        findings_unreadable=findings_unreadable,
        checkpoint_files=checkpoint_files(checkpoint_keys or []),
        start_time=description.get("TrainingStartTime"),
        end_time=description.get("TrainingEndTime"),
        training_seconds=int(seconds) if seconds is not None else None,
        billable_seconds=int(billable) if billable is not None else None,
        interruptions=sum(1 for t in transitions if t.get("Status") == "Interrupted"),
        training_since=trained[-1] if trained and description.get("SecondaryStatus") == "Training" else None,
        final_metrics=metrics,
        progress_at=progress_at,
        metric_at=metric_at,
        metric_period_seconds=metric_period_seconds,
        stragglers=stragglers or [],
        keep_alive_seconds=int((description.get("ResourceConfig") or {}).get("KeepAlivePeriodInSeconds") or 0),
        warm_pool_status=(description.get("WarmPoolStatus") or {}).get("Status"),
    )


def evidence_of(observation: Observation, finding: Finding) -> dict[str, Any]:
    """The bulky evidence for the notification (never stored in the state)."""
    if observation.findings is None:
        return {}
    for item in observation.findings.findings:
        if item.rule == finding.rule and item.step == finding.step:
            return {key: _jsonable_number(value) for key, value in item.evidence.items()}
    return {}
