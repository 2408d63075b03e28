"""The SNS message for each decision: a subject a person reads at a glance, a body with the
evidence, and message attributes for subscription filters.

Pure formatting: no AWS calls. One decision makes exactly one `Notification`.

Event types (the `event_type` attribute): launched, issue_found, straggler (a rank slower than
the others: it slows the job, it does not stop it), rolled_back (the job answered a finding itself,
job.recovery in_job: back to an earlier state, on at a lower rate), relaunching, and one per outcome at the end:
completed (succeeded), stopped_early, unwatched, unverified, diverged, did_not_learn, gave_up, failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from stabilizer_workflow.execution.state import Attempt, Decision, Finding, Rollback, Straggler, WorkflowState
from stabilizer_workflow.remedies.recipe_text import format_value, knob_names, recipe_diff, recipe_text

EventType = Literal[
    "launched",
    "issue_found",
    "straggler",
    "rolled_back",
    "relaunching",
    "completed",
    "stopped_early",
    "unwatched",
    "unverified",
    "diverged",
    "did_not_learn",
    "gave_up",
    "failed",
]
# The last message's event and headline for each outcome.
FINAL_EVENTS: dict[str, str] = {
    "succeeded": "completed",
    "stopped_early": "stopped_early",
    "unwatched": "unwatched",
    "unverified": "unverified",
    "diverged": "diverged",
    "did_not_learn": "did_not_learn",
    "gave_up": "gave_up",
    "failed": "failed",
}
HEADLINES = {
    "completed": "Training completed after {jobs}",
    "stopped_early": "Stopped early after {jobs}, best checkpoint kept",
    "unwatched": "Unwatched: nothing checked the training in {jobs}",
    "unverified": "Unverified after {jobs}: too little was watched",
    "diverged": "Diverged after {jobs}",
    "did_not_learn": "Did not learn after {jobs}",
    "gave_up": "Gave up after {jobs}",
    "failed": "Failed after {jobs}",
}

# SNS: subjects are under 100 characters, ASCII, with no line breaks.
SUBJECT_MAX = 99
# SNS messages may be 256 KB; evidence histories are cut well before that: the last points of each, and the
# first entries of the finding's evidence, each line at most so many bytes (findings.json is the job's: any size).
EVIDENCE_POINTS = 20
EVIDENCE_ENTRIES = 16
EVIDENCE_LINE_BYTES = 2_048


@dataclass(frozen=True)
class Notification:
    event_type: EventType
    subject: str
    body: str
    attributes: dict[str, str] = field(default_factory=dict)

    def publish_kwargs(self, topic_arn: str) -> dict[str, Any]:
        attributes = {
            key: {"DataType": "Number" if key == "attempt" else "String", "StringValue": value}
            for key, value in self.attributes.items()
            if value
        }
        return {
            "TopicArn": topic_arn,
            "Subject": self.subject,
            "Message": self.body,
            "MessageAttributes": attributes,
        }


def clean_subject(text: str) -> str:
    """SNS: "Subjects must be UTF-8 text with no line breaks or control characters, and less than 100
    characters long" (botocore's model, Publish Subject): ASCII here, control characters as spaces."""
    ascii_text = text.encode("ascii", "replace").decode("ascii")
    printable = "".join(c if " " <= c < "\x7f" else " " for c in ascii_text)
    flat = " ".join(printable.split())
    if len(flat) <= SUBJECT_MAX:
        return flat
    return flat[: SUBJECT_MAX - 3].rstrip() + "..."


def _evidence_lines(evidence: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in list(evidence.items())[:EVIDENCE_ENTRIES]:
        line = f"  {key}: {format_value(value[-EVIDENCE_POINTS:] if isinstance(value, list) else value)}"
        if len(line.encode()) > EVIDENCE_LINE_BYTES:
            line = line.encode()[: EVIDENCE_LINE_BYTES - 3].decode(errors="ignore") + "..."
        lines.append(line)
    if len(evidence) > EVIDENCE_ENTRIES:
        lines.append(f"  ({len(evidence) - EVIDENCE_ENTRIES} more in the job's findings.json)")
    return lines


def _finding_lines(finding: Finding | None, evidence: dict[str, Any]) -> list[str]:
    if finding is None:
        return []
    lines = [
        "What fired:",
        f"  rule: {finding.rule} ({finding.source})",
        f"  step: {finding.step if finding.step is not None else 'unknown'}"
        + (f", epoch {finding.epoch}" if finding.epoch is not None else "")
        + (f", phase {finding.phase}" if finding.phase else ""),
    ]
    if finding.learning_rate is not None:
        lines.append(f"  learning rate: {finding.learning_rate:g}")
    if finding.tensor:
        lines.append(f"  tensor: {finding.tensor} = {finding.value}")
    if finding.message:
        lines.append(f"  message: {finding.message}")
    if evidence:
        lines += ["Evidence:", *_evidence_lines(evidence)]
    return lines


def _attributes(
    state: WorkflowState, event: EventType, attempt: Attempt | None, **extra: str
) -> dict[str, str]:
    attributes = {
        "event_type": event,
        "execution": state.execution.name,
        "attempt": str(attempt.number) if attempt else "",
        "policy": state.policy,
    }
    attributes.update({key: value for key, value in extra.items() if value})
    return attributes


def _details(state: WorkflowState, event: EventType, **extra: Any) -> str:
    payload = {
        "event_type": event,
        "execution": state.execution.model_dump(),
        "policy": state.policy,
        "attempts": len(state.attempts),
        "history": state.history.model_dump(),
        "outcome": state.outcome,
        **extra,
    }
    return "Details (JSON):\n" + json.dumps(payload, indent=2, default=str)


def _compose(state: WorkflowState, event: EventType, subject: str, lines: list[str], **extra: Any) -> str:
    header = [f"Execution: {state.execution.name}", f"Policy: {state.policy}"]
    return "\n".join([*header, "", *lines, "", _details(state, event, **extra)])


def launched(state: WorkflowState, attempt: Attempt) -> Notification:
    subject = clean_subject(f"Attempt {attempt.number} launched: {recipe_text(attempt.run_spec, knob_names(state))}")
    lines = [
        f"Training job {attempt.job_name} started.",
        f"Recipe: {recipe_text(attempt.run_spec, knob_names(state))}",
        f"Checkpoints: {attempt.checkpoint_s3_uri}",
    ]
    if attempt.resumed_from:
        lines.append(f"Resuming from: {attempt.resumed_from}")
    body = _compose(
        state,
        "launched",
        subject,
        lines,
        job_name=attempt.job_name,
        run_spec=attempt.run_spec,
    )
    return Notification("launched", subject, body, _attributes(state, "launched", attempt))


def issue_found(
    state: WorkflowState, attempt: Attempt, finding: Finding, evidence: dict[str, Any], *, stopping: bool = True
) -> Notification:
    """A rule fired in a running job: it is being stopped, or (sentinel_action notify) it runs on."""
    where = f" at step {finding.step}" if finding.step is not None else ""
    what = "stopping the job" if stopping else "notified, the job runs on"
    subject = clean_subject(f"{finding.rule}{where} in attempt {attempt.number}: {what}")
    why = ("the rule's Debugger actions are Email/SMS, not StopTraining" if finding.action == "notify"
           else "the sentinel was told to notify, not stop (sentinel_action)")
    said = (
        [
            f"Training job {attempt.job_name} is being stopped; the next recipe is decided once it has stopped",
            "and its last checkpoint is in S3.",
        ]
        if stopping
        else [f"Training job {attempt.job_name} runs on: {why}."]
    )
    # Debugger's Email and SMS actions: this message, on the stack's topic, is their notification;
    # the endpoints are named here and in the `notify` attribute, for subscription filter policies.
    endpoints = [f"Debugger actions of {finding.rule}: notify {', '.join(finding.notify)}."] if finding.notify else []
    lines = [*said, *endpoints, "", *_finding_lines(finding, evidence)]
    body = _compose(
        state,
        "issue_found",
        subject,
        lines,
        job_name=attempt.job_name,
        finding=finding.model_dump(mode="json"),
    )
    return Notification(
        "issue_found", subject, body,
        _attributes(state, "issue_found", attempt, rule=finding.rule, notify=",".join(finding.notify)),
    )


def _straggler_text(straggler: Straggler) -> str:
    slower = f"{straggler.factor:g}x slower than the other ranks" if straggler.factor else "slower than the other ranks"
    at = f" (reported at step {straggler.step})" if straggler.step is not None else ""
    return f"rank {straggler.rank} on {straggler.host or 'an unknown host'} is {slower}{at}"


def _straggler_lines(stragglers: list[Straggler]) -> list[str]:
    return ["Stragglers (they slow the job; they do not stop it):",
            *(f"  {_straggler_text(straggler)}" for straggler in stragglers)]


def stragglers_found(state: WorkflowState, attempt: Attempt, stragglers: list[Straggler]) -> Notification:
    """The job's watchdog found ranks persistently slower than the others; the job runs on."""
    first = stragglers[0]
    more = f" (+{len(stragglers) - 1} more)" if len(stragglers) > 1 else ""
    subject = clean_subject(
        f"Straggler in attempt {attempt.number}: rank {first.rank} on {first.host or 'unknown host'}{more}")
    lines = [f"Training job {attempt.job_name} runs on.", "", *_straggler_lines(stragglers)]
    body = _compose(state, "straggler", subject, lines, job_name=attempt.job_name,
                    stragglers=[straggler.model_dump() for straggler in stragglers])
    return Notification("straggler", subject, body, _attributes(
        state, "straggler", attempt, rank=",".join(str(s.rank) for s in stragglers),
        host=",".join(sorted({s.host for s in stragglers if s.host}))))


def with_stragglers(note: Notification, stragglers: list[Straggler]) -> Notification:
    """The same message, telling the stragglers too (one message per decision)."""
    details = note.body.rfind("\n\nDetails (JSON):")
    lines = "\n".join(["", *_straggler_lines(stragglers)])
    body = note.body[:details] + lines + note.body[details:] if details >= 0 else note.body + "\n" + lines
    hosts = ",".join(sorted({s.host for s in stragglers if s.host}))
    attributes = {**note.attributes, "straggler_host": hosts} if hosts else note.attributes
    return replace(note, body=body, attributes=attributes)


def _rollback_lines(rollbacks: list[Rollback]) -> list[str]:
    return ["Decided inside the job (in-job recovery):", *(f"  {rollback.reason}" for rollback in rollbacks)]


def rolled_back(state: WorkflowState, attempt: Attempt, rollbacks: list[Rollback]) -> Notification:
    """The job answered findings itself since the last look (job.recovery in_job)."""
    last = rollbacks[-1]
    more = f" (+{len(rollbacks) - 1} more)" if len(rollbacks) > 1 else ""
    if last.factor is not None:
        subject = (f"Recovered in the job, attempt {attempt.number}: {last.rule} at step {last.step}, "
                   f"on at a lower rate{more}")
        runs = f"Training job {attempt.job_name} trains on."
    else:
        subject = f"No lower rate trained in the job, attempt {attempt.number}: {last.rule} at step {last.step}{more}"
        runs = f"Training job {attempt.job_name} stops on the finding; the next check decides."
    lines = [runs, "", *_rollback_lines(rollbacks)]
    body = _compose(state, "rolled_back", clean_subject(subject), lines, job_name=attempt.job_name,
                    rollbacks=[rollback.model_dump() for rollback in rollbacks])
    return Notification("rolled_back", clean_subject(subject), body, _attributes(
        state, "rolled_back", attempt, rule=",".join(sorted({r.rule for r in rollbacks}))))


def with_rollbacks(note: Notification, rollbacks: list[Rollback]) -> Notification:
    """The same message, telling the job's own decisions too (one message per check)."""
    details = note.body.rfind("\n\nDetails (JSON):")
    lines = "\n".join(["", *_rollback_lines(rollbacks)])
    body = note.body[:details] + lines + note.body[details:] if details >= 0 else note.body + "\n" + lines
    return replace(note, body=body)


def relaunching(
    state: WorkflowState,
    attempt: Attempt,
    decision: Decision,
    finding: Finding | None,
    evidence: dict[str, Any],
) -> Notification:
    if finding is not None:
        cause = finding.rule + (f" at step {finding.step}" if finding.step is not None else "")
    else:
        cause = (attempt.failure_reason or attempt.status).split(":")[0]
    change = (
        ", ".join(f"{key} {format_value(old)}->{format_value(new)}" for key, (old, new) in decision.changes.items())
        or "same recipe"
    )
    hosts = decision.instance_count
    where = f" on {hosts} host{'s' if hosts != 1 else ''}" if hosts is not None else ""
    subject = clean_subject(f"{cause}: relaunching attempt {attempt.number + 1}{where} with {change}")
    lines = [
        f"Attempt {attempt.number} ({attempt.job_name}) ended: {attempt.status}"
        + (f" - {attempt.failure_reason}" if attempt.failure_reason else "")
        + (f"; {billing(state, attempt)}" if billing(state, attempt) else ""),
        "",
        *_finding_lines(finding, evidence),
        "",
        f"Why: {decision.reason}",
        "Next recipe:",
        recipe_diff(decision.changes),
        f"Starts from: {decision.resume_from or 'scratch (the reason says why)'}",
        *([f"Hosts: {hosts} (the reason says why)"] if hosts is not None else []),
    ]
    body = _compose(
        state,
        "relaunching",
        subject,
        lines,
        job_name=attempt.job_name,
        decision=decision.model_dump(mode="json"),
        finding=finding.model_dump(mode="json") if finding else None,
    )
    return Notification(
        "relaunching",
        subject,
        body,
        _attributes(state, "relaunching", attempt, rule=finding.rule if finding else ""),
    )


def billing(state: WorkflowState, attempt: Attempt) -> str | None:
    """What SageMaker billed for the attempt; with spot, the savings as SageMaker documents them
    (DescribeTrainingJob, BillableTimeInSeconds: (1 - billable / training time) x 100)."""
    if attempt.billable_seconds is None or not attempt.seconds:
        return None
    text = f"billed {attempt.billable_seconds} s of {attempt.seconds} s trained"
    if state.job.use_spot_instances:
        saved = (1 - attempt.billable_seconds / attempt.seconds) * 100
        interrupted = f", interrupted {attempt.interruptions} times" if attempt.interruptions else ""
        text += f" ({saved:.0f}% saved with spot{interrupted})"
    return text


def _attempts_table(state: WorkflowState) -> list[str]:
    lines = ["Attempts:"]
    for a in state.attempts:
        fired = f", {a.finding.rule} at step {a.finding.step}" if a.finding else ""
        billed = f", {billing(state, a)}" if billing(state, a) else ""
        lines.append(f"  {a.number}. {a.job_name}: {a.status}{fired}{billed} "
                     f"[{recipe_text(a.run_spec, knob_names(state))}]")
    return lines


def finished(
    state: WorkflowState,
    attempt: Attempt | None,
    finding: Finding | None = None,
    evidence: dict[str, Any] | None = None,
) -> Notification:
    """The last message of an execution: completed, gave up or failed, per `state.outcome`."""
    event: EventType = FINAL_EVENTS[state.outcome or "failed"]  # type: ignore[assignment]
    count = len(state.attempts)
    headline = HEADLINES[event].format(jobs=f"{count} job{'s' if count != 1 else ''}")
    reason = (state.reason or "").split(";")[0]
    subject = clean_subject(f"{headline}: {reason}" if reason else headline)
    lines = [f"Outcome: {state.outcome}", f"Reason: {state.reason}", ""]
    lines += _finding_lines(finding, evidence or {})
    if attempt is not None:
        lines.append(f"Final recipe: {recipe_text(attempt.run_spec, knob_names(state))}")
        if attempt.decision is not None and attempt.decision.resume_from and state.outcome == "stopped_early":
            lines.append(f"Best checkpoint kept: {attempt.decision.resume_from}")
        if attempt.watched is not None:
            lines.append("Summary: " + json.dumps(attempt.watched.model_dump(exclude_none=True), default=str))
    lines += ["", *_attempts_table(state)]
    body = _compose(
        state, event, subject, lines, job_name=attempt.job_name if attempt else None, reason=state.reason
    )
    return Notification(event, subject, body, _attributes(state, event, attempt, outcome=state.outcome or ""))
