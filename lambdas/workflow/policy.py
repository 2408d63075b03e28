"""Remediation policies: given the state and what fired, decide the next recipe or the end.

Pure functions over typed values: no AWS, no clock, no logging side effects. The monitor calls
`plan()` once per finished attempt that had an issue; everything it returns is recorded in the
state and sent in the notification.

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

from workflow.state import Attempt, Decision, Finding, RunSpec, WorkflowState

# --------------------------------------------------------------------------------------------
# Ladders as data
# --------------------------------------------------------------------------------------------

ANY_PHASE = frozenset({"warmup", "main", None})


@dataclass(frozen=True)
class Rung:
    """One remedy: change one run_spec field, within a bound, when the diagnosis fits.

    op "set" writes `value` (only when the field currently equals `from_value`, if given);
    op "scale" multiplies by `value` and is allowed only while the result stays within
    [`floor`, `ceiling`]; op "stop_early" ends the execution keeping the best checkpoint.
    """

    name: str
    op: Literal["set", "scale", "stop_early"]
    field: str = ""
    value: Any = None
    from_value: Any = None
    floor: float | None = None
    ceiling: float | None = None
    phases: frozenset = ANY_PHASE
    counter: str | None = None
    why: str = ""


# Order of the ExplodingTensor ladder, and why.
# The reference network (ResNet-20, ELU, no batch norm) explodes at LR 0.1 because nothing bounds
# the scale of each residual branch: the sum grows with depth until gradients overflow. The
# original sample spent five jobs halving the warm-up LR (0.1 -> 0.003125) and the run still
# exploded; only batch norm fixed it. Batch norm before the addition removes the cause at the
# intended learning rate, so the run also keeps training as fast as intended. So:
#   1. add batch norm first: the strongest single fix, one job instead of six;
#   2. a lower warm-up LR, but only for an explosion during warm-up (after warm-up, the warm-up
#      LR no longer acts, so lowering it would just burn a job);
#   3. a lower main LR for an explosion after warm-up (or where the phase is unknown);
#   4. gradient clipping last: it hides the symptom per step rather than fixing the dynamics,
#      and a too-tight clip slows training.
# Each LR step is x0.25 / x0.5 rather than the original's x0.5 / x0.9, so a bounded ladder reaches
# a stable region in a few jobs instead of a dozen.
EXPLODING_TENSOR = (
    Rung(
        "add_batch_norm",
        "set",
        "add_batch_norm",
        1,
        from_value=0,
        counter="num_batch_layer_adjustments",
        why="batch norm before each residual addition bounds the residual sum's scale",
    ),
    Rung(
        "lower_warmup_lr",
        "scale",
        "warmup_learning_rate",
        0.25,
        floor=1e-3,
        phases=frozenset({"warmup"}),
        counter="num_warmup_adjustments",
        why="it exploded during warm-up, so a 4x smaller warm-up learning rate",
    ),
    Rung(
        "lower_lr",
        "scale",
        "learning_rate",
        0.5,
        floor=1e-3,
        phases=frozenset({"main", None}),
        counter="num_learning_rate_adjustments",
        why="it exploded after warm-up, so half the learning rate",
    ),
    Rung(
        "clip_gradients",
        "set",
        "grad_clip",
        1.0,
        from_value=0.0,
        counter="num_grad_clip_adjustments",
        why="learning-rate remedies are used up; clip the total gradient norm at 1.0",
    ),
    Rung(
        "tighten_grad_clip",
        "scale",
        "grad_clip",
        0.5,
        floor=0.1,
        counter="num_grad_clip_adjustments",
        why="the clipped run still exploded; halve the clipping norm",
    ),
)

VANISHING_GRADIENT = (
    Rung(
        "add_batch_norm",
        "set",
        "add_batch_norm",
        1,
        from_value=0,
        counter="num_batch_layer_adjustments",
        why="batch norm keeps activations, and so gradients, at a usable scale through depth",
    ),
    Rung(
        "use_elu",
        "set",
        "activation",
        "elu",
        from_value="relu",
        counter="num_activation_adjustments",
        why="ELU passes gradient for negative inputs where ReLU units die",
    ),
    Rung(
        "raise_lr",
        "scale",
        "learning_rate",
        2.0,
        ceiling=0.4,
        counter="num_learning_rate_adjustments",
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
        "set",
        "add_batch_norm",
        1,
        from_value=0,
        counter="num_batch_layer_adjustments",
        why="a loss that never decreased is often badly scaled activations; add batch norm",
    ),
    Rung(
        "lower_lr",
        "scale",
        "learning_rate",
        0.5,
        floor=1e-3,
        counter="num_learning_rate_adjustments",
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
    run_spec: RunSpec
    counters: tuple[str, ...] = field(default_factory=tuple)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def describe_finding(finding: Finding) -> str:
    where = f" at step {finding.step}" if finding.step is not None else ""
    phase = f" ({finding.phase})" if finding.phase else ""
    return f"{finding.rule}{where}{phase}"


def _changes(old: RunSpec, new: RunSpec) -> dict[str, list[Any]]:
    before, after = old.model_dump(), new.model_dump()
    return {key: [before[key], after[key]] for key in after if before[key] != after[key]}


def _end(outcome: str, reason: str, spec: RunSpec, best: str | None = None) -> Plan:
    return Plan(Decision(action="end", outcome=outcome, reason=reason, resume_from=best), spec)


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


def _apply(rung: Rung, spec: RunSpec) -> RunSpec | None:
    current = getattr(spec, rung.field)
    if rung.op == "set":
        if rung.from_value is not None and current != rung.from_value:
            return None
        new = rung.value
    else:
        new = current * rung.value
        if rung.floor is not None and new < rung.floor:
            return None
        if rung.ceiling is not None and new > rung.ceiling:
            return None
    if new == current:
        return None
    return spec.model_copy(update={rung.field: new})


def plan_default(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    spec = attempt.run_spec
    what = describe_finding(finding)
    ladder = LADDERS.get(finding.rule)
    if ladder is None:
        return _end("gave_up", f"{what}: no remedy is declared for {finding.rule}", spec)
    healthy = healthy_checkpoint(attempt, finding, checkpoints)
    for rung in ladder:
        if finding.phase not in rung.phases:
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
        new = _apply(rung, spec)
        if new is None or state.tried(new):
            continue
        # Weights only carry over to the same network; a new architecture starts from scratch.
        resume = healthy if new.architecture() == spec.architecture() else None
        changes = _changes(spec, new)
        summary = ", ".join(f"{key} {_fmt(a)} -> {_fmt(b)}" for key, (a, b) in changes.items())
        start = f"resume from {resume.rsplit('/', 1)[-1]}" if resume else "start fresh"
        return Plan(
            Decision(
                action="relaunch",
                remedy=rung.name,
                changes=changes,
                resume_from=resume,
                reason=f"{what}: {summary} ({rung.why}); {start}",
            ),
            new,
            (rung.counter,) if rung.counter else (),
        )
    return _end("gave_up", f"{what}: every remedy for {finding.rule} is used up or already tried", spec)


def plan_original(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    """The AWS sample's `plan_launch_spec`, rule-blind, always starting fresh."""
    attempt = state.current
    assert attempt is not None, "plan needs an attempt"
    spec = attempt.run_spec
    what = describe_finding(finding)
    warmup, lr = spec.warmup_learning_rate, spec.learning_rate
    # The thresholds below are the sample's, compared the way the sample compared them.
    if warmup / 5 >= 1e-3:
        name, counter, update = (
            "halve_warmup_lr",
            "num_warmup_adjustments",
            {"warmup_learning_rate": warmup * 0.5},
        )
    elif spec.add_batch_norm == 0:
        name, counter, update = "add_batch_norm", "num_batch_layer_adjustments", {"add_batch_norm": 1}
    elif lr * 0.9 > 0.001:
        name, counter, update = "lower_lr", "num_learning_rate_adjustments", {"learning_rate": lr * 0.9}
    else:
        return _end("gave_up", f"{what}: the original ladder is used up", spec)
    new = spec.model_copy(update=update)
    changes = _changes(spec, new)
    summary = ", ".join(f"{key} {_fmt(a)} -> {_fmt(b)}" for key, (a, b) in changes.items())
    return Plan(
        Decision(
            action="relaunch",
            remedy=name,
            changes=changes,
            reason=f"{what}: {summary} (original ladder); start fresh",
        ),
        new,
        (counter,),
    )


POLICIES = {"default": plan_default, "original": plan_original}


def plan(state: WorkflowState, finding: Finding, checkpoints: Mapping[int, str]) -> Plan:
    """Decide what follows an attempt in which `finding` fired, with the state's policy."""
    return POLICIES[state.policy](state, finding, checkpoints)
