"""Remediation policies: given the state and what fired, decide the next recipe or the end.

Pure functions over typed values: no AWS, no clock, no logging side effects. The monitor calls
`plan()` once per finished attempt that had an issue; everything it returns is recorded in the
state and sent in the notification.

Remedies act only through the job's declared **knobs** (workflow.job): a rung names a knob
role (`learning_rate`, `normalization`, ...), and the recipe changes the hyperparameter that
knob names, within the knob's bounds. Where the job declares no knob a ladder could turn, the
decision says so, names the knob to declare, and the execution ends for a person to decide.

Two named policies:

* `original` reproduces the AWS sample's ladder exactly (whatever rule fired): halve the warm-up
  LR while warmup/5 >= 1e-3, then add batch norm, then LR x0.9 while LR x0.9 > 1e-3, else end.
  It is kept so that the two can be measured side by side.
* `default` uses per-rule remedy ladders declared as data below, diagnosis-aware (a lower
  warm-up LR only for an explosion that happened during warm-up), never repeats a recipe already
  tried, and resumes from the last healthy checkpoint when the network is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workflow.job import Knob
from workflow.state import Attempt, Decision, Finding, WorkflowState

Recipe = dict[str, Any]

# --------------------------------------------------------------------------------------------
# Ladders as data
# --------------------------------------------------------------------------------------------

ANY_PHASE = frozenset({"warmup", "main", None})

# Which history counter each knob role moves (the original sample's counters, plus batch size).
ROLE_COUNTERS = {
    "learning_rate": "num_learning_rate_adjustments",
    "warmup_learning_rate": "num_warmup_adjustments",
    "warmup_length": "num_warmup_adjustments",
    "normalization": "num_batch_layer_adjustments",
    "grad_clip": "num_grad_clip_adjustments",
    "batch_size": "num_batch_size_adjustments",
    "activation": "num_activation_adjustments",
}
# Turning these changes the network, so a checkpoint's weights no longer fit it.
ARCHITECTURE_ROLES = frozenset({"normalization", "activation"})


@dataclass(frozen=True)
class Rung:
    """One remedy: turn one knob, within its bounds and the rung's own limits, when the diagnosis fits.

    op "switch_on" turns an off switch on (normalization); "set" writes `value` (clamped to the
    knob's bounds) only while the knob is off, i.e. 0 (grad_clip); "scale" multiplies by `value`
    while the result stays within the knob's bounds and within [`floor_ratio`, `ceiling_ratio`]
    times the job's starting value and above `floor`; "prefer" moves a choice knob to the value
    its declaration lists first; "stop_early" ends the execution keeping the best checkpoint.
    `unless` skips the rung when the job declares that role (a better-aimed rung exists).
    """

    name: str
    op: Literal["switch_on", "set", "scale", "prefer", "stop_early"]
    role: str = ""
    value: Any = None
    floor: float | None = None
    floor_ratio: float | None = None
    ceiling_ratio: float | None = None
    phases: frozenset = ANY_PHASE
    unless: str | None = None
    why: str = ""


# Order of the ExplodingTensor ladder, and why.
# The reference network (ResNet-20, ELU, no batch norm) explodes at LR 0.1 because nothing bounds
# the scale of each residual branch: the sum grows with depth until gradients overflow. The
# original sample spent five jobs halving the warm-up LR (0.1 -> 0.003125) and the run still
# exploded; only batch norm fixed it. Normalisation removes the cause at the intended learning
# rate, so the run also keeps training as fast as intended. So:
#   1. switch normalisation on first: the strongest single fix, one job instead of six;
#   2. a lower warm-up LR (or a longer warm-up), but only for an explosion during warm-up (after
#      warm-up, the warm-up LR no longer acts, so lowering it would just burn a job);
#   3. a lower main LR for an explosion after warm-up, where the phase is unknown, or during a
#      warm-up the job has no separate knob for (a warm-up ramps up to the main LR);
#   4. gradient clipping: it hides the symptom per step rather than fixing the dynamics, and a
#      too-tight clip slows training;
#   5. a larger batch last: less gradient noise at the same learning rate, at more memory.
# Each LR step is x0.25 / x0.5 rather than the original's x0.5 / x0.9, so a bounded ladder reaches
# a stable region in a few jobs instead of a dozen; none goes below 1/100 of the job's own value.
EXPLODING_TENSOR = (
    Rung(
        "add_batch_norm",
        "switch_on",
        "normalization",
        why="normalisation bounds the scale of activations, so of residual sums and gradients",
    ),
    Rung(
        "lower_warmup_lr",
        "scale",
        "warmup_learning_rate",
        0.25,
        floor_ratio=0.01,
        phases=frozenset({"warmup"}),
        why="it exploded during warm-up, so a 4x smaller warm-up learning rate",
    ),
    Rung(
        "lengthen_warmup",
        "scale",
        "warmup_length",
        2,
        ceiling_ratio=8,
        phases=frozenset({"warmup"}),
        why="it exploded during warm-up, so a warm-up twice as long (a gentler ramp)",
    ),
    Rung(
        "lower_lr",
        "scale",
        "learning_rate",
        0.5,
        floor_ratio=0.01,
        phases=frozenset({"main", None}),
        why="it exploded after warm-up (or the job has none), so half the learning rate",
    ),
    Rung(
        "lower_lr",
        "scale",
        "learning_rate",
        0.5,
        floor_ratio=0.01,
        phases=frozenset({"warmup"}),
        unless="warmup_learning_rate",
        why="it exploded during warm-up and no warm-up learning rate is declared, so half the learning rate",
    ),
    Rung(
        "clip_gradients",
        "set",
        "grad_clip",
        1.0,
        why="learning-rate remedies are used up; clip the total gradient norm at 1.0",
    ),
    Rung(
        "tighten_grad_clip",
        "scale",
        "grad_clip",
        0.5,
        floor=0.1,
        why="the clipped run still exploded; halve the clipping norm",
    ),
    Rung(
        "raise_batch_size",
        "scale",
        "batch_size",
        2,
        ceiling_ratio=4,
        why="the other remedies are used up; a batch twice as large averages out gradient noise",
    ),
)

VANISHING_GRADIENT = (
    Rung(
        "add_batch_norm",
        "switch_on",
        "normalization",
        why="normalisation keeps activations, and so gradients, at a usable scale through depth",
    ),
    Rung(
        "use_elu",
        "prefer",
        "activation",
        why="the declared preferred activation passes gradient where the current one's units die",
    ),
    Rung(
        "raise_lr",
        "scale",
        "learning_rate",
        2.0,
        ceiling_ratio=4,
        why="gradients are tiny but finite; double the learning rate",
    ),
)

LOSS_NOT_DECREASING = (
    # After warm-up, a loss that stops decreasing is a plateau: the run has learned what it will
    # at this recipe, and more epochs only cost money. Keep the best checkpoint.
    Rung(
        "stop_early",
        "stop_early",
        phases=frozenset({"main"}),
        why="the loss plateaued after warm-up; more epochs would not help",
    ),
    # A loss that never decreased at all: normalisation, then a smaller step.
    Rung(
        "add_batch_norm",
        "switch_on",
        "normalization",
        why="a loss that never decreased is often badly scaled activations; add normalisation",
    ),
    Rung(
        "lower_lr",
        "scale",
        "learning_rate",
        0.5,
        floor_ratio=0.01,
        why="the loss is not decreasing; half the learning rate in case it oscillates",
    ),
)

OVERFIT = (
    Rung(
        "stop_early",
        "stop_early",
        why="the test loss is rising while the training loss falls; the best model is behind us",
    ),
)

LADDERS: dict[str, tuple[Rung, ...]] = {
    "ExplodingTensor": EXPLODING_TENSOR,
    "VanishingGradient": VANISHING_GRADIENT,
    "LossNotDecreasing": LOSS_NOT_DECREASING,
    "Overfit": OVERFIT,
    "Overtraining": OVERFIT,
}


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a policy decided: the decision to record and, for a relaunch, the next recipe."""

    decision: Decision
    run_spec: Recipe
    counters: tuple[str, ...] = field(default_factory=tuple)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def describe_finding(finding: Finding) -> str:
    where = f" at step {finding.step}" if finding.step is not None else ""
    phase = f" ({finding.phase})" if finding.phase else ""
    return f"{finding.rule}{where}{phase}"


def _changes(old: Recipe, new: Recipe) -> dict[str, list[Any]]:
    return {key: [old.get(key), value] for key, value in new.items() if old.get(key) != value}


def _summary(changes: dict[str, list[Any]]) -> str:
    return ", ".join(f"{key} {_fmt(a)} -> {_fmt(b)}" for key, (a, b) in changes.items())


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
    """The newest checkpoint written strictly before the step where the rule fired.

    `checkpoints` maps step -> the file name the job wrote, as listed in S3: the URI is built from
    the real name, never from a name rebuilt here. Without a step (a Debugger verdict has none) no
    checkpoint is known to be healthy. When the attempt wrote none before the step, the checkpoint
    it started from (if any) still is.
    """
    if finding.step is None:
        return None
    before = [step for step in checkpoints if step < finding.step]
    if before:
        return f"{attempt.checkpoint_s3_uri}/{checkpoints[max(before)]}"
    return attempt.resumed_from


def _is_off(knob: Knob, value: Any) -> bool:
    return value is False or (not isinstance(value, bool) and value == 0)


def _apply(rung: Rung, knob: Knob, spec: Recipe, start: Recipe) -> Recipe | None:
    """The recipe with this rung's knob turned, or None when the rung does not apply to it."""
    name = knob.hyperparameter
    current = spec[name]
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
    else:
        new = current * rung.value
        initial = start.get(name, current)
        lowest = [knob.min, rung.floor] + ([initial * rung.floor_ratio] if rung.floor_ratio else [])
        highest = [knob.max] + ([initial * rung.ceiling_ratio] if rung.ceiling_ratio else [])
        if knob.type == "int":
            new = round(new)
        if new < max(b for b in lowest if b is not None) or new > min(highest):
            return None
    if new == current:
        return None
    return {**spec, name: new}


def plan_default(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    spec = attempt.run_spec
    what = describe_finding(finding)
    ladder = LADDERS.get(finding.rule)
    if ladder is None:
        return _end("gave_up", f"{what}: no remedy is declared for {finding.rule}", spec)
    knobs = state.job.knobs.declared()
    healthy = healthy_checkpoint(attempt, finding, checkpoints)
    wanted: list[str] = []  # roles this finding's rungs would turn, declared or not
    for rung in ladder:
        if finding.phase not in rung.phases or (rung.unless and rung.unless in knobs):
            continue
        if rung.op == "stop_early":
            if healthy is None:
                continue  # nothing worth keeping yet: fall through to the remedies
            return Plan(
                Decision(
                    action="end",
                    outcome="succeeded",
                    remedy=rung.name,
                    resume_from=healthy,
                    reason=f"{what}: stopped early, {rung.why}; best checkpoint {healthy}",
                ),
                spec,
            )
        if rung.role not in wanted:
            wanted.append(rung.role)
        knob = knobs.get(rung.role)
        if knob is None:
            continue
        new = _apply(rung, knob, spec, state.job.hyperparameters)
        if new is None or state.tried(new):
            continue
        # Weights only carry over to the same network; a new architecture starts from scratch.
        resume = None if rung.role in ARCHITECTURE_ROLES else healthy
        changes = _changes(spec, new)
        start = f"resume from {resume.rsplit('/', 1)[-1]}" if resume else "start fresh"
        return Plan(
            Decision(
                action="relaunch",
                remedy=rung.name,
                changes=changes,
                resume_from=resume,
                reason=f"{what}: {_summary(changes)} ({rung.why}); {start}",
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
            reason=f"{what}: {_summary(changes)} (original ladder); start fresh",
        ),
        new,
        (counter,),
    )


POLICIES = {"default": plan_default, "original": plan_original}


def plan(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    """Decide what follows an attempt in which `finding` fired, with the state's policy."""
    return POLICIES[state.policy](state, finding, checkpoints)
