"""What one look at a training job returns: the next state and the effects the handler carries out.

`CheckResult` pairs the state with its `Effects` (stop a job, stop lingering rule-evaluation jobs,
publish one notification, release a warm pool). The three ways a check can leave an execution are
built here, so each fills in the same effects the same way: `end` it, `keep_watching` the job, or
`relaunch` with a new recipe. Which of the three applies is `stabilizer_workflow.monitoring.monitor`'s to
decide; nothing in here decides, calls AWS or reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from stabilizer_workflow import notifications
from stabilizer_workflow.evidence.observation import Observation, evidence_of
from stabilizer_workflow.execution.state import Attempt, Decision, Finding, WorkflowState
from stabilizer_workflow.notifications import Notification
from stabilizer_workflow.remedies import hangs


@dataclass(frozen=True)
class Effects:
    stop_job: str | None = None
    stop_processing_jobs: tuple[str, ...] = ()
    notification: Notification | None = None
    # The job whose warm pool no attempt will reuse (UpdateTrainingJob, KeepAlivePeriodInSeconds 0).
    release_warm_pool: str | None = None


def _pool_to_release(attempt: Attempt, obs: Observation, decision: Decision | None,
                     finding: Finding | None) -> str | None:
    """The ended attempt's job when its warm pool would wait, billed, for no attempt: the execution
    ends (`decision` None), the relaunch runs on another number of hosts (a pool is reused only by a
    job with the same InstanceCount), or the attempt hung (its hosts are not to be trusted again)."""
    if not obs.terminal or not obs.warm_pool_kept:
        return None
    if decision is None or decision.instance_count is not None or (finding is not None and hangs.is_hang(finding)):
        return attempt.job_name
    return None


@dataclass(frozen=True)
class CheckResult:
    state: WorkflowState
    effects: Effects


def lingering_rule_jobs(obs: Observation) -> tuple[str, ...]:
    """Rule-evaluation processing jobs still running; an ended attempt must not leave them on."""
    return tuple(
        rule.processing_job_name
        for rule in obs.rule_statuses
        if rule.status == "InProgress" and rule.processing_job_name
    )


def end(
    state: WorkflowState,
    attempt: Attempt,
    obs: Observation,
    outcome: str,
    reason: str,
    *,
    finding: Finding | None = None,
    stop_job: bool = False,
    remedy: str | None = None,
    best: str | None = None,
) -> CheckResult:
    """End the execution with `outcome` and `reason`: the attempt's decision records them, what still
    runs is stopped (the job itself only with `stop_job`) and the last message tells the end."""
    attempt.decision = Decision(action="end", outcome=outcome, reason=reason, remedy=remedy, resume_from=best)
    state.outcome = outcome  # type: ignore[assignment]
    state.reason = reason
    state.next_action = "end"
    evidence = evidence_of(obs, finding) if finding else {}
    return CheckResult(
        state,
        Effects(
            stop_job=attempt.job_name if stop_job else None,
            stop_processing_jobs=lingering_rule_jobs(obs),
            notification=notifications.finished(state, attempt, finding, evidence),
            release_warm_pool=_pool_to_release(attempt, obs, None, finding),
        ),
    )


def keep_watching(state: WorkflowState, effects: Effects | None = None) -> CheckResult:
    """Look at the job again at the next check; `effects` (a stop, a message) are carried out meanwhile."""
    state.next_action = "monitor"
    return CheckResult(state, effects or Effects())


def relaunch(
    state: WorkflowState,
    attempt: Attempt,
    *,
    obs: Observation,
    decision: Decision,
    finding: Finding | None,
    counters: tuple[str, ...],
) -> CheckResult:
    """Launch the next attempt as `decision` says: `num_retraining` and each of `counters` move by
    one, and the message tells why and with what recipe."""
    for counter in counters:
        setattr(state.history, counter, getattr(state.history, counter) + 1)
    state.history.num_retraining += 1
    state.resume_from = decision.resume_from
    state.next_action = "launch_new"
    attempt.decision = decision
    evidence = evidence_of(obs, finding) if finding else {}
    return CheckResult(
        state,
        Effects(
            stop_processing_jobs=lingering_rule_jobs(obs),
            notification=notifications.relaunching(state, attempt, decision, finding, evidence),
            release_warm_pool=_pool_to_release(attempt, obs, decision, finding),
        ),
    )
