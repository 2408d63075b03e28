"""The remediation benchmark's arithmetic: steps read from job logs, waste, expectations, the summary."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stabilizer.bench import remediation as bench
from stabilizer.bench.job_logs import JobSteps, job_steps
from stabilizer.bench.scenarios import ALL, SCENARIOS, by_name
from tests.helpers import ROOT

EXPLODED = """training steps=24 steps_per_epoch=8 examples=512 start_step=0
step=9 epoch=1 loss=2.1 lr=3 grad_norm=40
sentinel stopped the job at step 12: gradient norm is non-finite at step 12
"""
RESUMED = """resumed from /opt/ml/input/data/resume/checkpoint-00000010.pt at step 10
training steps=24 steps_per_epoch=8 examples=512 start_step=10
step=19 epoch=2 loss=0.9 lr=1.5 grad_norm=3
eval epoch=3 test_loss=0.8 test_accuracy=0.7
finished steps=24 seconds=20.0 test_accuracy=0.7000
"""


def _state(outcome: str, *, resumed: bool = True) -> dict:
    return {
        "outcome": outcome,
        "run_spec": {"warmup_learning_rate": 0.1, "learning_rate": 1.5, "add_batch_norm": 1, "grad_clip": 0.0},
        "attempts": [
            {"job_name": "j-1", "status": "Failed", "finding": {"rule": "Diverging"},
             "decision": {"remedy": "lower_lr"}},
            {"job_name": "j-2", "status": "Completed", "resumed_from": "s3://b/j-1/checkpoint-00000010.pt" if resumed
             else None},
        ],
    }


def test_steps_of_a_job_come_from_its_log():
    assert job_steps(EXPLODED) == JobSteps(total=24, start=0, end=13)  # step 12 was computed
    assert job_steps(RESUMED).computed == 14
    assert job_steps("stopped by SIGTERM at step 7\n") is None  # never said it started training
    crashed = "training steps=24 steps_per_epoch=8 examples=512 start_step=0\nstep=4 epoch=0 loss=2 lr=1 grad_norm=1\n"
    assert job_steps(crashed).end == 5


def test_a_resumed_recovery_wastes_only_the_steps_after_the_checkpoint():
    scenario = by_name(["bn-lr-30x"])[0]
    row = bench.measure(scenario, "default", _state("succeeded"), [EXPLODED, RESUMED], wall=30.0)
    assert (row.attempts, row.steps_computed, row.clean_steps) == (2, 27, 24)
    assert row.ratio == pytest.approx(27 / 24)
    assert row.wasted_steps == 3  # steps 10, 11 and 12 of the first attempt
    assert row.resumed_at == 10
    assert bench.unmet(scenario, row) == []
    assert row.final_recipe == "warm-up LR 0.1, LR 1.5, BN"


def test_nothing_is_useful_when_no_model_came_out_and_misses_are_named():
    scenario = by_name(["bn-lr-30x"])[0]
    row = bench.measure(scenario, "default", _state("gave_up", resumed=False), [EXPLODED, RESUMED], wall=30.0)
    assert row.wasted_steps == row.steps_computed == 27
    assert bench.unmet(scenario, row) == [
        "outcome gave_up, expected succeeded",
        "the second attempt did not resume from a checkpoint of the first",
    ]


def test_the_summary_names_where_default_uses_more_than_original():
    scenario = by_name(["bn-lr-30x"])[0]
    default = bench.measure(scenario, "default", _state("succeeded"), [EXPLODED, RESUMED], wall=30.0)
    original = bench.measure(scenario, "original", _state("succeeded"), [EXPLODED], wall=10.0)
    lines = bench.summary_lines([default, original])
    assert lines[0].startswith("default: 1 scenarios, 2 attempts, steps 27/24 = 1.12x clean, wasted 3, wall 30 s")
    assert lines[-1] == "default uses more than original on: bn-lr-30x (2 vs 2 attempts, 27 vs 13 steps)"
    assert len(bench.table_lines([default, original])) == 4


def test_earlier_runs_are_reported_together_as_one_table(tmp_path, capsys):
    import json
    from dataclasses import asdict

    scenario = by_name(["bn-lr-30x"])[0]
    default = bench.measure(scenario, "default", _state("succeeded"), [EXPLODED, RESUMED], wall=30.0)
    original = bench.measure(scenario, "original", _state("succeeded"), [EXPLODED], wall=10.0)
    for name, row in (("a", default), ("b", original)):
        (tmp_path / f"{name}.json").write_text(json.dumps([{**asdict(row), "ratio": row.ratio}]))
    assert bench.main(["--report", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "default uses more than original on: bn-lr-30x (2 vs 2 attempts, 27 vs 13 steps)"
    assert sum(line.startswith("bn-lr-30x") for line in printed) == 2


def test_the_suite_covers_what_it_promises():
    names = {s.name for s in SCENARIOS}
    assert len(ALL) >= 10 and len(names) == len(SCENARIOS)
    assert {s.name for s in ALL} - names == {"transformer-digits", "mlp-diabetes"}
    assert {"reference-seed0", "reference-seed1", "reference-seed2", "healthy", "never-learns", "overfits"} <= names
    depths = {s.run_spec.get("depth", 20) for s in SCENARIOS}
    assert min(depths) == 20 and max(depths) == 56
    assert {s.run_spec.get("activation", "elu") for s in SCENARIOS} == {"elu", "relu"}
    assert {s.expect.remedy for s in SCENARIOS} >= {"add_batch_norm", "lower_lr", "lower_warmup_lr", "stop_early"}
    assert [s.name for s in by_name(small=True)] == ["reference-seed0", "bn-lr-30x", "never-learns"]
    with pytest.raises(ValueError, match="unknown scenario"):
        by_name(["nope"])


def test_every_scenario_is_a_valid_execution_input():
    from stabilizer.client.inputs import execution_input_module

    state = execution_input_module()
    for scenario in ALL:
        for small in (False, True) if scenario.small_run_spec is not None else (False,):
            state.parse_execution_input(scenario.execution_input("default", small=small))


def test_steps_of_a_users_script_come_from_its_findings_summary_not_from_its_log():
    log = "step=0 epoch=0 loss=2.3\nsentinel stopped the job at step 7: gradient norm is non-finite\n"
    assert job_steps(log, 69, {"first_step": 0, "last_step": 7, "ended": "rule_stop"}) == JobSteps(
        total=69, start=0, end=8)
    assert job_steps("epoch 3 done\n", 150, {"first_step": 20, "last_step": 149}).computed == 130
    assert job_steps("epoch 3 done\n", 150, None) is None  # unwatched: nothing says what it computed


def test_the_examples_are_scenarios_run_as_their_input_describes():
    (transformer,) = by_name(["transformer-digits"])
    execution_input = transformer.execution_input("default")
    assert execution_input["job"]["entry_point"] == "train.py"
    assert execution_input["job"]["knobs"]["learning_rate"]["hyperparameter"] == "lr"
    # A clean run is `epochs` passes over the train channel's examples in batches of `batch`.
    example = ROOT / "examples" / "transformer-digits"
    described = json.loads((example / "input.json").read_text())["job"]
    with np.load(example / described["channels"]["train"] / "digits.npz") as data:
        examples = len(data["x"])  # train.py iterates over a permutation of len(x)
    hyperparameters = described["hyperparameters"]
    expected = hyperparameters["epochs"] * math.ceil(examples / hyperparameters["batch"])
    assert transformer.clean_steps(execution_input["job"]["hyperparameters"]) == expected
    other = {**hyperparameters, "epochs": 2, "batch": 100}
    assert transformer.clean_steps(other) == 2 * math.ceil(examples / 100)
