"""The scenario suite of the remediation benchmark: unstable and healthy recipes, defined in code.

A scenario is one recipe of the reference job (an execution input's `run_spec`, and its rule list
where it needs one) on one of the offline data sets, plus what a right answer looks like under the
`default` policy: the rule that must fire first, the class of the first remedy, and the verdict
the execution must end with. `python -m stabilizer.bench` runs every scenario with every policy;
`tests/e2e/test_scenarios.py` runs the small form and asserts those expectations (outcomes, never
times).

Every scenario is built on the reference recipe (ResNet-20, ELU, no batch norm, SGD momentum 0.9,
warm-up LR 0.1 for one epoch, then LR 0.1) and changes only what its name says. To keep runs
small on a laptop they train on a 512-example subset of the offline digits set with batch 64
(8 steps per epoch) for 3 epochs; `small()` shrinks them further for CI. Where a scenario says
"explodes at step N", N was seen on that data with seed 0 (model/train.py, the sentinel's finite
check); the others state the intent and the benchmark shows what happens.

Scenario: what is wrong; under `default`, first rule -> first remedy -> verdict. `Diverging` is
the sentinel's stop at a loss ten times where the run started, before it overflows (an explosion
that comes within the first five steps, before the first window closes, is `ExplodingTensor`).

- reference-seed0/1/2: no normalisation: the residual sum grows until gradients overflow, in warm-up.
  ExplodingTensor -> add_batch_norm -> succeeded.
- relu-no-bn: the same with ReLU at LR 0.3.
  ExplodingTensor -> add_batch_norm -> succeeded.
- deep-32-no-bn: depth 32, LR 0.2: deeper, so it explodes sooner.
  ExplodingTensor -> add_batch_norm -> succeeded.
- deep-56-no-bn: depth 56 at the reference LR.
  ExplodingTensor -> add_batch_norm -> succeeded.
- after-warmup-no-bn: a gentle warm-up (LR 0.003125) survives, the main LR 0.1 explodes after it.
  Diverging -> add_batch_norm -> succeeded.
- bn-lr-2x: batch norm, but LR 2.0 after warm-up, twice what trains (1.0); overflows at step 13.
  Diverging -> lower_lr (resumes) -> succeeded.
- bn-lr-30x: batch norm, LR 3.0 after warm-up, 30x the reference; overflows at step 12.
  Diverging -> lower_lr (resumes) -> succeeded.
- bn-warmup-30x: batch norm, warm-up LR 3.0: explodes during warm-up.
  ExplodingTensor -> lower_warmup_lr -> succeeded.
- relu-bn-lr-20x: batch norm and ReLU, LR 2.0 after warm-up.
  Diverging -> lower_lr (resumes) -> succeeded.
- healthy: batch norm at the reference LR: nothing is wrong.
  no finding, one attempt -> succeeded.
- never-learns: learning rates of 1e-9: finite, but the loss never falls.
  NotLearning -> raise_lr (twice: 1e-9 raised a hundredfold is still far too low) -> did_not_learn.
- overfits: 64 training examples for 30 epochs, with the Overfit rule.
  Overfit -> stop_early -> stopped_early.

The two bring-your-own-code examples (`examples/`), run as their `input.json` describes them, with
the knobs they declare (`BRING_YOUR_OWN_CODE`):

- transformer-digits: a user's Transformer through the library (three lines), SGD at lr 0.25,
  which diverges within the first epoch.
  Diverging -> lower_lr -> succeeded.
- mlp-diabetes: an unchanged regression script through the launcher, step size 1.2, which
  overflows within ten iterations; its one knob is the learning rate.
  Diverging -> lower_lr -> succeeded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stabilizer.local.checkout import project_root

# Data sets the benchmark prepares from the offline digits (train examples, test examples).
DATA_SETS = {"small": (512, 128), "tiny": (64, 128)}

# What every scenario shares: 3 epochs at batch 64 on `small` is 24 steps; checkpoints are sparse
# (as in a real job) so that a close resume comes from the rewind, not from a periodic checkpoint.
BASE_RUN_SPEC: dict[str, Any] = {"batch_size": 64, "num_epochs": 3, "checkpoint_every": 50}
EXPLODING = {"name": "ExplodingTensor", "parameters": {"collection_names": "gradients", "only_nan": "False"}}


@dataclass(frozen=True)
class Expect:
    """A right answer under the `default` policy."""

    rule: str | None  # the rule of the first attempt's finding; None: no finding at all
    remedy: str | None  # the first decision's remedy; None: the execution ends without one
    outcome: str  # the execution's outcome
    resumes: bool = False  # the second attempt resumes from a checkpoint of the first


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run_spec: dict[str, Any]
    expect: Expect
    data: str = "small"
    limits: dict[str, Any] = field(default_factory=dict)
    small_run_spec: dict[str, Any] | None = None  # the CI-sized form's changes; None: not in it
    # A bring-your-own-code scenario: the directory under examples/ whose input.json it runs (its
    # `run_spec` then changes that job's hyperparameters), and the steps of one clean run of a
    # recipe (the user's script does not say; the reference script logs it).
    example: str | None = None
    clean_steps: Callable[[dict[str, Any]], int] | None = None

    def execution_input(self, policy: str, *, small: bool = False) -> dict[str, Any]:
        limits = {"max_num_retraining": 8, "max_monitor_transitions": 1500, **self.limits}
        if self.example is not None:
            from stabilizer.client.inputs import localize_job

            directory = EXAMPLES / self.example
            data = json.loads((directory / "input.json").read_text())
            data["job"]["hyperparameters"].update(self.run_spec)
            return {**localize_job(data, directory), "policy": policy, "wait_seconds": 1, "limits": limits}
        spec = {**BASE_RUN_SPEC, **self.run_spec}
        if small:
            if self.small_run_spec is None:
                raise ValueError(f"scenario {self.name} has no small form")
            spec.update(self.small_run_spec)
        return {"policy": policy, "wait_seconds": 1, "run_spec": spec, "limits": limits}


def _reference(seed: int) -> Scenario:
    return Scenario(
        f"reference-seed{seed}",
        "the reference problem: ResNet-20, ELU, no batch norm, warm-up LR 0.1 then 0.1; explodes in warm-up",
        {"seed": seed},
        Expect("ExplodingTensor", "add_batch_norm", "succeeded"),
        # No warm-up epoch in the small form: it explodes within a few steps either way. Two epochs
        # (16 steps): the learning check needs more than one epoch of 8 to say the relaunch learned.
        small_run_spec={"warmup_epochs": 0, "num_epochs": 2} if seed == 0 else None,
    )


SCENARIOS: tuple[Scenario, ...] = (
    _reference(0),
    _reference(1),
    _reference(2),
    Scenario(
        "relu-no-bn",
        "ReLU instead of ELU, no batch norm, LR 0.3: explodes in warm-up",
        {"activation": "relu", "warmup_learning_rate": 0.3, "learning_rate": 0.3},
        Expect("ExplodingTensor", "add_batch_norm", "succeeded"),
    ),
    Scenario(
        "deep-32-no-bn",
        "depth 32, no batch norm, LR 0.2: explodes in warm-up",
        {"depth": 32, "warmup_learning_rate": 0.2, "learning_rate": 0.2},
        Expect("ExplodingTensor", "add_batch_norm", "succeeded"),
    ),
    Scenario(
        "deep-56-no-bn",
        "depth 56, no batch norm, the reference LR 0.1: explodes in warm-up",
        {"depth": 56},
        Expect("ExplodingTensor", "add_batch_norm", "succeeded"),
    ),
    Scenario(
        "after-warmup-no-bn",
        "no batch norm; a gentle warm-up (LR 0.003125) survives, the main LR 0.1 explodes after it",
        {"warmup_learning_rate": 0.003125},
        Expect("Diverging", "add_batch_norm", "succeeded"),
    ),
    Scenario(
        "bn-lr-2x",
        "batch norm, LR 2.0 after warm-up (twice LR 1.0, which trains): explodes at step 13",
        {"add_batch_norm": 1, "learning_rate": 2.0},
        Expect("Diverging", "lower_lr", "succeeded", resumes=True),
    ),
    Scenario(
        "bn-lr-30x",
        "batch norm, LR 3.0 after warm-up (30x the reference): explodes at step 12, after a rewind copy",
        {"add_batch_norm": 1, "learning_rate": 3.0},
        Expect("Diverging", "lower_lr", "succeeded", resumes=True),
        small_run_spec={"num_epochs": 2},
    ),
    Scenario(
        "bn-warmup-30x",
        "batch norm, warm-up LR 3.0 (30x the reference): explodes during warm-up",
        {"add_batch_norm": 1, "warmup_learning_rate": 3.0},
        Expect("ExplodingTensor", "lower_warmup_lr", "succeeded"),
    ),
    Scenario(
        "relu-bn-lr-20x",
        "batch norm and ReLU, LR 2.0 after warm-up: explodes after warm-up",
        {"add_batch_norm": 1, "activation": "relu", "learning_rate": 2.0},
        Expect("Diverging", "lower_lr", "succeeded", resumes=True),
    ),
    Scenario(
        "healthy",
        "batch norm at the reference LR 0.1: nothing is wrong, one attempt",
        {"add_batch_norm": 1},
        Expect(None, None, "succeeded"),
    ),
    Scenario(
        "never-learns",
        "batch norm, learning rates of 1e-9 and no warm-up: finite, but the loss never falls",
        {"add_batch_norm": 1, "warmup_epochs": 0, "warmup_learning_rate": 1e-9, "learning_rate": 1e-9,
         "num_epochs": 6},
        Expect("NotLearning", "raise_lr", "did_not_learn"),  # raised tenfold twice: still far too low
        small_run_spec={"num_epochs": 2},  # 16 steps: shorter than the patience, judged at its end
    ),
    Scenario(
        "overfits",
        "64 training examples, 30 epochs at batch 32 with the Overfit rule: the test loss parts from the training loss",
        {"add_batch_norm": 1, "batch_size": 32, "num_epochs": 30, "checkpoint_every": 4,
         "rules": [EXPLODING, {"name": "Overfit", "parameters": {"start_step": "10", "patience": "2"}}]},
        Expect("Overfit", "stop_early", "stopped_early"),
        data="tiny",
    ),
)

EXAMPLES = project_root() / "examples"


def _transformer_steps(hyperparameters: dict[str, Any]) -> int:
    """examples/transformer-digits: `epochs` passes over its training set in batches of `batch`."""
    import numpy as np

    with np.load(EXAMPLES / "transformer-digits" / "data" / "train" / "digits.npz") as data:
        examples = len(data["y"])
    return int(hyperparameters["epochs"]) * math.ceil(examples / int(hyperparameters["batch"]))


BRING_YOUR_OWN_CODE: tuple[Scenario, ...] = (
    Scenario(
        "transformer-digits",
        "a user's Transformer through the library, SGD at lr 0.25: diverges in the first epoch",
        {},
        Expect("Diverging", "lower_lr", "succeeded"),
        example="transformer-digits",
        clean_steps=_transformer_steps,
    ),
    Scenario(
        "mlp-diabetes",
        "an unchanged regression script through the launcher, step size 1.2: overflows within ten iterations",
        {},
        Expect("Diverging", "lower_lr", "succeeded"),
        example="mlp-diabetes",
        clean_steps=lambda hyperparameters: int(hyperparameters["n_iters"]),
    ),
)

ALL: tuple[Scenario, ...] = SCENARIOS + BRING_YOUR_OWN_CODE


def by_name(names: list[str] | None = None, *, small: bool = False) -> list[Scenario]:
    """The scenarios named (all when None), in suite order; only those with a small form if `small`."""
    pool = [s for s in ALL if s.small_run_spec is not None] if small else list(ALL)
    if not names:
        return pool
    known = {s.name: s for s in pool}
    unknown = [name for name in names if name not in known]
    if unknown:
        form = "small " if small else ""
        raise ValueError(f"--scenarios: unknown {form}scenario(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return [s for s in pool if s.name in names]
