"""Training in child processes under the launcher (stabilizer_sentinel.loops.worker_processes): Hogwild! in
``torch.multiprocessing`` processes, each started by spawn, fork or forkserver, is watched; a watched
loop's DataLoader workers write nothing. Before, such a run ended with no findings.json: unwatched."""

from __future__ import annotations

import json

import pytest

from stabilizer_sentinel.loops import worker_processes
from tests.helpers import in_make_test_all
from tests.unit.sentinel.support import FIXTURES, job_env, run

SCRIPT = FIXTURES / "processes" / "hogwild.py"


def _launch(tmp_path, *args: str):
    result = run(["-m", "stabilizer_sentinel.launch", str(SCRIPT), *args], SCRIPT.parent, job_env(tmp_path),
                 timeout=240)
    checkpoints = tmp_path / "checkpoints"
    document = json.loads((checkpoints / "findings.json").read_text()) if (checkpoints / "findings.json").exists() \
        else None
    return result, document


@pytest.mark.slow
@pytest.mark.parametrize("start", ["spawn", *in_make_test_all("fork", "forkserver")])  # make test forks below
def test_hogwild_workers_are_watched_whatever_starts_them(tmp_path, start):
    result, document = _launch(tmp_path, "--start", start, "--processes", "2", "--steps", "30")
    assert result.returncode == 0, result.stderr
    assert "exit codes [0, 0]" in result.stdout
    assert result.stderr == ""  # a healthy run prints nothing of ours
    assert document is not None, "no findings.json: the workers were not watched"
    assert (document["processes"], document["findings"]) == (2, [])
    summary = document["summary"]
    assert (summary["integration"], summary["ended"], summary["learned"]) == ("launcher", "completed", True)
    assert (summary["steps_taken"], summary["steps_observed"]) == (60, 60)


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", *in_make_test_all("spawn")])  # make test spawns Hogwild above
def test_a_worker_that_diverges_stops_itself_and_its_finding_is_the_jobs(tmp_path, start):
    result, document = _launch(tmp_path, "--start", start, "--processes", "2", "--steps", "20", "--lr", "20")
    assert "exit codes [86, 86]" in result.stdout, result.stderr  # each left as a rank does
    assert document is not None
    stops = [entry for entry in document["findings"] if entry["action"] == "stop"]
    parts = {part.stem for part in (tmp_path / "checkpoints" / worker_processes.PARTS).glob("*.json")}
    assert stops and {entry["process"] for entry in stops} <= parts
    assert document["summary"]["ended"] == "rule_stop"
    assert (tmp_path / "failure").read_text().startswith("RuleStop: ")


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", *in_make_test_all("spawn")])
def test_the_dataloader_workers_of_a_watched_loop_write_nothing(tmp_path, start):
    result, document = _launch(tmp_path, "--in-parent", "--loader-workers", "2", "--start", start, "--steps", "30")
    assert result.returncode == 0, result.stderr
    assert document is not None
    assert "processes" not in document and not (tmp_path / "checkpoints" / worker_processes.PARTS).exists()
    assert (document["summary"]["steps_observed"], document["summary"]["learned"]) == (30, True)
    # Nor do they say anything: the second pass's workers, forked after the hooks attached, each said the run was
    # not watched as they ended (stop 72's hunt: ten such lines beside a summary that learned).
    assert "not watched" not in result.stderr


def test_the_command_lines_of_multiprocessing_children_are_told_apart():
    spawned = ["-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
               "--multiprocessing-fork"]
    server = ["-c", "from multiprocessing.forkserver import main; main(7, 8, ['__main__'], **{})"]
    tracker = ["-c", "from multiprocessing.resource_tracker import main;main(5)"]
    assert worker_processes.is_worker_command(spawned)
    assert worker_processes.is_worker_command(["-u", *server])
    assert not worker_processes.is_worker_command(tracker)
    assert not worker_processes.is_worker_command(["train.py", "--lr", "0.1"])
    assert not worker_processes.is_worker_command(["-c"])


def _summary(**values):
    base = {"integration": "launcher", "ended": "completed", "exception": None, "steps_taken": 10,
            "steps_observed": 10, "steps_skipped": 0, "first_step": 0, "last_step": 9, "first_loss": 2.0,
            "last_loss": 1.0, "best_loss": 0.9, "learned": True}
    return {**base, **values}


def test_the_merged_summary_hides_no_process_that_went_wrong():
    healthy, diverged = _summary(), _summary(ended="rule_stop", last_loss="inf", learned=None, steps_observed=4,
                                             steps_taken=4, last_step=3)
    merged = worker_processes.merged_summary([healthy, diverged])
    assert (merged["ended"], merged["last_loss"], merged["learned"]) == ("rule_stop", "inf", None)
    counted = (merged["steps_taken"], merged["steps_observed"], merged["first_step"], merged["last_step"])
    assert counted == (14, 14, 0, 9)
    stalled = worker_processes.merged_summary([healthy, _summary(learned=False, last_loss=2.1)])
    assert stalled["learned"] is False
    running = worker_processes.merged_summary([healthy, _summary(ended=None)])
    assert running["ended"] is None  # one process still runs: the run has not ended
    assert worker_processes.merged_summary([healthy]) == healthy


def test_the_merged_document_names_each_findings_process():
    parts = [{"version": 2, "job_action": "stop", "process": "12", "summary": _summary(),
              "findings": [{"rule": "Diverging", "step": 6}]},
             {"version": 2, "job_action": "stop", "process": "entry-point", "findings": []}]
    document = worker_processes.merged(parts)
    assert document["findings"] == [{"rule": "Diverging", "step": 6, "process": "12"}]
    assert (document["processes"], document["job_action"], document["summary"]) == (2, "stop", _summary())
