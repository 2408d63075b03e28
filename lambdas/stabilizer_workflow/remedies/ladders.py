"""The remedy table: per finding and phase, the remedies the `default` policy tries, in order.

    python -m stabilizer_workflow.remedies.ladders            # print docs/remedies.md from the table
    python -m stabilizer_workflow.remedies.ladders --check    # exit 1 if docs/remedies.md is out of date

`TABLE[finding][phase]` is the ordered list of remedies for a finding in that phase of training
(`warmup`, `main`, or `None` where the job does not say). Each remedy names the knob role it turns
(`stabilizer_workflow.execution.job`), how the new value is sized (`Sizing`: from the evidence of the attempts
so far, `stabilizer_workflow.remedies.rates`, or a fixed factor), and the bound it stays within. A reader
finds "what happens after a Diverging in the main phase" in one place: `TABLE["Diverging"]["main"]`.

`stabilizer_workflow.remedies.policy` applies the table: it takes the first remedy whose knob the job
declares, whose sizing gives a new value within its bound, and whose recipe was not tried yet.
Data only here; no decisions. A new finding gets its row below (and a test fails until the docs
are regenerated).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PHASES: tuple[str | None, ...] = ("warmup", "main", None)

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
    """One remedy: turn one knob, within its bounds and the remedy's own limits.

    op, i.e. how the new value is sized: "switch_on" turns an off switch on (normalization); "set"
    writes `value` (clamped to the knob's bounds) only while the knob is off, i.e. 0 (grad_clip);
    "size" sets a learning rate from the evidence (stabilizer_workflow.remedies.rates), within the same limits
    as "scale"; "scale" multiplies by `value` while the result stays within the knob's bounds and
    within [`floor_ratio`, `ceiling_ratio`] times the job's starting value and above `floor`;
    "prefer" moves a choice knob to the value its declaration lists first; "stop_early" ends the
    execution keeping the best checkpoint. `unless` skips the remedy when the job declares that
    role (a better-aimed remedy exists).
    """

    name: str
    op: Literal["switch_on", "set", "size", "scale", "prefer", "stop_early"]
    role: str = ""
    value: Any = None
    floor: float | None = None
    floor_ratio: float | None = None
    ceiling_ratio: float | None = None
    unless: str | None = None
    why: str = ""
    # stop_early only: stop only a run whose summary says it learned (a plateau); a run that never
    # learned goes on to the next remedies.
    needs_learning: bool = False

    @property
    def sizing(self) -> str:
        """How the new value is chosen, in words (the docs' column)."""
        return {
            "switch_on": "switched on",
            "set": f"set to {self.value} while off",
            "size": "from the evidence (below)",
            "scale": f"x{self.value}",
            "prefer": "the declaration's first value",
            "stop_early": "keeps the best checkpoint" + (", only after the run learned" if self.needs_learning else ""),
        }[self.op]

    @property
    def bound(self) -> str:
        """The limits the new value stays within besides the knob's own (the docs' column)."""
        limits = []
        if self.floor_ratio is not None:
            limits.append(f">= {self.floor_ratio:g} x the job's own")
        if self.ceiling_ratio is not None:
            limits.append(f"<= {self.ceiling_ratio:g} x the job's own")
        if self.floor is not None:
            limits.append(f">= {self.floor:g}")
        return ", ".join(limits) or "the knob's bounds"


# --- the remedies ------------------------------------------------------------------------------

# How far below the job's own rate an explosion's remedies may take it. A rate set an order of magnitude
# or three off (Adam at 1 where 1e-3 was meant, a rate typed in the wrong unit) is a mistake people make;
# the job's own probes reach 1/10,000 of it (stabilizer_sentinel.recovery.recovery), and a floor of 1/100
# ended such runs `diverged` or `did_not_learn` at the floor, a remedy short of a rate that trains. Each
# lowering is still sized from the evidence: the floor bounds the ladder, it is not a step of it. The main
# rate a warm-up takes down with it stops at this floor of its own too (rates.main_down_with_the_warmup).
EXPLOSION_RATE_FLOOR = 0.001

ADD_BATCH_NORM = Rung("add_batch_norm", "switch_on", "normalization",
                      why="normalisation bounds the scale of activations, so of residual sums and gradients")
LOWER_WARMUP_LR = Rung("lower_warmup_lr", "size", "warmup_learning_rate", floor_ratio=EXPLOSION_RATE_FLOOR,
                       why="it exploded during warm-up")
LENGTHEN_WARMUP = Rung("lengthen_warmup", "scale", "warmup_length", 2, ceiling_ratio=8,
                       why="it exploded during warm-up, so a warm-up twice as long (a gentler ramp)")
LOWER_LR = Rung("lower_lr", "size", "learning_rate", floor_ratio=EXPLOSION_RATE_FLOOR,
                why="it exploded at its main rate, past any warm-up")
LOWER_LR_WITHOUT_WARMUP_KNOB = Rung(
    "lower_lr", "size", "learning_rate", floor_ratio=EXPLOSION_RATE_FLOOR, unless="warmup_learning_rate",
    why="it exploded during warm-up and no warm-up learning rate is declared")
CLIP_GRADIENTS = Rung("clip_gradients", "set", "grad_clip", 1.0,
                      why="learning-rate remedies are used up; clip the total gradient norm at 1.0")
TIGHTEN_GRAD_CLIP = Rung("tighten_grad_clip", "scale", "grad_clip", 0.5, floor=0.1,
                         why="the clipped run still exploded; halve the clipping norm")
RAISE_BATCH_SIZE = Rung("raise_batch_size", "scale", "batch_size", 2, ceiling_ratio=4,
                        why="the other remedies are used up; a batch twice as large averages out gradient noise")

NORMALIZE_FOR_GRADIENTS = Rung(
    "add_batch_norm", "switch_on", "normalization",
    why="normalisation keeps activations, and so gradients, at a usable scale through depth")
USE_ELU = Rung("use_elu", "prefer", "activation",
               why="the declared preferred activation passes gradient where the current one's units die")
RAISE_LR = Rung("raise_lr", "scale", "learning_rate", 2.0, ceiling_ratio=4,
                why="gradients are tiny but finite; double the learning rate")

# A loss that stops decreasing after the run learned is a plateau: the run has learned what it
# will at this recipe, and more epochs only cost money. Keep the best checkpoint. Whether it
# learned is the summary's word (without a summary: the plateau came after warm-up).
STOP_AT_PLATEAU = Rung("stop_early", "stop_early", needs_learning=True,
                       why="the loss plateaued after the run learned; more epochs would not help")
# A loss that never decreased at all: normalisation, then a smaller step.
NORMALIZE_FOR_PLATEAU = Rung(
    "add_batch_norm", "switch_on", "normalization",
    why="a loss that never decreased is often badly scaled activations; add normalisation")
HALVE_LR = Rung("lower_lr", "scale", "learning_rate", 0.5, floor_ratio=0.01,
                why="the loss is not decreasing; half the learning rate in case it oscillates")

# A loss that never fell, nor rose beyond its noise, in a whole run (NotLearning: the learning check
# calls a run that never learned and rose, or spiked, Diverging instead): its steps were too small to
# move it. A rate that small is most often set an order of magnitude or more off (a unit typed wrong,
# Adam's 1e-3 given to a script that wants 1e-2, a fine-tune's rate left on a fresh network), as a rate
# that explodes is (EXPLOSION_RATE_FLOOR): ten times it, within a hundred times the job's own. Doubling
# left such runs at a rate that barely learned (the calibration corpus's slow plateau at a tenth of its
# healthy rate ended 15 times above the healthy loss at twice it). A rate raised past what the network
# takes explodes, and the explosion's remedies bring it down (in the job, by probing lower rates from
# the state it had reached).
RAISE_LR_FOR_FLAT_LOSS = Rung(
    "raise_lr", "scale", "learning_rate", 10.0, ceiling_ratio=100,
    why="the loss never fell below where it started (nor its chance level) and did not rise: steps too "
        "small to move it, as a rate an order of magnitude off makes them; ten times the learning rate")

STOP_OVERFIT = Rung("stop_early", "stop_early",
                    why="the test loss is rising while the training loss falls; the best model is behind us")


# --- the table ---------------------------------------------------------------------------------

# An explosion. The reference network (ResNet-20, ELU, no batch norm) explodes at LR 0.1 because
# nothing bounds the scale of each residual branch: the sum grows with depth until gradients
# overflow. The original sample spent five jobs halving the warm-up LR (0.1 -> 0.003125) and the
# run still exploded; only batch norm fixed it. Normalisation removes the cause at the intended
# learning rate, so the run also keeps training as fast as intended. So: normalisation first; a
# lower warm-up LR (or a longer warm-up) only for an explosion during warm-up (after it the warm-up
# LR no longer acts); a lower main LR after warm-up, where the phase is unknown, or during a
# warm-up the job has no separate knob for; gradient clipping next (it hides the symptom per step
# and a too-tight clip slows training); a larger batch last (less noise, more memory). Learning
# rates are sized from the evidence, never below 1/1,000 of the job's own (EXPLOSION_RATE_FLOOR).
_EXPLOSION = {
    "warmup": (ADD_BATCH_NORM, LOWER_WARMUP_LR, LENGTHEN_WARMUP, LOWER_LR_WITHOUT_WARMUP_KNOB, CLIP_GRADIENTS,
               TIGHTEN_GRAD_CLIP, RAISE_BATCH_SIZE),
    "main": (ADD_BATCH_NORM, LOWER_LR, CLIP_GRADIENTS, TIGHTEN_GRAD_CLIP, RAISE_BATCH_SIZE),
    None: (ADD_BATCH_NORM, LOWER_LR, CLIP_GRADIENTS, TIGHTEN_GRAD_CLIP, RAISE_BATCH_SIZE),
}
_VANISHING = (NORMALIZE_FOR_GRADIENTS, USE_ELU, RAISE_LR)
_PLATEAU = (STOP_AT_PLATEAU, NORMALIZE_FOR_PLATEAU, HALVE_LR)
_OVERFIT = (STOP_OVERFIT,)


def _every_phase(remedies: tuple[Rung, ...]) -> dict[str | None, tuple[Rung, ...]]:
    return dict.fromkeys(PHASES, remedies)


# finding -> phase -> remedies, in the order they are tried. A finding with no row ends the
# execution ("no remedy is declared"). New findings (a hang, a new rule) add their row here.
TABLE: dict[str, dict[str | None, tuple[Rung, ...]]] = {
    "ExplodingTensor": _EXPLOSION,
    "Diverging": _EXPLOSION,
    "VanishingGradient": _every_phase(_VANISHING),
    "LossNotDecreasing": _every_phase(_PLATEAU),
    "NotLearning": _every_phase((RAISE_LR_FOR_FLAT_LOSS,)),
    "Overfit": _every_phase(_OVERFIT),
    "Overtraining": _every_phase(_OVERFIT),
}


# After an explosion in the same execution, a finding whose row would raise the rate (a loss flat at
# its start or chance level, vanishing gradients: units killed by the explosion's rate, a lowered
# rate still too high for the recipe) is that explosion's aftermath. The rate is never raised back
# (`policy`), so these rows replace the finding's own: its remedies but the raise, then a quarter of
# the rate. A rate sized from the evidence would not do: the attempt that took healthy steps at the
# lowered rate counts it as stable, and the next size would lie above it.
LOWER_LR_AFTER_EXPLOSION = Rung(
    "lower_lr", "scale", "learning_rate", 0.25, floor_ratio=EXPLOSION_RATE_FLOOR,
    why="this execution exploded (an earlier attempt, or a rollback inside a job) and this attempt does not learn "
        "at the lowered rate: the rate is still too high for the recipe; a quarter of it")
AFTER_EXPLOSION: dict[str, tuple[Rung, ...]] = {
    "NotLearning": (LOWER_LR_AFTER_EXPLOSION,),
    "VanishingGradient": (NORMALIZE_FOR_GRADIENTS, USE_ELU, LOWER_LR_AFTER_EXPLOSION),
}


def remedies(finding: str, phase: str | None, *, exploded_before: bool = False) -> tuple[Rung, ...] | None:
    """The remedies for `finding` in `phase`, in order; None when the table has no row for it.
    `exploded_before`: an earlier attempt of the execution exploded, or a job of it rolled back an explosion
    itself (`AFTER_EXPLOSION`)."""
    if exploded_before and finding in AFTER_EXPLOSION:
        return AFTER_EXPLOSION[finding]
    row = TABLE.get(finding)
    return None if row is None else row.get(phase, ())


# --- the docs ----------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs" / "remedies.md"


def markdown() -> str:
    """docs/remedies.md: the table as a reader sees it."""
    lines = [
        "# Remedies of the `default` policy",
        "",
        "Generated from `lambdas/stabilizer_workflow/remedies/ladders.py`",
        "(`python -m stabilizer_workflow.remedies.ladders`); a test fails when this file and the table",
        "differ. Per finding and phase of training, the remedies in the order they are tried: the first",
        "whose knob the job declares, whose new value stays within its bound and whose recipe was not",
        "tried yet is the relaunch. A phase of `-` is a finding whose phase the job did not report. A",
        "finding without a table is not remedied: the execution ends for a person to decide.",
        "",
        "Sized from the evidence (`rates.py`): the last stable and the lowest failing learning rate of",
        "this recipe family (attempts that differ only in their rates). The next rate lies a tenth of",
        "the way from the stable to the failing one in log space, is the stable rate itself once the",
        "two are within 2x, and a quarter of the failing rate while no stable rate is known (a tenth",
        "of it when the failing rate never took five healthy steps: wrecked from its first steps). A",
        "learning rate a remedy would take below its floor is taken to the floor, once; then that",
        "remedy is used up.",
    ]
    for finding, row in TABLE.items():
        lines += ["", f"## {finding}", "", "| phase | # | remedy | knob role | sizing | bound | why |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for phase in PHASES:
            for number, rung in enumerate(row.get(phase, ()), 1):
                role = rung.role or "-"
                if rung.unless:
                    role += f" (unless `{rung.unless}` is declared)"
                cells = [phase or "-", str(number), f"`{rung.name}`", role, rung.sizing, rung.bound, rung.why]
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## After an explosion", "", "When an earlier attempt of the execution exploded (ExplodingTensor,",
              "Diverging), these rows replace the finding's own in every phase: the rate is never raised back.", "",
              "| finding | # | remedy | knob role | sizing | bound | why |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for finding, rungs in AFTER_EXPLOSION.items():
        for number, rung in enumerate(rungs, 1):
            cells = [finding, str(number), f"`{rung.name}`", rung.role or "-", rung.sizing, rung.bound, rung.why]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = markdown()
    if "--check" in argv:
        if not DOCS.is_file() or DOCS.read_text() != text:
            print(f"{DOCS} is out of date: run python -m stabilizer_workflow.remedies.ladders", file=sys.stderr)
            return 1
        return 0
    DOCS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
