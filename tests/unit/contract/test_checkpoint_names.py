"""The checkpoint file name has one home; the workflow resumes from the names the job really wrote."""

from __future__ import annotations

from pathlib import Path

from stabilizer_contract.checkpoints import checkpoint_name, checkpoint_step, newest_checkpoint
from stabilizer_workflow.evidence.observation import observe


def test_names_sort_by_step_as_text_and_parse_back():
    names = [checkpoint_name(step) for step in (9, 10, 100, 0)]
    assert sorted(names) == [checkpoint_name(step) for step in (0, 9, 10, 100)]
    assert [checkpoint_step(name) for name in names] == [9, 10, 100, 0]
    assert checkpoint_step("executions/e/attempt-1/checkpoints/" + checkpoint_name(42)) == 42
    assert checkpoint_step("findings.json") is None


def test_newest_checkpoint_is_the_highest_step(tmp_path: Path):
    for step in (8, 12, 100):
        (tmp_path / checkpoint_name(step)).write_bytes(b"w")
    (tmp_path / "checkpoint-x.pt").write_bytes(b"not one")
    assert newest_checkpoint(tmp_path) == tmp_path / checkpoint_name(100)
    assert newest_checkpoint(tmp_path / "missing") is None


def test_the_monitor_keeps_the_names_the_job_wrote():
    prefix = "executions/e/attempt-1/checkpoints"
    keys = [f"{prefix}/{checkpoint_name(step)}" for step in (4, 12)]
    obs = observe({"TrainingJobName": "j", "TrainingJobStatus": "Completed"}, checkpoint_keys=keys)
    assert obs.checkpoint_steps == [4, 12]
    assert obs.checkpoint_files == {4: checkpoint_name(4), 12: checkpoint_name(12)}


def test_a_step_longer_than_an_int64_is_not_a_checkpoint_so_the_key_kept_in_the_state_is_bounded():
    """The workflow keeps the key it resumes from in its state, whose largest size it bounds with
    ``STEP_DIGITS`` digits (stabilizer_workflow.execution.execution_bounds.largest_state)."""
    from stabilizer_contract.checkpoints import STEP_DIGITS

    assert checkpoint_step(f"checkpoint-{'9' * STEP_DIGITS}.pt") == int("9" * STEP_DIGITS)
    assert checkpoint_step(f"checkpoint-{'0' * (STEP_DIGITS - 1)}7.pt") == 7
    assert checkpoint_step(f"checkpoint-{'9' * (STEP_DIGITS + 1)}.pt") is None
    keys = [f"p/checkpoint-{'1' * 255}.pt", f"p/{checkpoint_name(3)}"]
    obs = observe({"TrainingJobName": "j", "TrainingJobStatus": "Completed"}, checkpoint_keys=keys)
    assert obs.checkpoint_steps == [3]
