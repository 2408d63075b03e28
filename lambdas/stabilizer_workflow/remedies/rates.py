"""Learning rates sized from the evidence of a recipe family's attempts (the `default` policy's "size").

The last stable and the first failing learning rate of this recipe family (attempts that differ
only in their rates): the sentinel reports the highest rate each attempt took at least five
healthy steps at and the rate at the explosion. The next rate lies between the two, a tenth of the
way from the stable one in log space, the stable rate itself once the two are within 2x, and a
quarter of the failing rate while no stable rate is known; a tenth of it when the run at the failing
rate never took five healthy steps (it was wrecked from its first steps: a rate orders of magnitude too
high, which quartering would take more relaunches to come down from than a run is given). A
warm-up rate above the main rate is brought down to it, a main rate lowered below the warm-up rate
takes the warm-up rate down with it, and a warm-up that failed at a rate the main rate reaches too
takes the main rate down with it.

Pure arithmetic over the state: no decisions of what to remedy (stabilizer_workflow.remedies.policy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stabilizer_workflow.execution.job import Knob
from stabilizer_workflow.execution.state import Finding, WorkflowState
from stabilizer_workflow.remedies.ladders import EXPLOSION_RATE_FLOOR, EXPLOSIONS, Rung

Recipe = dict[str, Any]

RATE_ROLES = ("learning_rate", "warmup_learning_rate")
# Sizing a learning rate from the evidence (op "size"): the step down while no stable rate is
# known, and the ratio of failing to stable rate under which the stable rate itself is taken.
BLIND_STEP = 0.25
CLOSE_ENOUGH = 2.0
# ... and while the run that failed took fewer than NEVER_STABLE_ONSET healthy steps from its first
# (the sentinel's run-up put the onset there: its STABLE_STEPS) and no rate was stable: an order of
# magnitude. Counted from step 0, so that a schedule changing its rate at every step (whose run-up
# never finds a stable rate) is not taken for one wrecked from the start. Seen in the public scripts at 100 to
# 10,000 times their rates (nanoGPT, DCGAN, MNIST, Hogwild!, forward-forward, Siamese): quartering from
# there used up the relaunches at rates still too high to learn (docs/public-scripts.md).
NEVER_STABLE_STEP = 0.1
NEVER_STABLE_ONSET = 5
# How far from the stable toward the failing rate the next try goes, in log space. Not halfway: a
# try that fails costs a relaunch and the steps to its explosion, one on the low side only trains
# a little slower. Seen in the scenario suite (bn-lr-2x: 0.1 stable in warm-up, 2.0 failing after
# it): 0.45 (halfway) and 0.21 (a quarter) exploded again, 0.145 trained; a tenth of the way is 0.135.
TOWARD_FAILING = 0.1


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)



@dataclass(frozen=True)
class Evidence:
    """What this recipe family's attempts say about the learning rate (actual rates, not knob values).

    A family is the attempts whose recipes differ from the current one in their rates alone: a
    rate that exploded without batch norm says nothing about the network with it.
    """

    failing: float | None  # the lowest rate an attempt of the family exploded at
    stable: float | None  # the highest rate below it that an attempt took healthy steps at
    never_stable: bool = False  # the run failing at it took fewer than five healthy steps from its first

    def next_rate(self) -> tuple[float, str] | None:
        """The rate to try next, and why; None without a failing rate to size from."""
        if self.failing is None:
            return None
        failing = fmt(self.failing)
        if self.stable is None and self.never_stable:
            return self.failing * NEVER_STABLE_STEP, (f"the run at the failing rate {failing} never took five "
                                                      "healthy steps: a tenth of it")
        if self.stable is None:
            return self.failing * BLIND_STEP, f"no stable rate is known yet: a quarter of the failing {failing}"
        stable = fmt(self.stable)
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
    # The sentinel read the run-up: at the failing rate, no rate stable and the onset in the first steps.
    never_stable = low is not None and any(
        f.rule in EXPLOSIONS and f.learning_rate == low and f.stable_learning_rate is None
        and f.onset_step is not None and f.onset_step < NEVER_STABLE_ONSET
        for f in findings
    )
    return Evidence(low, max(stable, default=None), never_stable)



def within(rung: Rung, knob: Knob, new: Any, current: Any, initial: Any, *, clamp: bool) -> Any:
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



def size_rate(rung: Rung, knob: Knob, state: WorkflowState, finding: Finding, spec: Recipe) -> tuple[Any, str] | None:
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
    new = within(rung, knob, new, current, state.job.hyperparameters.get(name, current), clamp=True)
    if new is None:
        return None
    return new, how


def keep_warmup_below_main(state: WorkflowState, recipe: Recipe) -> Recipe:
    """A main rate lowered below the warm-up rate takes the warm-up rate down with it."""
    knobs = state.job.knobs.declared()
    main, warmup = knobs.get("learning_rate"), knobs.get("warmup_learning_rate")
    if main is None or warmup is None:
        return recipe
    if recipe[warmup.hyperparameter] > recipe[main.hyperparameter]:
        return {**recipe, warmup.hyperparameter: warmup.clamp(recipe[main.hyperparameter])}
    return recipe


def main_down_with_the_warmup(state: WorkflowState, spec: Recipe, recipe: Recipe) -> tuple[Recipe, str]:
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
    main_rate = fmt(recipe[main.hyperparameter])
    also = f"; the main rate {main_rate} is no lower than the warm-up rate that failed, so it comes down too"
    # Never below the ladder's floor of its own (a warm-up a tenth of it would take it a tenth lower), nor up.
    current = recipe[main.hyperparameter]
    own = state.job.hyperparameters.get(main.hyperparameter, current)
    return {**recipe, main.hyperparameter: main.clamp(min(current, max(lowered, own * EXPLOSION_RATE_FLOOR)))}, also
