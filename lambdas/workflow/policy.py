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
* `default` uses per-rule remedy ladders declared as data below, chosen and sized by the
  evidence of the attempts so far (`Evidence`), never repeats a recipe already tried, and resumes
  from a checkpoint taken before the run-up to the explosion when the network is unchanged.

What `default` reads, and why:

* the **phase** of the explosion: a lower warm-up LR only for an explosion during warm-up (after
  it, the warm-up LR no longer acts);
* **normalisation**: a network without it is fixed at its cause first (batch norm), fresh;
* the **last stable and the first failing learning rate** of this recipe family (attempts that
  differ only in their rates): the sentinel reports the highest rate each attempt took at least
  five healthy steps at (a warm-up that went well is such a rate) and the rate at the explosion.
  The next rate lies between the two, a tenth of the way from the stable one in log space
  (where learning rates live; a bisection leaning well to the safe side), the stable rate itself once
  the two are within 2x, and a quarter of the failing rate while no stable rate is known. A
  warm-up rate above the main rate is brought down to it, a main rate lowered below the
  warm-up rate takes the warm-up rate down with it, and a warm-up that failed at a rate the main
  rate reaches too (a warm-up at the main rate) takes the main rate down with it (scale the two
  together);
* the **run-up**: the sentinel reports where it began (the first step at a new learning rate,
  where the gradient norm started to grow, or the last state whose loss was under twice where the
  lineage started). The relaunch resumes from the newest checkpoint from before it: a copy taken
  two steps into a rate the network cannot take already carries those steps in its weights and
  momentum, and fails again at any rate;
* whether **the last remedy moved the explosion**: a relaunch that exploded within
  `REWIND_EVERY` steps of the checkpoint it resumed from, or whose run-up began before it,
  starts fresh next time.

A `Diverging` finding (the sentinel's loss at ten times where it started, finite or not) is an
explosion caught before the overflow: the same ladder answers it, and its rate counts as failing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workflow.job import Knob
from workflow.observation import checkpoint_step
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
RATE_ROLES = ("learning_rate", "warmup_learning_rate")
# The sentinel's rewind copies the training state every this many steps (rule_engine.rewind).
REWIND_EVERY = 5
# Findings that are an explosion, caught at the overflow or before it (the sentinel's own check).
EXPLOSIONS = frozenset({"ExplodingTensor", "Diverging"})
# Sizing a learning rate from the evidence (op "size"): the step down while no stable rate is
# known, and the ratio of failing to stable rate under which the stable rate itself is taken.
BLIND_STEP = 0.25
CLOSE_ENOUGH = 2.0
# How far from the stable toward the failing rate the next try goes, in log space. Not halfway: a
# try that fails costs a relaunch and the steps to its explosion, one on the low side only trains
# a little slower. Seen in the scenario suite (bn-lr-2x: 0.1 stable in warm-up, 2.0 failing after
# it): 0.45 (halfway) and 0.21 (a quarter) exploded again, 0.145 trained; a tenth of the way is 0.135.
TOWARD_FAILING = 0.1


@dataclass(frozen=True)
class Rung:
    """One remedy: turn one knob, within its bounds and the rung's own limits, when the diagnosis fits.

    op "switch_on" turns an off switch on (normalization); "set" writes `value` (clamped to the
    knob's bounds) only while the knob is off, i.e. 0 (grad_clip); "size" sets a learning rate
    from the evidence (module docstring), within the same limits as "scale"; "scale" multiplies by `value`
    while the result stays within the knob's bounds and within [`floor_ratio`, `ceiling_ratio`]
    times the job's starting value and above `floor`; "prefer" moves a choice knob to the value
    its declaration lists first; "stop_early" ends the execution keeping the best checkpoint.
    `unless` skips the rung when the job declares that role (a better-aimed rung exists).
    """

    name: str
    op: Literal["switch_on", "set", "size", "scale", "prefer", "stop_early"]
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
#      warm-up the job has no separate knob for;
#   4. gradient clipping: it hides the symptom per step rather than fixing the dynamics, and a
#      too-tight clip slows training;
#   5. a larger batch last: less gradient noise at the same learning rate, at more memory.
# Learning rates are sized from the evidence (module docstring), never below 1/100 of the job's own.
EXPLODING_TENSOR = (
    Rung(
        "add_batch_norm",
        "switch_on",
        "normalization",
        why="normalisation bounds the scale of activations, so of residual sums and gradients",
    ),
    Rung(
        "lower_warmup_lr",
        "size",
        "warmup_learning_rate",
        floor_ratio=0.01,
        phases=frozenset({"warmup"}),
        why="it exploded during warm-up",
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
        "size",
        "learning_rate",
        floor_ratio=0.01,
        phases=frozenset({"main", None}),
        why="it exploded after warm-up (or the job has none)",
    ),
    Rung(
        "lower_lr",
        "size",
        "learning_rate",
        floor_ratio=0.01,
        phases=frozenset({"warmup"}),
        unless="warmup_learning_rate",
        why="it exploded during warm-up and no warm-up learning rate is declared",
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
    "Diverging": EXPLODING_TENSOR,
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


@dataclass(frozen=True)
class Evidence:
    """What this recipe family's attempts say about the learning rate (actual rates, not knob values).

    A family is the attempts whose recipes differ from the current one in their rates alone: a
    rate that exploded without batch norm says nothing about the network with it.
    """

    failing: float | None  # the lowest rate an attempt of the family exploded at
    stable: float | None  # the highest rate below it that an attempt took healthy steps at

    def next_rate(self) -> tuple[float, str] | None:
        """The rate to try next, and why; None without a failing rate to size from."""
        if self.failing is None:
            return None
        failing = _fmt(self.failing)
        if self.stable is None:
            return self.failing * BLIND_STEP, f"no stable rate is known yet: a quarter of the failing {failing}"
        stable = _fmt(self.stable)
        if self.failing / self.stable <= CLOSE_ENOUGH:
            return self.stable, f"the last stable rate {stable} (the failing {failing} is within 2x)"
        step = self.stable * (self.failing / self.stable) ** TOWARD_FAILING
        return step, f"a tenth of the way from the last stable rate {stable} to the failing {failing}"


def _rate_names(state: WorkflowState) -> set[str]:
    knobs = state.job.knobs.declared()
    return {knobs[role].hyperparameter for role in RATE_ROLES if role in knobs}


def rate_evidence(state: WorkflowState) -> Evidence:
    attempt = state.current
    assert attempt is not None
    rates = _rate_names(state)

    def family(spec: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in spec.items() if key not in rates}

    mine = family(attempt.run_spec)
    findings = [a.finding for a in state.attempts if a.finding is not None and family(a.run_spec) == mine]
    failing = [
        f.learning_rate
        for f in findings
        if f.rule in EXPLOSIONS and f.learning_rate is not None and math.isfinite(f.learning_rate)
    ]
    low = min(failing, default=None)
    stable = [
        f.stable_learning_rate
        for f in findings
        if f.stable_learning_rate is not None and (low is None or f.stable_learning_rate < low)
    ]
    return Evidence(low, max(stable, default=None))


def _is_off(knob: Knob, value: Any) -> bool:
    return value is False or (not isinstance(value, bool) and value == 0)


def _within(rung: Rung, knob: Knob, new: Any, current: Any, initial: Any, *, clamp: bool) -> Any:
    """`new` inside the knob's bounds and the rung's limits; clamped to them, or None when outside."""
    lowest = max(b for b in [knob.min, rung.floor, initial * rung.floor_ratio if rung.floor_ratio else None]
                 if b is not None)
    highest = min([knob.max] + ([initial * rung.ceiling_ratio] if rung.ceiling_ratio else []))
    if knob.type == "int":
        new = round(new)
    if clamp and lowest < current:
        new = min(max(new, lowest), highest)
    if new < lowest or new > highest:
        return None
    return new


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
        sized = _size_rate(rung, knob, state, finding, spec)
        if sized is None:
            return None
        new, how = sized
        why = f"{rung.why}: {how}"
    else:
        new = _within(rung, knob, current * rung.value, current, start.get(name, current), clamp=False)
        if new is None:
            return None
    if new == current:
        return None
    recipe = {**spec, name: new}
    if rung.op == "size":
        recipe, also = _main_down_with_the_warmup(state, spec, _keep_warmup_below_main(state, recipe))
        why += also
    return recipe, why


def _size_rate(rung: Rung, knob: Knob, state: WorkflowState, finding: Finding, spec: Recipe) -> tuple[Any, str] | None:
    """A rate knob's next value from the evidence: the knob moves by the ratio of the next to the failing rate."""
    name = knob.hyperparameter
    current = spec[name]
    evidence = rate_evidence(state)
    rate = finding.learning_rate if finding.learning_rate and math.isfinite(finding.learning_rate) else None
    if rate is None:  # no rate in the finding: the knob's own value is the failing rate
        rate, evidence = current, Evidence(current, None)
    target = evidence.next_rate()
    if target is None:
        return None
    next_rate, how = target
    new = current * next_rate / rate
    knobs = state.job.knobs.declared()
    main = knobs.get("learning_rate")
    # A warm-up is a gentler start than the main rate; one above it defeats its purpose.
    if rung.role == "warmup_learning_rate" and main is not None and spec[main.hyperparameter] < min(current, new):
        new, how = spec[main.hyperparameter], "a warm-up rate above the main rate is brought down to the main rate"
    new = _within(rung, knob, new, current, state.job.hyperparameters.get(name, current), clamp=True)
    if new is None:
        return None
    return new, how


def _keep_warmup_below_main(state: WorkflowState, recipe: Recipe) -> Recipe:
    """A main rate lowered below the warm-up rate takes the warm-up rate down with it."""
    knobs = state.job.knobs.declared()
    main, warmup = knobs.get("learning_rate"), knobs.get("warmup_learning_rate")
    if main is None or warmup is None:
        return recipe
    if recipe[warmup.hyperparameter] > recipe[main.hyperparameter]:
        return {**recipe, warmup.hyperparameter: warmup.clamp(recipe[main.hyperparameter])}
    return recipe


def _main_down_with_the_warmup(state: WorkflowState, spec: Recipe, recipe: Recipe) -> tuple[Recipe, str]:
    """A warm-up that failed at a rate the main rate reaches too: the main rate comes down with it.

    A warm-up at the main rate warms nothing: the rate itself failed from the first steps, and the
    main phase would meet it again (depth 32 at 0.2: the warm-up lowered alone, the run diverged
    five steps after the switch back to 0.2). A main rate below the failing warm-up rate is left
    alone: that is a warm-up too steep for the start, which lowering it answers.
    """
    knobs = state.job.knobs.declared()
    main, warmup = knobs.get("learning_rate"), knobs.get("warmup_learning_rate")
    if main is None or warmup is None:
        return recipe, ""
    failed, lowered = spec[warmup.hyperparameter], recipe[warmup.hyperparameter]
    if recipe[main.hyperparameter] < failed or lowered >= failed:
        return recipe, ""
    main_rate = _fmt(recipe[main.hyperparameter])
    also = f"; the main rate {main_rate} is no lower than the warm-up rate that failed, so it comes down too"
    return {**recipe, main.hyperparameter: main.clamp(lowered)}, also


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
        turned = _apply(rung, knob, state, finding, spec)
        if turned is None or state.tried(turned[0]):
            continue
        new, why = turned
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
            reason=f"{what}: {_summary(changes)} (original ladder); start fresh",
        ),
        new,
        (counter,),
    )


POLICIES = {"default": plan_default, "original": plan_original}


def plan(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    """Decide what follows an attempt in which `finding` fired, with the state's policy."""
    return POLICIES[state.policy](state, finding, checkpoints)
