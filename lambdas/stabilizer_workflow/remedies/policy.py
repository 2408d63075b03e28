"""Remediation policies: given the state and what fired, decide the next recipe or the end.

Pure functions over typed values: no AWS, no clock, no logging side effects. The monitor calls
`plan()` once per finished attempt that had an issue; everything it returns is recorded in the
state and sent in the notification.

Remedies act only through the job's declared **knobs** (stabilizer_workflow.execution.job): a rung names a knob
role (`learning_rate`, `normalization`, ...), and the recipe changes the hyperparameter that
knob names, within the knob's bounds. Where the job declares no knob a ladder could turn, the
decision says so, names the knob to declare, and the execution ends for a person to decide.

Two named policies:

* `original` reproduces the AWS sample's ladder exactly (whatever rule fired): halve the warm-up
  LR while warmup/5 >= 1e-3, then add batch norm, then LR x0.9 while LR x0.9 > 1e-3, else end.
  It is kept so that the two can be measured side by side.
* `default` applies the remedy table (`stabilizer_workflow.remedies.ladders.TABLE`: finding x phase ->
  remedies), sized by the evidence of the attempts so far (`stabilizer_workflow.remedies.rates`),
  never repeats a recipe already tried, and resumes from a checkpoint taken before the run-up to
  the explosion when the network is unchanged and the relaunched job will load it.

What `default` reads, and why:

* the **phase** of the explosion: a lower warm-up LR only for an explosion during warm-up (after
  it, the warm-up LR no longer acts);
* **normalisation**: a network without it is fixed at its cause first (batch norm), fresh;
* the **last stable and the first failing learning rate** of this recipe family (`stabilizer_workflow.remedies.rates`);
* the **run-up**: the sentinel reports where it began (the first step at a new learning rate,
  where the gradient norm started to grow, or the last state whose loss was under twice where the
  lineage started). The relaunch resumes from the newest checkpoint from before it: a copy taken
  two steps into a rate the network cannot take already carries those steps in its weights and
  momentum, and fails again at any rate;
* whether **the last remedy moved the explosion**: a relaunch that exploded within
  `REWIND_EVERY` steps of the checkpoint it resumed from, or whose run-up began before it,
  starts fresh next time;
* whether the relaunch **will load** the checkpoint (the attempt's summary says its script
  restores, or the launcher watched it): a decision says "resumes from X" only then, else
  "starts fresh" and why (`stabilizer_workflow.evidence.verdicts.why_fresh`);
* the **loss's direction** (the summary): a VanishingGradient beside a climbing loss is answered
  as a divergence, and no rung raises a learning rate while the loss climbs;
* whether the run **learned** before a plateau rule fired: then it stops early (`stopped_early`, a
  success), keeping the checkpoint at its best validation value; a loss that never decreased gets
  at most `PLATEAU_RELAUNCHES` remedies, then ends `did_not_learn`.

A `Diverging` finding (the sentinel's loss at ten times where it started, finite or not, or a
non-finite loss the job's own log lines printed) is an explosion caught before the overflow: the
same ladder answers it, and its rate counts as failing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stabilizer_contract.checkpoints import checkpoint_step
from stabilizer_contract.job import REWIND_EVERY
from stabilizer_contract.parameters import NO_TENSOR_MATCHED
from stabilizer_workflow.evidence.verdicts import has_learned, loss_rise, rediagnose, why_fresh
from stabilizer_workflow.execution.job import Knob
from stabilizer_workflow.execution.state import Attempt, Decision, Finding, WorkflowState
from stabilizer_workflow.remedies.in_job import recipe_in_force
from stabilizer_workflow.remedies.ladders import ARCHITECTURE_ROLES, EXPLOSIONS, ROLE_COUNTERS, Rung, remedies
from stabilizer_workflow.remedies.rates import (
    RATE_ROLES,
    fmt,
    keep_warmup_below_main,
    main_down_with_the_warmup,
    size_rate,
    within,
)

Recipe = dict[str, Any]

# Rules that report a plateau, and how many relaunches may answer them in one execution (the
# remedies of a loss that never decreased are guesses: normalisation, then a smaller step).
PLATEAU_RULES = frozenset({"LossNotDecreasing", "NotLearning"})
PLATEAU_RELAUNCHES = 2


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a policy decided: the decision to record and, for a relaunch, the next recipe."""

    decision: Decision
    run_spec: Recipe
    counters: tuple[str, ...] = field(default_factory=tuple)



def describe_finding(finding: Finding) -> str:
    where = f" at step {finding.step}" if finding.step is not None else ""
    phase = f" ({finding.phase})" if finding.phase else ""
    return f"{finding.rule}{where}{phase}"


def _changes(old: Recipe, new: Recipe) -> dict[str, list[Any]]:
    return {key: [old.get(key), value] for key, value in new.items() if old.get(key) != value}


def _summary(changes: dict[str, list[Any]]) -> str:
    return ", ".join(f"{key} {fmt(a)} -> {fmt(b)}" for key, (a, b) in changes.items())


def _end(outcome: str, reason: str, spec: Recipe, best: str | None = None) -> Plan:
    return Plan(Decision(action="end", outcome=outcome, reason=reason, resume_from=best), spec)


def no_knob_reason(what: str, rule: str, roles: list[str]) -> str:
    """The end of the road when the job declares none of the knobs a ladder turns."""
    suggest = "learning_rate" if "learning_rate" in roles else roles[0]
    others = [role for role in roles if role != suggest]
    also = f" (its other remedies turn {', '.join(others)})" if others else ""
    return (
        f"{what}: no declared knob can remedy {rule}; declare a `{suggest}` knob{also}; "
        "a person must choose the next recipe"
    )


def healthy_checkpoint(attempt: Attempt, finding: Finding, checkpoints: Mapping[int, str]) -> str | None:
    """The newest checkpoint from before the run-up to the step where the rule fired.

    `checkpoints` maps step -> the file name the job wrote, as listed in S3: the URI is built from
    the real name, never from a name rebuilt here. Before the run-up means a next step of at most
    the sentinel's `onset_step`, and always before the failing step itself (whose weights produced
    the bad gradient). Without a step (a Debugger verdict has none) no checkpoint is known to be
    healthy. When the attempt wrote none that qualifies, the checkpoint it started from still does,
    unless it exploded within `REWIND_EVERY` steps of it or the run-up began before it: then that
    state carries the run-up too.
    """
    if finding.step is None:
        return None
    last = finding.step - 1 if finding.onset_step is None else min(finding.onset_step, finding.step - 1)
    before = [step for step in checkpoints if step <= last]
    if before:
        return f"{attempt.checkpoint_s3_uri}/{checkpoints[max(before)]}"
    resumed_at = checkpoint_step(attempt.resumed_from)
    if resumed_at is not None and (finding.step - resumed_at <= REWIND_EVERY or last < resumed_at):
        return None
    return attempt.resumed_from



def _is_off(knob: Knob, value: Any) -> bool:
    return value is False or (not isinstance(value, bool) and value == 0)



def _apply(
    rung: Rung, knob: Knob, state: WorkflowState, finding: Finding, spec: Recipe
) -> tuple[Recipe, str] | None:
    """The recipe with this rung's knob turned and why, or None when the rung does not apply to it."""
    name = knob.hyperparameter
    current = spec[name]
    start = state.job.hyperparameters
    why = rung.why
    if rung.op == "switch_on":
        if not _is_off(knob, current):
            return None
        new: Any = True if knob.type == "bool" else knob.max
        if knob.type == "int":
            new = int(new)
    elif rung.op == "set":
        if not _is_off(knob, current):
            return None
        new = knob.clamp(rung.value)
    elif rung.op == "prefer":
        assert knob.values is not None
        new = knob.values[0]
    elif rung.op == "size":
        sized = size_rate(rung, knob, state, finding, spec)
        if sized is None:
            return None
        new, how = sized
        why = f"{rung.why}: {how}"
    else:
        # A learning rate lowered to below its floor is lowered to the floor, once (as a sized rate
        # is): the last try of the ladder, not a give-up a step short of it. A raise is never clamped.
        lowering_a_rate = rung.role in RATE_ROLES and rung.value < 1
        new = within(rung, knob, current * rung.value, current, start.get(name, current), clamp=lowering_a_rate)
        if new is None:
            return None
    if new == current or (isinstance(new, float) and isinstance(current, (int, float))
                          and math.isclose(new, current, rel_tol=1e-9)):
        return None  # no change, up to float rounding (a rate sized back to the value it has)
    recipe = {**spec, name: new}
    if rung.op == "size":
        recipe, also = main_down_with_the_warmup(state, spec, keep_warmup_below_main(state, recipe))
        why += also
    return recipe, why


def _resume(state: WorkflowState, attempt: Attempt, rung: Rung, healthy: str | None) -> tuple[str | None, str]:
    """The checkpoint the relaunch starts from, and how the decision says it: "resumes from X" only
    when the relaunched job will load X, else "starts fresh" and why."""
    if rung.role in ARCHITECTURE_ROLES:
        return None, "starts fresh (the network changes, so no checkpoint fits it)"
    if healthy is None:
        return None, "starts fresh (no checkpoint from before the run-up)"
    fresh = why_fresh(state.job.integration, attempt)
    if fresh:
        return None, f"starts fresh ({fresh})"
    return healthy, f"resumes from {healthy.rsplit('/', 1)[-1]}"


def best_checkpoint(attempt: Attempt, checkpoints: Mapping[int, str], healthy: str | None) -> tuple[str | None, str]:
    """The checkpoint a run stopped early keeps, and why: the newest one at or before the step of
    the best validation value the job reported (a checkpoint's name is the next step, so one that
    follows an evaluation at step s is named s + 1), else the newest one before the finding."""
    seen = attempt.watched
    best = seen.best_evaluation if seen is not None else None
    if best is not None:
        step, value = best
        before = [s for s in checkpoints if s <= step + 1]
        if before:
            name = checkpoints[max(before)]
            kept = f"keeps {name}, at the best validation value {value:.4g} (step {step})"
            return f"{attempt.checkpoint_s3_uri}/{name}", kept
        where = f"no checkpoint at or before the best validation value (step {step})"
    else:
        where = "no validation value was reported"
    if healthy is None:
        return None, f"{where} and no checkpoint was written before the finding"
    return healthy, f"{where}; keeps the newest checkpoint before the finding, {healthy.rsplit('/', 1)[-1]}"


def _plateau_relaunches(state: WorkflowState) -> int:
    return sum(
        1
        for a in state.attempts
        if a.finding is not None and a.finding.rule in PLATEAU_RULES and a.decision is not None
        and a.decision.action == "relaunch"
    )


def plan_default(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    spec = recipe_in_force(state, attempt)  # the rates the job last ran, after its own rollbacks
    what = describe_finding(finding)
    # A rate that exploded in this execution says the rates were too high: a later sign of too small
    # a step (tiny gradients under Adam, dead units after the explosion) is not answered by going back up.
    exploded_before = any(
        a.finding is not None and a.finding.rule in EXPLOSIONS for a in state.attempts if a is not attempt
    ) or state.in_job.exploded or any(  # answered in a job (a corrupt batch: not the rate)
        rollback.rule in EXPLOSIONS and not rollback.transient for a in state.attempts for rollback in a.rollbacks)
    # The table's row for this finding and phase (its after-explosion row where there is one).
    ladder = remedies(finding.rule, finding.phase, exploded_before=exploded_before)
    if ladder is None:
        return _end("gave_up", f"{what}: no remedy is declared for {finding.rule}", spec)
    knobs = state.job.knobs.declared()
    healthy = healthy_checkpoint(attempt, finding, checkpoints)
    # A plateau's remedies are bounded: they are guesses, and each costs a whole job.
    plateau_tries = _plateau_relaunches(state) if finding.rule in PLATEAU_RULES else 0
    # NotLearning is the learning check's word for a loss that did not rise beyond its noise (one that
    # did is Diverging): the summary's last single step, noisier than that, does not overrule it.
    climbing = finding.rule != "NotLearning" and loss_rise(attempt.watched) is not None
    wanted: list[str] = []  # roles this finding's rungs would turn, declared or not
    for rung in ladder:
        if rung.unless and rung.unless in knobs:
            continue
        if rung.op == "stop_early":
            # Stopping is a success only for a run that learned; one that never did gets remedies.
            learned = has_learned(attempt.watched) if attempt.watched else finding.phase == "main"
            if rung.needs_learning and not learned:
                continue
            best, how = best_checkpoint(attempt, checkpoints, healthy)
            if best is None:
                continue  # nothing worth keeping: a stop would leave nothing to use
            return Plan(
                Decision(
                    action="end",
                    outcome="stopped_early",
                    remedy=rung.name,
                    resume_from=best,
                    reason=f"{what}: stopped early, {rung.why}; {how}",
                ),
                spec,
            )
        if plateau_tries >= PLATEAU_RELAUNCHES:
            return _end(
                "did_not_learn",
                f"{what}: the loss has not decreased after {plateau_tries} remedies; a plateau gets at most "
                f"{PLATEAU_RELAUNCHES} relaunches",
                spec,
            )
        # A rising loss is never answered with a higher learning rate, nor is any finding once a
        # rate of this execution exploded.
        if (climbing or exploded_before) and rung.role in RATE_ROLES and rung.op == "scale" and rung.value > 1:
            continue
        if rung.role not in wanted:
            wanted.append(rung.role)
        knob = knobs.get(rung.role)
        if knob is None:
            continue
        turned = _apply(rung, knob, state, finding, spec)
        if turned is None or state.tried(turned[0]):
            continue
        new, why = turned
        resume, start = _resume(state, attempt, rung, healthy)
        changes = _changes(spec, new)
        return Plan(
            Decision(
                action="relaunch",
                remedy=rung.name,
                changes=changes,
                resume_from=resume,
                reason=f"{what}: {_summary(changes)} ({why}); {start}",
            ),
            new,
            (ROLE_COUNTERS[rung.role],),
        )
    if wanted and not any(role in knobs for role in wanted):
        return _end("gave_up", no_knob_reason(what, finding.rule, wanted), spec)
    return _end("gave_up", f"{what}: every remedy for {finding.rule} is used up or already tried", spec)


# The original sample's ladder, as knob roles: halve the warm-up LR, add batch norm, LR x0.9.
ORIGINAL_ROLES = ["warmup_learning_rate", "normalization", "learning_rate"]


def plan_original(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    """The AWS sample's `plan_launch_spec`, rule-blind, always starting fresh, through the knobs.

    A step whose knob the job does not declare, or whose new value leaves the knob's bounds, is
    passed over as if it were used up.
    """
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    spec = attempt.run_spec
    what = describe_finding(finding)
    knobs = state.job.knobs.declared()
    if not any(role in knobs for role in ORIGINAL_ROLES):
        return _end("gave_up", no_knob_reason(what, finding.rule, ORIGINAL_ROLES), spec)
    warmup, norm, lr = (knobs.get(role) for role in ORIGINAL_ROLES)

    def within(knob: Knob, value: float) -> bool:
        return knob.admits(value) is None

    step: tuple[str, str, Knob, Any] | None = None
    # The thresholds below are the sample's, compared the way the sample compared them.
    if warmup and spec[warmup.hyperparameter] / 5 >= 1e-3 and within(warmup, spec[warmup.hyperparameter] * 0.5):
        step = ("halve_warmup_lr", "num_warmup_adjustments", warmup, spec[warmup.hyperparameter] * 0.5)
    elif norm and _is_off(norm, spec[norm.hyperparameter]):
        step = ("add_batch_norm", "num_batch_layer_adjustments", norm, True if norm.type == "bool" else int(norm.max))
    elif lr and spec[lr.hyperparameter] * 0.9 > 0.001 and within(lr, spec[lr.hyperparameter] * 0.9):
        step = ("lower_lr", "num_learning_rate_adjustments", lr, spec[lr.hyperparameter] * 0.9)
    if step is None:
        return _end("gave_up", f"{what}: the original ladder is used up", spec)
    name, counter, knob, value = step
    new = {**spec, knob.hyperparameter: value}
    changes = _changes(spec, new)
    return Plan(
        Decision(
            action="relaunch",
            remedy=name,
            changes=changes,
            reason=f"{what}: {_summary(changes)} (original ladder); starts fresh",
        ),
        new,
        (counter,),
    )


POLICIES = {"default": plan_default, "original": plan_original}


def plan(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    """Decide what follows an attempt in which `finding` fired, with the state's policy.

    The finding is read against the attempt's summary first: a VanishingGradient beside a climbing
    loss is answered as the divergence it is (stabilizer_workflow.evidence.verdicts.rediagnose).
    """
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    if finding.rule == NO_TENSOR_MATCHED:
        # A configured rule never saw its tensors: the run was not judged by it, which no remedy of
        # either policy answers; the reason quotes the finding (the rule, the parameter, the closest tensors).
        return _end("unverified", f"a configured rule could not judge the run: {finding.message}", attempt.run_spec)
    return POLICIES[state.policy](state, rediagnose(finding, attempt.watched), checkpoints)
