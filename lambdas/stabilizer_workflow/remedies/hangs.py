"""What follows a hang: the same recipe again, from the last checkpoint, a bounded number of times.

A ``Hang`` finding (the in-job watchdog's: no optimizer step for longer than its bound, docs in
``stabilizer_sentinel.detection.watchdog``) says nothing about the recipe: a rank stuck in a collective, a
data loader that deadlocked, a host that died are faults of the moment, not of the learning rate.
So a hang is transient here: the job is relaunched with the recipe it had, resuming from the newest
checkpoint the attempt left (every checkpoint before a hang is healthy; none is rewound past), as
long as the relaunch will load it (``evidence.verdicts.why_fresh``), at most ``HANG_RELAUNCHES`` times in an
execution (``job.hang.relaunches``). The decision's reason and so the notification say "a hang, not
an instability"; an instability gets the policy's remedies instead. The relaunch runs on as many
hosts as the attempt had, or, when the user allows fewer (``job.min_instance_count``), without the
hosts the watchdog's finding names as holding the job up (``relaunch_hosts``).

The monitor also watches for itself (``no_progress``), for the hangs the job's own watchdog cannot
act on (a frozen process, a dead host), from two signs of life:
- the job's metric stream: SageMaker sends every match of the loss metric's regex in the job's
  log to CloudWatch (``stabilizer_workflow.aws.cloudwatch``); the monitor reads when the newest
  loss line was logged. Any script with a ``loss_metric`` has it, watched by the library or not;
- ``progress.json``: the job's rank 0 writes it beside findings.json whenever its step moved (at
  most every 30 s), and SageMaker uploads it with the checkpoints.
The newer of the two wins: a job in training (``SecondaryStatus`` ``Training``, not ``Uploading`` its
model once training is over) is a ``Hang`` only when every sign it has is older
than the monitor's bound (``job.hang.monitor_seconds``, default ``max(2 x floor, 300 s)``). Each
sign is also given the time its own channel needs before silence means anything: three periods of
the metric stream (60 s each on AWS), 300 s for progress.json. A job with neither sign yet (no
loss line logged, no file written) is not judged this way. The monitor stops it and the same
relaunch follows.

The monitor calls ``plan`` before the policy (stabilizer_workflow.monitoring.monitor, where ``policy.plan`` is
called); a finding that is not a hang is left to the policy (``None``).

The job's bounds (``job.hang``) travel to its watchdog as environment variables (``hang_settings``).
Pure: no AWS, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

from stabilizer_workflow.evidence.observation import Observation
from stabilizer_workflow.evidence.verdicts import why_fresh
from stabilizer_workflow.execution.hang_settings import DEFAULT_FLOOR_SECONDS, HANG_RELAUNCHES, PROGRESS_FILE
from stabilizer_workflow.execution.state import MAX_STRAGGLERS, Attempt, Decision, Finding, Straggler, WorkflowState
from stabilizer_workflow.remedies.policy import Plan, describe_finding

HANG = "Hang"
# DescribeTrainingJob's SecondaryStatus while the script runs (SageMaker API Reference).
TRAINING = "Training"
# The monitor's bound never goes under this: the file is written at most every 30 s, uploaded as
# SageMaker syncs checkpoints, and read at the next check.
MONITOR_MIN_SECONDS = 300.0
# The metric stream's newest period may still be filling, and CloudWatch shows a datapoint some time
# after it was sent: silence shorter than three of its periods says nothing.
METRIC_PERIODS = 3
# A rule stop whose findings.json never reached S3 (rank 0's host was the one that died) is known by
# its FailureReason alone, which names no catalogue rule: the watchdog's own words say it was a hang.
_HANG_STOP = "RuleStop: Hang at step"
_HOST_OF_RANK = re.compile(r"rank \d+ on (algo-\d+)")


def _relaunched_after_hangs(state: WorkflowState) -> int:
    current = state.current
    return sum(
        1 for attempt in state.attempts
        if attempt is not current and attempt.finding is not None and attempt.finding.rule == HANG
        and attempt.decision is not None and attempt.decision.action == "relaunch"
    )


def is_hang(finding: Finding) -> bool:
    """A Hang finding, or a rule stop known only by its failure reason whose words are the watchdog's."""
    return finding.rule == HANG or (finding.source == "failure_reason" and _HANG_STOP in finding.message)


def plan(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan | None:
    """The decision after an attempt that hung: the same recipe from its newest checkpoint, or the end
    once the relaunches are used up; None when ``finding`` is not a hang (the policy decides)."""
    if not is_hang(finding):
        return None
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    limit = state.job.hang.relaunches if state.job.hang is not None else HANG_RELAUNCHES
    done = _relaunched_after_hangs(state)
    what = f"{describe_finding(finding.model_copy(update={'rule': HANG}))}: a hang, not an instability"
    if limit == 0:
        reason = f"{what}; job.hang.relaunches is 0, so it is not relaunched"
        return Plan(Decision(action="end", outcome="gave_up", reason=reason), dict(state.run_spec))
    if done >= limit:
        reason = f"{what}; it hung again after {done} relaunch{'es' if done != 1 else ''} (at most {limit})"
        return Plan(Decision(action="end", outcome="gave_up", reason=reason), dict(state.run_spec))
    newest = max(checkpoints) if checkpoints else None
    resume = f"{attempt.checkpoint_s3_uri}/{checkpoints[newest]}" if newest is not None else attempt.resumed_from
    fresh = why_fresh(state.job.integration, attempt) if resume else "no checkpoint was written"
    if fresh:
        resume, start = None, f"starts fresh ({fresh})"
    else:
        start = f"resumes from {str(resume).rsplit('/', 1)[-1]}"
    hosts, said = relaunch_hosts(state, finding)
    reason = f"{what}; same recipe again, {start}{said}; hang relaunch {done + 1} of {limit}"
    decision = Decision(action="relaunch", remedy="retry", resume_from=resume, reason=reason,
                        instance_count=hosts if hosts != state.job.instance_count else None)
    return Plan(decision, dict(state.run_spec))


def holding_hosts(finding: Finding) -> list[str]:
    """The hosts a hang finding says held the job up (the watchdog's "held up by rank r on algo-k ...")."""
    _, _, named = finding.message.partition("held up by ")
    return sorted(set(_HOST_OF_RANK.findall(named)), key=lambda host: int(host.rsplit("-", 1)[1]))


def relaunch_hosts(state: WorkflowState, finding: Finding) -> tuple[int, str]:
    """How many hosts the relaunch after ``finding`` runs on, and the words that say so ("" for the same).

    Without the hosts the finding names as holding the job up, when ``job.min_instance_count`` allows
    that few; otherwise the same number. Every checkpoint is rank 0's copy of state that DDP keeps the
    same on every rank, so it resumes on any number of hosts."""
    job = state.job
    current, least = job.instance_count, job.min_instance_count or job.instance_count
    named = [host for host in holding_hosts(finding) if int(host.rsplit("-", 1)[1]) <= current]
    if not named or least >= current:
        return current, ""
    fewer = current - len(named)
    if fewer < least:
        return current, (f", on the same {current} hosts ({', '.join(named)} held it up; without them "
                         f"{fewer} would be fewer than job.min_instance_count {least})")
    return fewer, (f", on {fewer} host{'s' if fewer != 1 else ''} instead of {current} (without "
                   f"{', '.join(named)}, which held it up; job.min_instance_count {least})")


def monitor_bound(state: WorkflowState) -> float | None:
    """How long the monitor lets a training job go without a sign of life; None: it does not judge."""
    hang = state.job.hang
    if hang is not None and hang.monitor_seconds is not None:
        return hang.monitor_seconds or None
    floor = hang.floor_seconds if hang is not None else DEFAULT_FLOOR_SECONDS
    return max(2 * floor, MONITOR_MIN_SECONDS) if floor > 0 else None


def no_progress(state: WorkflowState, obs: Observation, now: datetime) -> Finding | None:
    """The monitor's own hang check: a job in training whose every sign of life went stale."""
    bound = monitor_bound(state)
    # Only while it trains (SecondaryStatus Training): starting, downloading, and uploading the model
    # once training is over, log no loss line and write no progress, and may outlast the bound.
    if obs.status != "InProgress" or obs.secondary_status != TRAINING or bound is None:
        return None
    signs = []  # (silence, what the channel is, the least silence it needs)

    def silence(sign_at: datetime) -> float:
        # A job back in Training (after a spot interruption, SageMaker restarts it) is silent since then at most.
        since = max(sign_at, obs.training_since) if obs.training_since is not None else sign_at
        return (now - since).total_seconds()

    if obs.metric_at is not None:
        signs.append((silence(obs.metric_at), f"no {state.job.loss_metric} line in its metric stream",
                      METRIC_PERIODS * obs.metric_period_seconds))
    if obs.progress_at is not None:
        signs.append((silence(obs.progress_at), f"{PROGRESS_FILE} unchanged in S3", MONITOR_MIN_SECONDS))
    if not signs or any(silent <= max(bound, least) for silent, _, least in signs):
        return None
    silent = min(silence for silence, _, _ in signs)
    said = " and ".join(f"{what} for {silence:.0f} s" for silence, what, _ in signs)
    return Finding(rule=HANG, source="log", message=(
        f"the job reported no new step for {silent:.0f} s ({said}; the monitor's bound is {bound:.0f} s): "
        "the job did not stop itself"))


def new_stragglers(attempt: Attempt, obs: Observation) -> list[Straggler]:
    """The ranks stragglers.json reports that this attempt has not recorded yet; recorded now, so that
    each is told once."""
    known = {straggler.rank for straggler in attempt.stragglers}
    room = MAX_STRAGGLERS - len(attempt.stragglers)
    new = [
        Straggler(rank=report.rank, host=report.host, step=report.step, factor=report.factor)
        for report in obs.stragglers if report.rank not in known
    ][:max(room, 0)]
    attempt.stragglers.extend(new)
    return new
