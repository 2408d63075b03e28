"""What the monitor saw: DescribeTrainingJob, the sentinel's findings file and the checkpoints.

Turns the raw AWS shapes into one typed `Observation` so that the decisions in
`stabilizer_workflow.monitoring.monitor` never touch a boto3 response. Parsing only: no AWS calls, no decisions.

The files the job's sentinel writes (findings.json, stragglers.json) are read by
`stabilizer_workflow.evidence.sentinel_files`; their format: docs/contracts.md, section 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stabilizer_contract.checkpoints import checkpoint_step
from stabilizer_contract.job import RULE_STOP_PREFIX
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument, StragglerReport, Summary
from stabilizer_workflow.execution.execution_input import KNOWN_RULES
from stabilizer_workflow.execution.state import Finding, TrainingJobStatus

RuleEvaluationStatus = Literal["InProgress", "NoIssuesFound", "IssuesFound", "Error", "Stopping", "Stopped"]

_STEP_IN_TEXT = re.compile(r"\bstep[ =](\d+)")

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
    # When the job's progress.json last changed in S3 (stabilizer_workflow.remedies.hangs.no_progress), if it has one.
    progress_at: datetime | None = None
    # The end of the newest period of the job's metric stream (CloudWatch) that holds a loss line, if
    # any, and the stream's resolution (stabilizer_workflow.aws.cloudwatch).
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

    def primary_issue(self, passed_over: Callable[[Finding], bool] | None = None) -> Finding | None:
        """The earliest finding: what went wrong first is what a remedy should address; those
        ``passed_over`` says are not failures (a notice) left out."""
        issues = [f for f in self.issues() if passed_over is None or not passed_over(f)]
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
