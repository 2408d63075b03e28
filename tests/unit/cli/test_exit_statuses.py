"""Each outcome of an execution has its own exit status in the CLI, and its name in the report."""

from __future__ import annotations

import pytest

from stabilizer.cli.commands import exit_code
from stabilizer.reports.records import RunRecord
from stabilizer.reports.report import outcome


def _record(status: str, error: str | None, ended: str | None, *, interrupted: bool = False) -> RunRecord:
    return RunRecord(
        execution_arn="arn:aws:states:us-east-1:123456789012:execution:m:e",
        name="e",
        input={},
        status=status,
        error=error,
        state={"outcome": ended, "reason": "why"},
        interrupted=interrupted,
    )


@pytest.mark.parametrize(
    ("status", "error", "ended", "words", "code"),
    [
        ("SUCCEEDED", None, "succeeded", "succeeded", 0),
        ("SUCCEEDED", None, "stopped_early", "stopped early", 0),
        ("FAILED", "TrainingNotRecovered", "unwatched", "unwatched", 3),
        ("FAILED", "TrainingNotRecovered", "unverified", "unverified", 3),
        ("FAILED", "TrainingNotRecovered", "diverged", "diverged", 2),
        ("FAILED", "TrainingNotRecovered", "did_not_learn", "did not learn", 2),
        ("FAILED", "TrainingNotRecovered", "gave_up", "gave up", 2),
        ("FAILED", "TrainingNotRecovered", "failed", "failed", 1),
        ("FAILED", "StateCorrupted", "failed", "failed", 1),
        ("FAILED", "MisconfiguredEnvironment", None, "failed", 1),
        # Refused by the workflow's ValidateInput: bad input, as when the CLI finds it before starting.
        ("FAILED", "InvalidInput", None, "failed", 64),
    ],
)
def test_every_outcome_has_its_exit_status_and_its_words(status, error, ended, words, code):
    record = _record(status, error, ended)
    assert (outcome(record), exit_code(record)) == (words, code)


def test_an_interrupted_run_exits_130_whatever_its_state_says():
    record = _record("ABORTED", None, None, interrupted=True)
    assert (outcome(record), exit_code(record)) == ("interrupted", 130)


def test_the_report_shows_the_evidence_each_verdict_rests_on(tmp_path):
    from stabilizer.reports.report import markdown

    record = _record("FAILED", "TrainingNotRecovered", "unverified")
    record.state["attempts"] = [
        {"number": 1, "job_name": "j-1", "watched": {"integration": "launcher", "steps_taken": 36,
                                                      "steps_observed": 20, "first_loss": 2.3, "last_loss": 0.4,
                                                      "learned": True, "restores": True}},
        {"number": 2, "job_name": "j-2"},
        {"number": 3, "job_name": "j-3", "watched": {"integration": "library", "steps_taken": 3, "steps_observed": 4,
                                                      "first_loss": None, "last_loss": None, "learned": None}},
    ]
    text = markdown(record, [], tmp_path)
    assert "- outcome: **unverified**" in text
    assert ("- attempt 1: watched by the launcher; 20 steps checked, 36 optimizer steps taken; loss 2.3 -> 0.4; "
            "learned; started from scratch; its script can resume from a checkpoint") in text
    assert "- attempt 2: no summary" in text
    # A rule stop checks the loss of a step it never takes; what was not seen is said, never "None".
    assert ("- attempt 3: watched by the library; 4 steps checked, 3 optimizer steps taken; no loss seen; "
            "learning not judged (too few steps); started from scratch; its script cannot resume from a "
            "checkpoint") in text
    assert "None" not in text.split("## Evidence")[1].split("##")[0]
