"""The job's own decisions (job.recovery `in_job`): rollbacks the sentinel made inside a running job.

The in-job library (stabilizer_sentinel.recovery.recovery) answers an explosion or a divergence itself: back to
the newest healthy copy of its state, on at a lower rate probed from there. Each such decision is an
entry of findings.json's `rollbacks`; this module records them on the attempt (each once, in order),
says them in one line each, and tells the policy the recipe in force: the declared rate knob times
the factor the job went on at, so a relaunch after it starts from what the job last ran, not from
what it was launched with.

Pure: no AWS call, no clock.
"""

from __future__ import annotations

import re
from typing import Any

from stabilizer_contract.job import FINGERPRINT_PATTERN, PAST_OUTCOMES
from stabilizer_workflow.evidence.observation import Observation
from stabilizer_workflow.evidence.sentinel_files import SentinelRollback, finite
from stabilizer_workflow.execution.state import (
    MAX_BAD_BATCHES,
    MAX_PROBED,
    MAX_ROLLBACKS,
    MAX_SKIPPED,
    Attempt,
    Rollback,
    WorkflowState,
)
from stabilizer_workflow.remedies.ladders import ARCHITECTURE_ROLES, EXPLOSIONS, remedies

PHASES = ("warmup", "main", None)
_FINGERPRINT = re.compile(FINGERPRINT_PATTERN)


def recovery_for(state: WorkflowState) -> str:
    """How the next attempt answers an explosion: "in_job" (stabilizer_sentinel.recovery.recovery) or "relaunch".

    In the job only where the policy's own answer would be one the job can apply to itself: the
    `original` policy, `job.recovery` relaunch, or an explosion ladder whose first remedy the job
    declares is a network change still to make (batch norm off, say) relaunch.
    """
    if state.policy == "original" or state.job.recovery == "relaunch":
        return "relaunch"
    knobs = state.job.knobs.declared()
    for rule in EXPLOSIONS:
        for phase in PHASES:
            first = next((rung for rung in remedies(rule, phase) or () if rung.role in knobs), None)
            if first is not None and first.role in ARCHITECTURE_ROLES:
                knob = knobs[first.role]
                value = state.run_spec.get(knob.hyperparameter)
                if first.op != "switch_on" or value is False or (not isinstance(value, bool) and value == 0):
                    return "relaunch"
    return "in_job"


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def describe(rollback: SentinelRollback) -> str:
    """One line: what fired, where the job went back to, what it probed and what it went on at."""
    failed = sum(1 for probe in rollback.probed if probe.failed)
    probes = f"{len(rollback.probed)} rates probed" + (f", {failed} of them failed" if failed else "")
    head = (f"{rollback.rule} at step {rollback.step}: back to step {rollback.restored_step} "
            f"({rollback.steps_lost} steps lost)")
    seconds = f" in {rollback.seconds:.1f} s" if rollback.seconds is not None else ""
    before, after = finite(rollback.learning_rate_before), finite(rollback.learning_rate_after)
    if rollback.outcome == "stopped":
        return f"{head}; no lower rate trained ({probes}{seconds}): the job stopped on the finding"
    if rollback.outcome == "ended":
        where = (f"; that step's batch (batch {rollback.batch.index} of pass {rollback.batch.epoch}) had failed "
                 f"again{', and a relaunch skips it' if rollback.batch.fingerprints else ''}"
                 if rollback.batch else "")
        return f"{head}; the run ended while probing ({probes}): the finding stands{where}"
    if rollback.outcome == "transient":
        return f"{head}; the same rate trained past it: the batch's or a one-off, on unchanged at rate {_rate(after)}"
    if rollback.outcome == "bad_batch":
        where = f" (batch {rollback.batch.index} of pass {rollback.batch.epoch})" if rollback.batch else ""
        later = ("a relaunch skips it too" if rollback.batch and rollback.batch.fingerprints
                 else "no fingerprint: not passed over again")
        # A corrupt record: its non-finite values, which the next batches lacked, are passed over in any batch.
        what = ("a corrupt record (non-finite), skipped in any batch;" if rollback.batch and rollback.batch.nonfinite
                else f"a bad batch, skipped ({later}),")
        return (f"{head}; that step's batch{where} failed again and the next steps trained: {what} on unchanged at "
                f"rate {_rate(after)}")
    if not rollback.probed:  # the loss rose after a rollback went on (model/.../recovery.py, RISE_WINDOWS)
        return (f"{head}, on at rate {_rate(after)} from {_rate(before)}: the rate the last rollback kept, a notch "
                f"lower, with no probe{seconds}")
    return f"{head}, on at rate {_rate(after)} from {_rate(before)}, chosen from {probes}{seconds}"


def new_rollbacks(state: WorkflowState, obs: Observation) -> list[Rollback]:
    """The rollbacks findings.json lists that the current attempt has not recorded yet; recorded now (at most
    ``MAX_ROLLBACKS``, what one job writes), what later jobs and the policy read of them kept in ``state.in_job``,
    and the oldest records of earlier attempts let go where the execution would hold more than ``MAX_ROLLBACKS``."""
    attempt = state.current
    if obs.findings is None or attempt is None:
        return []
    written = obs.findings.rollbacks
    known = len(attempt.rollbacks) + attempt.rollbacks_let_go
    new = [_recorded(entry) for entry in written[known:MAX_ROLLBACKS]]
    attempt.rollbacks.extend(new)
    _ledger(state, new)
    _let_go(state)
    return new


def _ledger(state: WorkflowState, rollbacks: list[Rollback], *, older: bool = False) -> None:
    """What ``state.in_job`` keeps of ``rollbacks``: their fingerprints as the newest (``older``: as older than
    any it holds, those it lacks), the newest ``MAX_SKIPPED`` kept; a corrupt record; an explosion of the rate."""
    ledger = state.in_job
    found = list(dict.fromkeys(f for rollback in rollbacks for f in rollback.bad_batches))
    held = ledger.skip_batches
    skip = ([f for f in found if f not in held] + held) if older else ([f for f in held if f not in found] + found)
    ledger.skip_batches = skip[-MAX_SKIPPED:]
    for rollback in rollbacks:
        ledger.corrupt_records = ledger.corrupt_records or rollback.corrupt_records
        ledger.exploded = ledger.exploded or (rollback.rule in EXPLOSIONS and not rollback.transient)


def _let_go(state: WorkflowState) -> None:
    """The oldest rollback records of earlier attempts go, counted on each, until the execution holds
    ``MAX_ROLLBACKS``: the current attempt's are all kept (one job writes no more). What the ledger
    needs of them is folded in first (a state kept before ``InJob`` has them in its records alone): their
    fingerprints as older than any it holds."""
    excess = sum(len(attempt.rollbacks) for attempt in state.attempts) - MAX_ROLLBACKS
    for attempt in state.attempts[:-1]:
        if excess <= 0:
            return
        gone = min(excess, len(attempt.rollbacks))
        _ledger(state, attempt.rollbacks[:gone], older=True)
        attempt.rollbacks = attempt.rollbacks[gone:]
        attempt.rollbacks_let_go += gone
        excess -= gone


def _recorded(entry: SentinelRollback) -> Rollback:
    return Rollback(
        rule=entry.rule,
        step=entry.step,
        restored_step=entry.restored_step,
        steps_lost=max(entry.steps_lost, 0),
        probe_steps=max(entry.probe_steps, 0),
        rate_before=finite(entry.learning_rate_before),
        rate_after=finite(entry.learning_rate_after),
        factor=entry.factor if entry.outcome in ("recovered", *PAST_OUTCOMES) else None,
        transient=entry.outcome in PAST_OUTCOMES,
        bad_batch=entry.outcome == "bad_batch",
        bad_batches=_fingerprints(entry),
        corrupt_records=entry.outcome in ("bad_batch", "ended") and entry.batch is not None and entry.batch.nonfinite,
        probed=[finite(probe.learning_rate) for probe in entry.probed][:MAX_PROBED],
        failed_probes=sum(1 for probe in entry.probed if probe.failed),
        seconds=entry.seconds,
        reason=describe(entry),
    )


def _fingerprints(entry: SentinelRollback) -> list[str]:
    if entry.outcome not in ("bad_batch", "ended") or entry.batch is None:  # ended: during the replay after it
        return []
    return [f for f in entry.batch.fingerprints if isinstance(f, str) and _FINGERPRINT.fullmatch(f)][:MAX_BAD_BATCHES]


def batches_to_skip(state: WorkflowState) -> list[str]:
    """The bad batches the execution's jobs found (each once, the newest ``MAX_SKIPPED``): the next job
    passes over them (the configuration's ``skip_batches``)."""
    # The records' (a state kept before InJob has them there alone), then the ledger's, which holds the newest
    # in order: each fingerprint where it comes last.
    found = [*(f for attempt in state.attempts for rollback in attempt.rollbacks for f in rollback.bad_batches),
             *state.in_job.skip_batches]
    return list(reversed(dict.fromkeys(reversed(found))))[-MAX_SKIPPED:]


def corrupt_records_found(state: WorkflowState) -> bool:
    """Whether a job of the execution found a bad batch that held corrupt records (non-finite values the
    batches after it lacked): the next job passes over every batch with non-finite values (the
    configuration's ``skip_nonfinite_batches``), wherever its shuffle puts them."""
    return state.in_job.corrupt_records or any(rollback.corrupt_records for attempt in state.attempts
                                               for rollback in attempt.rollbacks)


def factor_in_force(attempt: Attempt) -> float:
    """The multiplier the job last ran its rates at: the latest recovered rollback's, else 1."""
    recovered = [rollback.factor for rollback in attempt.rollbacks if rollback.factor is not None]
    return recovered[-1] if recovered else 1.0


def recipe_in_force(state: WorkflowState, attempt: Attempt) -> dict[str, Any]:
    """The attempt's recipe as the job last ran it: the declared rate knobs times the factor in force.

    A job that declares no rate knob cannot carry the factor into a relaunch; its recipe is as launched.
    """
    spec = dict(attempt.run_spec)
    factor = factor_in_force(attempt)
    if factor == 1.0:
        return spec
    knobs = state.job.knobs.declared()
    for role in ("learning_rate", "warmup_learning_rate"):
        knob = knobs.get(role)
        if knob is not None and isinstance(spec.get(knob.hyperparameter), int | float):
            spec[knob.hyperparameter] = float(spec[knob.hyperparameter]) * factor
    return spec


def summary_line(attempt: Attempt) -> str | None:
    """What the attempt's in-job recovery did, for the end's reason; None without any rollback."""
    if not attempt.rollbacks:  # the current attempt's: never let go
        return None
    recovered = [r for r in attempt.rollbacks if r.factor is not None and not r.transient]
    passed = sum(1 for r in attempt.rollbacks if r.transient and not r.bad_batch)
    bad = sum(1 for r in attempt.rollbacks if r.bad_batch)
    lost = sum(r.steps_lost + r.probe_steps for r in attempt.rollbacks)
    said = f"recovered in the job {len(recovered)} time{'s' if len(recovered) != 1 else ''}"
    if recovered:
        said += f", last on at rate {_rate(recovered[-1].rate_after)} ({recovered[-1].factor:.3g} x the script's)"
    if passed:
        said += f"; {passed} sudden explosion{'s' if passed != 1 else ''} the same rate trained past"
    if bad:
        said += f"; {bad} bad batch{'es' if bad != 1 else ''} skipped"
    return f"{said}; {lost} steps rolled back or probed"
