"""Remedy ladders as data: per rule, the remedies the `default` policy tries, in order, and why.

A rung names a knob role and an operation; `stabilizer_workflow.policy` applies it through the job's declared
knobs, sized by the evidence (`stabilizer_workflow.rates`). Data only: no decisions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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

# Findings that are an explosion, caught at the overflow or before it (the sentinel's own check).
EXPLOSIONS = frozenset({"ExplodingTensor", "Diverging"})


@dataclass(frozen=True)
class Rung:
    """One remedy: turn one knob, within its bounds and the rung's own limits, when the diagnosis fits.

    op "switch_on" turns an off switch on (normalization); "set" writes `value` (clamped to the
    knob's bounds) only while the knob is off, i.e. 0 (grad_clip); "size" sets a learning rate
    from the evidence (stabilizer_workflow.rates), within the same limits as "scale"; "scale" multiplies by `value`
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
    # stop_early only: stop only a run whose summary says it learned (a plateau); a run that never
    # learned goes on to the next rungs.
    needs_learning: bool = False


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
# Learning rates are sized from the evidence (stabilizer_workflow.rates), never below 1/100 of the job's own.
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
    # A loss that stops decreasing after the run learned is a plateau: the run has learned what it
    # will at this recipe, and more epochs only cost money. Keep the best checkpoint. Whether it
    # learned is the summary's word (without a summary: the plateau came after warm-up).
    Rung(
        "stop_early",
        "stop_early",
        needs_learning=True,
        why="the loss plateaued after the run learned; more epochs would not help",
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
