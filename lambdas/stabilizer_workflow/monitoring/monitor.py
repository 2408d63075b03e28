"""The monitor's decisions: what to do after looking at a training job once.

What an attempt's evidence says (its verdict when no rule fired, a failed job's diagnosis, the
job's own loss lines) is read by `stabilizer_workflow.evidence.verdicts`; which remedy follows a finding is
`stabilizer_workflow.remedies.policy`'s to say. This module joins them into one decision per look.

Pure: `check()` takes the state, an `Observation` and the time, and returns the next state plus
the effects the handler must carry out (stop a job, stop lingering rule-evaluation jobs, publish
one notification), built by `stabilizer_workflow.monitoring.check_results`. A straggler the job's watchdog
reported (stragglers.json: a rank slower than the others, with its host) and each rollback the job
decided itself (findings.json's rollbacks; stabilizer_workflow.remedies.in_job) are recorded on the attempt
and told once, in that check's message. No AWS call and no clock in here, so every
job-status x rule-status case is a plain unit test.

Counters: every `check` moves `num_monitor_transitions` by one; a relaunch moves
`num_retraining` by one and the remedy's own counter by one; nothing else moves them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from stabilizer_contract.catalogue import NOT_LEARNING
from stabilizer_workflow import notifications
from stabilizer_workflow.errors import StateCorrupted
from stabilizer_workflow.evidence import verdicts
from stabilizer_workflow.evidence.observation import Observation, evidence_of
from stabilizer_workflow.execution.rule_checks import debugger_actions
from stabilizer_workflow.execution.state import Attempt, Decision, Finding, WorkflowState
from stabilizer_workflow.monitoring.check_results import (
    CheckResult,
    Effects,
    end,
    keep_watching,
    lingering_rule_jobs,
    relaunch,
)
from stabilizer_workflow.remedies import hangs, in_job, policy
from stabilizer_workflow.remedies.ladders import EXPLOSIONS

# FailureReason prefixes SageMaker uses for failures of its own, not of the training code.
INFRASTRUCTURE_FAILURES = ("InternalServerError", "CapacityError")
# A relaunch needs at least this much of the training budget left to be worth starting.
MIN_BUDGET_SECONDS = 60


def _record(attempt: Attempt, obs: Observation, now: datetime) -> None:
    attempt.status = obs.status
    attempt.secondary_status = obs.secondary_status
    attempt.failure_reason = obs.failure_reason
    if obs.terminal:
        attempt.ended_at = obs.end_time or now
    if obs.training_seconds is not None:
        attempt.seconds = obs.training_seconds
    elif obs.start_time is not None:
        attempt.seconds = max(0, int(((obs.end_time or now) - obs.start_time).total_seconds()))
    if obs.billable_seconds is not None:
        attempt.billable_seconds = obs.billable_seconds
    if obs.interruptions:
        attempt.interruptions = obs.interruptions
    steps = obs.steps_consumed()
    if steps is not None:
        attempt.steps = steps
    if obs.summary is not None:
        attempt.watched = verdicts.watched(obs)


def _monitoring_limit(state: WorkflowState) -> str | None:
    limits, history = state.limits, state.history
    if history.num_monitor_transitions >= limits.max_monitor_transitions:
        return f"reached max_monitor_transitions ({limits.max_monitor_transitions} checks)"
    if state.training_seconds() >= limits.max_total_training_seconds:
        return (
            f"training budget used up ({state.training_seconds()} s of "
            f"max_total_training_seconds {limits.max_total_training_seconds} s)"
        )
    return None


def _relaunch_blocked(state: WorkflowState) -> str | None:
    limits = state.limits
    if state.history.num_retraining >= limits.max_num_retraining:
        return f"reached max_num_retraining ({limits.max_num_retraining} relaunches)"
    if limits.max_total_training_seconds - state.training_seconds() < MIN_BUDGET_SECONDS:
        return (
            f"training budget used up ({state.training_seconds()} s of "
            f"max_total_training_seconds {limits.max_total_training_seconds} s)"
        )
    return _monitoring_limit(state)


def verdict(outcome: str, finding: Finding) -> str:
    """The outcome of an execution that ends on an attempt where `finding` fired.

    An attempt with a finding is never `succeeded`: a policy that ends early keeping the best
    checkpoint of a run that learned says `stopped_early`; when the remedies or the limits run out,
    a run whose loss never fell ends `did_not_learn` and one whose loss blew up ends `diverged`.
    Every other ending keeps the policy's word.
    """
    if outcome == "succeeded":
        return "stopped_early"
    if outcome == "gave_up" and finding.rule == NOT_LEARNING:
        return "did_not_learn"
    if outcome == "gave_up" and finding.rule in EXPLOSIONS:
        return "diverged"
    return outcome


def _remediate(state: WorkflowState, attempt: Attempt, obs: Observation, finding: Finding) -> CheckResult:
    # Read against the losses first: a VanishingGradient beside a climbing loss is a divergence.
    history = evidence_of(obs, finding).get("loss_history")
    finding = verdicts.rediagnose(finding, attempt.watched, history)
    attempt.finding = finding
    planned = hangs.plan(state, finding, obs.checkpoint_files) or policy.plan(state, finding, obs.checkpoint_files)
    decision = planned.decision
    if decision.action == "end":
        return end(
            state,
            attempt,
            obs,
            verdict(decision.outcome or "gave_up", finding),
            decision.reason,
            finding=finding,
            remedy=decision.remedy,
            best=decision.resume_from,
        )
    blocked = _relaunch_blocked(state)
    if blocked:
        reason = (
            f"{policy.describe_finding(finding)}: {blocked}; the next step would have been {decision.remedy}"
        )
        return end(state, attempt, obs, verdict("gave_up", finding), reason, finding=finding)
    state.run_spec = planned.run_spec
    if decision.instance_count is not None:  # a relaunch on fewer hosts (stabilizer_workflow.remedies.hangs)
        state.job = state.job.model_copy(update={"instance_count": decision.instance_count})
    return relaunch(state, attempt, obs=obs, decision=decision, finding=finding, counters=planned.counters)


def _infrastructure_failure(state: WorkflowState, attempt: Attempt, obs: Observation,
                            spot: bool = False) -> CheckResult:
    """SageMaker failed the job itself, or (`spot`) spot capacity did not let it finish within its
    MaxWaitTimeInSeconds: the same recipe was never really tried, so try it again."""
    reason_text = obs.failure_reason or "no FailureReason"
    what = (f"spot capacity did not let the job finish within MaxWaitTimeInSeconds "
            f"({state.job.max_wait_seconds} s; interrupted {attempt.interruptions or 0} times)" if spot
            else f"SageMaker failed the job ({reason_text})")
    limits = state.limits
    if state.history.num_infrastructure_retries >= limits.max_infrastructure_retries:
        return end(
            state,
            attempt,
            obs,
            "gave_up" if spot else "failed",
            f"{what} and max_infrastructure_retries ({limits.max_infrastructure_retries}) is reached",
        )
    blocked = _relaunch_blocked(state)
    if blocked:
        return end(state, attempt, obs, "gave_up", f"{what}; {blocked}")
    # No rule fired, so the newest checkpoint is healthy; it counts only if the relaunch loads it.
    newest = max(obs.checkpoint_files) if obs.checkpoint_files else None
    resume = (
        f"{attempt.checkpoint_s3_uri}/{obs.checkpoint_files[newest]}" if newest is not None else attempt.resumed_from
    )
    fresh = verdicts.why_fresh(state.job.integration, attempt) if resume else "no checkpoint was written"
    if fresh or resume is None:
        resume, start = None, f"starts fresh ({fresh})"
    else:
        start = f"resumes from {resume.rsplit('/', 1)[-1]}"
    decision = Decision(
        action="relaunch",
        remedy="retry",
        resume_from=resume,
        reason=(f"{what}, not the training code; same recipe again, {start}" if spot else
                f"SageMaker failed the job ({reason_text.split(':')[0]}), not the training code; "
                f"same recipe again, {start}"),
    )
    return relaunch(
        state, attempt, obs=obs, decision=decision, finding=None, counters=("num_infrastructure_retries",)
    )


def _while_running(
    s: WorkflowState, attempt: Attempt, obs: Observation, issue: Finding | None
) -> CheckResult:
    """InProgress, Stopping, or Completed while Debugger rules are still evaluating.

    A finding stops the job, unless the sentinel was told to notify only (`sentinel_action`
    notify): then each new finding is announced once and the job runs on.
    """
    note = None
    if obs.status == "InProgress" and issue is not None:
        new = attempt.finding is None or (attempt.finding.rule, attempt.finding.step) != (issue.rule, issue.step)
        attempt.finding = issue
        # A rule whose Debugger actions are Email/SMS only notifies (docs/rules.md).
        notify_only = obs.notify_only or s.monitoring.sentinel_action == "notify" or issue.action == "notify"
        if new:
            note = notifications.issue_found(s, attempt, issue, evidence_of(obs, issue), stopping=not notify_only)
        if not notify_only:
            # Decide the next recipe only once the job has stopped: its last checkpoint is then in
            # S3, and no two jobs of one execution run at once. Stopping again is harmless.
            return keep_watching(s, Effects(stop_job=attempt.job_name, notification=note))
    limit = _monitoring_limit(s)
    if limit is None:
        return keep_watching(s, Effects(notification=note))
    if obs.status == "InProgress":
        return end(s, attempt, obs, "gave_up", f"stopped attempt {attempt.number}: {limit}", stop_job=True)
    if obs.status == "Stopping":
        return end(s, attempt, obs, "gave_up", f"attempt {attempt.number} is stopping: {limit}")
    pending = ", ".join(obs.rules_pending())
    return end(s, attempt, obs, "gave_up", f"job completed but {pending} never finished: {limit}")


def _after_end(s: WorkflowState, attempt: Attempt, obs: Observation) -> CheckResult:
    """Completed, Failed or Stopped with no finding: the evidence decides (stabilizer_workflow.evidence.verdicts)."""
    if obs.status == "Failed" and (obs.failure_reason or "").startswith(INFRASTRUCTURE_FAILURES):
        return _infrastructure_failure(s, attempt, obs)
    # The job's own loss lines are a second channel: a non-finite loss there is an explosion
    # even when no hook saw it.
    exploded = verdicts.explosion_in_logs(obs, s.job.loss_metric)
    if exploded is not None and obs.status in ("Completed", "Failed"):
        return _remediate(s, attempt, obs, exploded)
    if obs.status == "Completed":
        return _completed(s, attempt, obs)
    if obs.status == "Failed":
        return _failed(s, attempt, obs)
    return _stopped(s, attempt, obs)


def _completed(s: WorkflowState, attempt: Attempt, obs: Observation) -> CheckResult:
    """Success is earned: the summary must show every step watched, a finite loss, learning."""
    judged = verdicts.judge_completed(obs, attempt)
    if judged.finding is not None:
        return _remediate(s, attempt, obs, judged.finding)
    reason = judged.reason
    told = [f for f in obs.issues() if verdicts.told_only(f, attempt.watched)]
    if told:
        by_why: dict[str, list[str]] = {}
        for f in told:
            by_why.setdefault(verdicts.told_why(f), []).append(f"{f.rule} at step {f.step}")
        reason += "; told: " + "; ".join(f"{', '.join(named)} ({why})" for why, named in by_why.items())
    recovered = in_job.summary_line(attempt)
    if recovered:
        reason += f"; {recovered}"
    unknown = obs.rules_without_verdict()
    if unknown:
        # Not a failure of the training run; say plainly which verdicts are missing.
        reason += f" (Debugger gave no verdict for {', '.join(unknown)})"
    return end(s, attempt, obs, judged.outcome or "unverified", reason)


def _failed(s: WorkflowState, attempt: Attempt, obs: Observation) -> CheckResult:
    """A job that died is diagnosed before it is called a plain failure: a loss that blew up before
    the crash (7 -> 628, then an overflow) is a divergence, remedied like one."""
    diverged = verdicts.crash_diagnosis(obs)
    if diverged is not None:
        return _remediate(s, attempt, obs, diverged)
    summary = obs.summary
    said = f"; the script ended with {summary.exception}" if summary is not None and summary.exception else ""
    # One line: the toolkit's reason for a failed script spans several (ExitCode, ErrorMessage, Command).
    given = " ".join((obs.failure_reason or "no FailureReason given").split())
    return end(s, attempt, obs, "failed", f"training job failed: {given}{said}")


def _stopped(s: WorkflowState, attempt: Attempt, obs: Observation) -> CheckResult:
    # Stopped without any finding: nobody in this workflow asked for it.
    if obs.secondary_status == "MaxWaitTimeExceeded":  # a spot job: capacity, not the recipe
        return _infrastructure_failure(s, attempt, obs, spot=True)
    if obs.secondary_status == "MaxRuntimeExceeded":
        limit = s.job.max_runtime_seconds
        return end(
            s, attempt, obs, "gave_up", f"attempt {attempt.number} ran past MaxRuntimeInSeconds ({limit} s)"
        )
    return end(
        s, attempt, obs, "failed", f"training job {attempt.job_name} was stopped outside the workflow"
    )


def check(state: WorkflowState, obs: Observation, now: datetime) -> CheckResult:
    """One look at the current training job; returns the next state and what to do."""
    s = state.model_copy(deep=True)
    attempt = s.current
    if attempt is None:
        raise StateCorrupted("attempts: empty; check needs a launched attempt")
    if obs.job_name != attempt.job_name:
        raise StateCorrupted(
            f"history.latest_job_name: observed {obs.job_name!r}, expected {attempt.job_name!r}"
        )

    s.history.num_monitor_transitions += 1
    _record(attempt, obs, now)
    stragglers = hangs.new_stragglers(attempt, obs)
    rollbacks = in_job.new_rollbacks(s, obs)  # the job's own decisions since the last look
    result = _decide(s, attempt, obs, now)
    if not stragglers and not rollbacks:
        return result
    # One message per check: the job's decisions and the stragglers ride on the decision's, or have their own.
    note = result.effects.notification
    told = result.state.attempts[-1] if result.state.attempts[-1].number == attempt.number else attempt
    if rollbacks:
        note = (notifications.with_rollbacks(note, rollbacks) if note is not None
                else notifications.rolled_back(result.state, told, rollbacks))
    if stragglers:
        note = (notifications.with_stragglers(note, stragglers) if note is not None
                else notifications.stragglers_found(result.state, told, stragglers))
    return CheckResult(result.state, replace(result.effects, notification=note))


def _decide(s: WorkflowState, attempt: Attempt, obs: Observation, now: datetime) -> CheckResult:
    s.job_status = obs.status
    s.rule_status = obs.rule_status_summary()
    # A finding seen on an earlier check is remembered: once the job is stopped, Debugger may
    # report its rules as Stopped rather than IssuesFound.
    issue = obs.primary_issue() or attempt.finding or hangs.no_progress(s, obs, now)
    if issue is not None and issue.source == "debugger" and issue.action is None:
        # Debugger reports a verdict only; the rule's actions are carried out here (docs/rules.md).
        action, endpoints = debugger_actions(s.monitoring.rules, issue.rule)
        issue = issue.model_copy(update={"action": action, "notify": endpoints[:5]})

    # Debugger rules go on evaluating after the job ends; a completed job is not a success until
    # every rule has given its verdict.
    waiting_for_rules = obs.status == "Completed" and issue is None and bool(obs.rules_pending())
    if not obs.terminal or waiting_for_rules:
        return _while_running(s, attempt, obs, issue)
    if issue is not None and verdicts.told_only(issue, attempt.watched):
        # A notice in a run that learned (told while it ran) is no finding of the attempt's: the next one
        # is the one to act on; without one the evidence decides, and the ending names the notice.
        issue = obs.primary_issue(passed_over=lambda f: verdicts.told_only(f, attempt.watched))
        attempt.finding = issue
    if issue is not None:
        return _remediate(s, attempt, obs, issue)
    return _after_end(s, attempt, obs)


def abort(state: WorkflowState, error: dict | None, obs: Observation | None, now: datetime) -> CheckResult:
    """The state machine caught an error: stop what runs, record why, say so."""
    s = state.model_copy(deep=True)
    error = error or {}
    name = str(error.get("Error") or "Error")
    cause = " ".join(str(error.get("Cause") or "").split())[:300]
    reason = f"{name}: {cause}" if cause else name
    s.outcome = "failed"
    s.reason = reason
    s.next_action = "end"
    attempt = s.current
    stop_job = None
    lingering: tuple[str, ...] = ()
    if attempt is not None:
        if obs is not None:
            _record(attempt, obs, now)
            s.job_status = obs.status
            lingering = lingering_rule_jobs(obs)
        if obs is None or obs.status == "InProgress":
            stop_job = attempt.job_name
        attempt.decision = Decision(action="end", outcome="failed", reason=reason)
    return CheckResult(
        s,
        Effects(
            stop_job=stop_job,
            stop_processing_jobs=lingering,
            notification=notifications.finished(s, attempt),
        ),
    )
