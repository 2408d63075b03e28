"""The two bring-your-own-code examples, run exactly as their READMEs say.

`stabilizer run --local --input examples/<name>/input.json` in a fresh run directory: each example
starts from a recipe that diverges, the sentinel stops the first attempt at its first non-finite
step, and the default policy fixes it through the knob the example declares, in the example's own
hyperparameter names. One is a plain loop with the library's three lines, the other an unchanged
script run through the launcher, whose loss comes from the log line its metric definition matches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import in_make_test_all

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, run_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    result = subprocess.run(
        [sys.executable, "-m", "stabilizer.cli", "run", "--local", "--plain",
         "--input", f"examples/{name}/input.json", "--run-dir", str(run_dir), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )
    [run_json] = run_dir.glob("local-*/run.json")
    return result, json.loads(run_json.read_text())


@pytest.mark.parametrize(
    ("name", "knob", "integration", "rule"),
    # Both diverge; the sentinel stops each at its first loss ten times its start, before the overflow.
    # Both in `make test-all`; `make test` runs the quickstart's job (tests/e2e/test_readme_snippets.py).
    in_make_test_all(("mlp-diabetes", "step_size", "launcher", "Diverging"),
                     ("transformer-digits", "lr", "library", "Diverging")),
)
def test_example_explodes_is_stopped_and_is_fixed_through_its_knob(tmp_path, name, knob, integration, rule):
    example = json.loads((ROOT / "examples" / name / "input.json").read_text())
    assert example["job"]["integration"] == integration
    assert example["job"]["knobs"]["learning_rate"]["hyperparameter"] == knob

    # One example runs strict: every AWS call judged by the synthesized IAM, as AWS would. Both relaunch
    # (job.recovery relaunch): the path through the knob; the quickstart shows the in-job one.
    strict = name == "transformer-digits"
    result, record = run_example(name, tmp_path, "job.recovery=relaunch", *(["--strict"] if strict else []))

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = record["state"]
    assert state["outcome"] == "succeeded"
    first, *rest = state["attempts"]
    assert first["finding"]["rule"] == rule
    # The sentinel ends the job itself (Failed, RuleStop) unless the monitor's StopTrainingJob
    # came first (Stopped); either way it never completed.
    assert first["status"] in ("Stopped", "Failed")
    assert first["decision"]["changes"][knob][1] < first["decision"]["changes"][knob][0]
    # The relaunch changed only the declared knob, in the script's own hyperparameter name.
    assert {key for key in first["decision"]["changes"]} == {knob}
    assert rest and rest[-1]["status"] == "Completed" and rest[-1]["finding"] is None
    assert rest[-1]["run_spec"][knob] < first["run_spec"][knob]
    if strict:
        check_strict_run(result.stdout, next(tmp_path.glob("local-*/iam-calls.tsv")), rest[0]["resumed_from"])


def check_strict_run(stdout: str, calls: Path, resumed_from: str | None) -> None:
    """Nothing denied, every principal seen, and the relaunch's check of its resume channel among them."""
    assert " 0 denied: " in stdout, stdout[-3000:]
    rows = [line.split("\t") for line in calls.read_text().splitlines()[1:]]
    assert {row[3] for row in rows} == {"allowed"}
    assert {row[0] for row in rows} == {
        "TrainFunction", "MonitorFunction", "WatchFunction", "StateMachine", "SageMakerExecutionRole"}
    assert resumed_from, "the relaunch resumes from the rewind's checkpoint"
    prefix = resumed_from.split("/", 3)[3]
    assert any(row[0] == "TrainFunction" and row[1] == "s3:ListBucket" and f"s3:prefix={prefix}]" in row[2]
               for row in rows)
