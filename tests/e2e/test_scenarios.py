"""The small form of the scenario suite, end to end in local mode, under the `default` policy.

Asserts outcomes, never times: the rule that fired first, the class of the first remedy, the
verdict, and for the scenario that explodes after a rewind copy, that the relaunch resumed from
the checkpoint the first attempt left (the checkpoint name the job wrote is the one the workflow
resumes from: if it could not be found, the second job would fail before training). Also: a rule
list without ExplodingTensor still stops the reference problem at its first non-finite step.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from stabilizer.bench import remediation as bench
from stabilizer.bench.scenarios import by_name

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_sets(digits_channels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return bench.prepare_data_sets(digits_channels["train"].parent, tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("name", [s.name for s in by_name(small=True)])
@pytest.mark.long
def test_small_scenario_gets_the_right_rule_remedy_and_verdict(name, data_sets, tmp_path):
    scenario = by_name([name], small=True)[0]
    row = bench.run_scenario(scenario, "default", data_sets, tmp_path, small=True)
    assert bench.unmet(scenario, row) == [], row
    if scenario.expect.outcome != "succeeded":
        assert row.outcome != "succeeded"
    if scenario.expect.resumes:
        # The relaunch started where the rewind copy left the first attempt, a few steps before
        # the explosion, not at step 0.
        first = row.jobs[0]["steps"]
        assert 0 < row.resumed_at < first["end"] <= row.resumed_at + 2 * 5 + 1
        assert row.jobs[1]["resumed_from"].endswith(f"/checkpoint-{row.resumed_at:08d}.pt")
        log = (Path(row.run_dir) / "jobs" / row.jobs[1]["job"] / "logs" / "training.log").read_text()
        assert f"at step {row.resumed_at}" in log


@pytest.mark.long
def test_a_rule_list_without_exploding_tensor_still_stops_at_the_first_non_finite_step(data_sets, tmp_path):
    from stabilizer.local.engine.deployment import Project
    from stabilizer.local.engine.engine import LocalEngine

    execution_input = {
        "wait_seconds": 1,
        "run_spec": {"warmup_epochs": 0, "num_epochs": 1, "batch_size": 64, "rules": [{"name": "VanishingGradient"}]},
        "limits": {"max_num_retraining": 0},
    }
    with LocalEngine(tmp_path / "run", data_sets["small"], project=Project.discover(ROOT)) as engine:
        record = engine.run(execution_input, name="no-exploding-tensor")
    state = record.state or {}
    # No relaunch allowed, and the gradients went non-finite: the outcome says what is known.
    assert record.status == "FAILED" and state["outcome"] == "diverged"
    [attempt] = state["attempts"]
    # Stopped by the sentinel (exit 86), or by the monitor, which may see findings.json first.
    assert attempt["status"] in ("Failed", "Stopped")
    if attempt["status"] == "Failed":
        assert "RuleStop: ExplodingTensor" in attempt["failure_reason"]
    # Other rules may fire on the same step (the sentinel forces that step's gradients into the store).
    finding = record.attempts[0].findings["findings"][0]
    assert finding["rule"] == "ExplodingTensor" and attempt["finding"]["rule"] == "ExplodingTensor"
    norms = finding["evidence"]["grad_norm_history"]
    # Every step before the finding was finite; the finding's step was the first that was not.
    assert norms[-1][0] == finding["step"] and not math.isfinite(float(norms[-1][1]))
    assert all(math.isfinite(float(value)) for _, value in norms[:-1])
    assert [s for s, _ in norms] == list(range(finding["step"] + 1))
