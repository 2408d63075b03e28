"""The README's own job example and SDK snippet, taken from README.md and run as written.

A newcomer copies these first. The job example is `examples/quickstart/input.json` (an unchanged
script: no `watch()`, no `integration`), and the SDK snippet hands an Estimator of that script to
the local client. Each starts from a learning rate at which gradient descent diverges, so each
must be seen and fixed at a lower rate, inside the job by default or by a relaunch with
`job.recovery=relaunch`: never "succeeded" over a loss that went to infinity with nothing done. The
relaunched form is in the long tier: `tests/e2e/test_local_mode.py` takes the relaunch path through
local mode in `make test`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli_output import check_plain_output

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def block(section: str, language: str) -> str:
    """The first ```language block after the heading `section`."""
    start = README.index(section)
    found = re.search(rf"```{language}\n(.*?)```", README[start:], flags=re.S)
    assert found, f"no {language} block under {section!r}"
    return found.group(1)


def test_the_readme_job_example_is_the_quickstart_input():
    assert json.loads(block("## Your own training job", "json")) == json.loads(
        (ROOT / "examples" / "quickstart" / "input.json").read_text())


def _quickstart(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run(
        [sys.executable, "-m", "stabilizer.cli", "run", "--local", "--plain",
         "--input", "examples/quickstart/input.json", *extra, "--run-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    [run_json] = tmp_path.glob("local-*/run.json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_plain_output(result.stdout, run_json.parent)  # what a person reads in a CI log
    return result, json.loads(run_json.read_text())["state"]


def test_the_readme_job_example_diverges_and_is_recovered_inside_the_one_job(tmp_path):
    result, state = _quickstart(tmp_path)
    assert state["outcome"] == "succeeded"
    [only] = state["attempts"]
    assert only["status"] == "Completed" and only["finding"] is None and only["run_spec"]["lr"] == 1.6
    first = only["rollbacks"][0]
    assert first["rule"] in ("Diverging", "ExplodingTensor") and first["rate_after"] < 1.6
    assert "in the job: 1 rollback" in result.stdout or "in the job: 2 rollbacks" in result.stdout


@pytest.mark.long
def test_the_readme_job_example_relaunched_is_stopped_and_relaunched_lower(tmp_path):
    _, state = _quickstart(tmp_path, "job.recovery=relaunch")
    assert state["outcome"] == "succeeded"
    first, *rest = state["attempts"]
    assert first["finding"] is not None and first["status"] != "Completed" and not first["rollbacks"], first
    assert rest and rest[-1]["status"] == "Completed"
    assert rest[-1]["run_spec"]["lr"] < first["run_spec"]["lr"] == 1.6


def test_the_readme_sdk_snippet_runs_locally_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("sagemaker")
    snippet = block("### From the SageMaker Python SDK", "python")
    shutil.copytree(ROOT / "examples" / "quickstart", tmp_path / "examples" / "quickstart")
    monkeypatch.chdir(tmp_path)
    # The README says the SDK needs a region; no credentials and no AWS call are needed locally.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # the README's own code
    view = namespace["view"]
    state = view.state or {}
    assert view.status == "SUCCEEDED", (view.error, view.cause, state.get("reason"))
    assert state["outcome"] == "succeeded"
    [only] = view.attempts  # recovered inside the one job
    assert only["run_spec"]["lr"] == 1.6 and only["rollbacks"][-1]["rate_after"] < 1.6
    # What the README says the snippet prints (the comment under its print).
    said = re.search(r"^# (succeeded \[.*\]):", snippet, flags=re.M)
    assert said is not None and said.group(1) in capsys.readouterr().out
