"""``stabilizer run --local`` as a person reads it in a CI log: a header, one line per
notification, the table of attempts, the outcome and where the report is; the notification
bodies are in report.md, not on the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabilizer.cli.commands import EXIT_USAGE, main
from tests.e2e.test_local_mode import small_digits  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def check_plain_output(out: str, run_dir: Path) -> None:
    """What `stabilizer run --local --plain` printed for the quickstart's job (a small fit that
    diverges, then is recovered inside the job, or with job.recovery=relaunch relaunched lower),
    whose run went to `run_dir`; the README's own commands (tests/e2e/test_readme_snippets.py) are
    read with it, so the quickstart runs once each way."""
    lines = out.splitlines()
    if lines and lines[0].startswith("preparing the offline data set"):  # no --data-dir: made first, and said
        lines = lines[1:]
    record = json.loads((run_dir / "run.json").read_text())
    subjects = [n["subject"] for n in record["notifications"]]
    attempts = len(record["attempts"])
    # an "in the job" line under each attempt's row that rolled back
    in_job = sum(bool(a.get("rollbacks")) for a in (record["state"] or {}).get("attempts", []))
    assert attempts >= 2 or in_job, "the quickstart's job diverges and is recovered in it or relaunched"

    assert lines[0] == f"execution {run_dir.name}: job fit.py from examples/quickstart/src; policy default", out
    assert lines[1].startswith("rules ExplodingTensor, VanishingGradient and the sentinel's own Diverging and "
                               "NotLearning (stop when one fires); at most ")
    assert lines[2] == f"run directory: {run_dir}"
    assert lines[3].startswith("source: examples/quickstart/src -> sourcedir.tar.gz, 1 file")
    assert [line.split("] ", 1)[1] for line in lines[4 : 4 + len(subjects)]] == subjects
    # header, subjects, blank, table header and rule, a row and its decision per attempt, blank,
    # outcome, reason, report
    assert len(lines) == 4 + len(subjects) + 1 + 2 + 2 * attempts + in_job + 1 + 3, out
    assert lines[-3].startswith(f"outcome: succeeded (SUCCEEDED) after {attempts} attempt(s)")
    assert lines[-1].startswith(f"report: {run_dir / 'report.md'}")
    assert "Details (JSON)" not in out and '"event_type"' not in out

    report = (run_dir / "report.md").read_text()
    assert report.count("Details (JSON):") == len(subjects)
    for subject in subjects:
        assert f". {subject}" in report


def test_an_input_the_workflow_refuses_prints_its_cause_and_exits_64(
    small_digits: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    # A Trainium instance passes the client's checks; the workflow's ValidateInput refuses it.
    argv = ["run", "--local", "--plain", "--run-dir", str(tmp_path), "--data-dir", str(small_digits)]
    code = main([*argv, "--name", "refused", "instance_type=ml.trn1.2xlarge", "max_steps=1"])
    out = capsys.readouterr().out
    assert code == EXIT_USAGE, out
    assert "task failed: InvalidInput: job.instance_type: ml.trn1.2xlarge carries AWS Trainium" in out
    assert "cause: job.instance_type: ml.trn1.2xlarge carries AWS Trainium/Inferentia chips" in out
    assert "errorType" not in out and "stackTrace" not in out
