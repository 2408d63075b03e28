"""Local mode end to end: the project's ASL definition in moto's interpreter, the project's Lambda
handlers in process, and real training jobs of model/train.py as local processes.

Small on purpose: a subset of the digits, batch 64, no warm-up epoch (so the reference network
at LR 0.1 explodes within a few steps whatever the warm-up LR) and a short final run. The
reference problem must explode, be stopped by the sentinel, be relaunched and end succeeded
with batch norm; the history and the notifications must tell the same
story as the state payload.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stabilizer.reports.records import RunRecord

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

# Fast but faithful: the explosion needs no warm-up epoch, and the healthy run stops after 12 steps,
# the fewest in which the learning check can tell that the loss fell (two windows of five and more).
# The check cap is the CLI's local one (at one second per check, the cloud's 300 can end a run on a
# busy machine before its last job finishes). The `original` policy's seven real jobs are the
# remediation benchmark's to run (`python -m stabilizer.bench --policy original`); its ladder is
# tests/unit/workflow/remedies/test_policy.py's, and a relaunch's path through the interpreter
# tests/asl's.
SMALL_RUN = {
    "wait_seconds": 1,
    "run_spec": {"warmup_epochs": 0, "num_epochs": 2, "batch_size": 64, "max_steps": 12, "checkpoint_every": 2},
    "limits": {"max_monitor_transitions": 1500},
}


@pytest.fixture(scope="module")
def small_digits(digits_channels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 512 training and 128 test examples of the offline digits channels."""
    out = tmp_path_factory.mktemp("small-digits")
    for channel, count in (("train", 512), ("test", 128)):
        (out / channel).mkdir()
        for name in ("x.npy", "y.npy"):
            np.save(out / channel / name, np.load(digits_channels[channel] / name)[:count])
    return out


@dataclass
class FollowedRun:
    """One execution as the notebook client saw it, and as the engine recorded it."""

    record: RunRecord
    history: list[dict[str, Any]]
    view: Any
    notes: list[Any]
    findings: dict[str, Any] | None
    trial: Any


@pytest.fixture(scope="module")
def default_run(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> FollowedRun:
    """The default policy on SMALL_RUN, run once for the tests that read it: started and followed
    through the notebook client, whose thread runs the engine's own `follow` (as `engine.run` does)."""
    from stabilizer.client.local_client import LocalClient

    with LocalClient.open(tmp_path_factory.mktemp("default") / "nb", data_dir=small_digits) as client:
        arn = client.start({**SMALL_RUN, "policy": "default"}, name="e2e-default")
        view = client.wait(arn, timeout=300)
        return FollowedRun(record=client.record(arn), history=client.history(arn), view=view,
                           notes=client.notifications(arn), findings=client.findings(arn, 1),
                           trial=client.open_tensor_store(arn, 1))


def check_recovered_with_batch_norm(record: RunRecord, history: list[dict[str, Any]]) -> None:
    state = record.state or {}
    attempts = state["attempts"]
    assert record.status == "SUCCEEDED", (record.error, record.cause)
    assert state["outcome"] == "succeeded"
    assert state["run_spec"]["add_batch_norm"] == 1

    # Every attempt without batch norm exploded and was stopped (by the sentinel, exit 86, or by the
    # monitor, which sees the findings within one poll and may stop the job first), then relaunched.
    *failed, last = attempts
    assert failed, "the reference problem must explode at least once"
    for attempt in failed:
        assert attempt["run_spec"]["add_batch_norm"] == 0
        assert attempt["status"] in ("Failed", "Stopped")
        if attempt["status"] == "Failed":
            assert "RuleStop:" in attempt["failure_reason"]
        assert attempt["finding"]["rule"] == "ExplodingTensor"
        assert attempt["decision"]["action"] == "relaunch"
    assert last["run_spec"]["add_batch_norm"] == 1
    assert last["status"] == "Completed"

    # What the engine observed agrees: the same jobs, the failed ones blew up, the last one stayed finite.
    assert [a.job_name for a in record.attempts] == [a["job_name"] for a in attempts]
    for observed in record.attempts[:-1]:
        assert observed.explosion() is not None
        assert observed.findings is not None
    # The last one found nothing, and its summary says what it was seen to do.
    final = record.attempts[-1].findings
    assert final["findings"] == [] and final["summary"]["ended"] == "completed"
    assert final["summary"]["steps_observed"] == final["summary"]["steps_taken"] == 12
    assert final["summary"]["learned"] is True

    # The interpreter's history: validate, then one launch per attempt, each relaunch after a decision.
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    # After each launch the execution parks until the job ends (or wait_seconds pass).
    assert entered[:3] == ["ValidateInput", "LaunchTrainingJob", "AwaitJobChange"]
    assert entered.count("LaunchTrainingJob") == len(attempts)
    for index, name in enumerate(entered):
        if name == "LaunchTrainingJob" and index > 1:
            assert entered[index - 1] == "DecideNextStep"
    assert entered[-1] == "TrainingSucceeded"
    assert not {"StopJobAndNotify", "NotifyFailure", "RejectInput"} & set(entered)
    assert history[-1]["type"] == "ExecutionSucceeded"

    # One notification per decision: a relaunch per failed attempt naming its rule, then completed.
    by_type: dict[str, list[Any]] = {}
    for note in record.notifications:
        assert note.attributes["execution"] == record.name
        by_type.setdefault(note.event_type, []).append(note)
    relaunches = by_type.get("relaunching", [])
    assert [int(n.attributes["attempt"]) for n in relaunches] == [a["number"] for a in failed]
    assert all(n.attributes["rule"] == "ExplodingTensor" for n in relaunches)
    final = record.notifications[-1]
    assert final.event_type == "completed"
    assert final.attributes["outcome"] == "succeeded"
    assert final.body["outcome"] == "succeeded"


def test_ctrl_c_stops_the_running_job_and_keeps_its_checkpoint(small_digits: Path, tmp_path: Path):
    command = [
        sys.executable,
        "-m",
        "stabilizer.cli",
        "run",
        "--local",
        "--plain",
        "--name",
        "e2e-interrupted",
        "--run-dir",
        str(tmp_path),
        "--data-dir",
        str(small_digits),
        "wait_seconds=1",
        "add_batch_norm=1",
        "num_epochs=5",
        "batch_size=64",
        "checkpoint_every=2",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ)
    )
    jobs = tmp_path / "e2e-interrupted" / "jobs"
    deadline = time.monotonic() + 240
    while not list(jobs.glob("*/checkpoints/checkpoint-*.pt")):
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert time.monotonic() < deadline, "no checkpoint was written in time"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=180)

    assert process.returncode == 130, output
    match = re.search(r"stopped (\S+) \(Stopped\); checkpoint: (\S+)", output)
    assert match, output
    assert Path(match.group(2)).is_file()
    run = json.loads((tmp_path / "e2e-interrupted" / "run.json").read_text())
    assert run["outcome"] == "interrupted"
    assert run["attempts"][0]["status"] == "Stopped"
    assert run["attempts"][0]["job_name"] == match.group(1)
    # Nothing lost on stop: the newest checkpoint holds the step train.py stopped at, its own at SIGTERM (or
    # the periodic one, when the stop came right after one: then this cannot tell them apart).
    stopped = re.search(r"stopped by SIGTERM at step (\d+)", next(jobs.glob("*/logs/training.log")).read_text())
    assert stopped, "train.py did not stop on SIGTERM"
    newest = max(jobs.glob("*/checkpoints/checkpoint-*.pt"), key=lambda path: int(re.findall(r"\d+", path.name)[-1]))
    assert torch.load(newest, weights_only=True)["next_step"] == int(stopped.group(1))


def test_default_policy_adds_batch_norm_after_the_first_explosion_as_the_notebook_client_sees(
        default_run: FollowedRun):
    # One execution, read two ways (it is the longest part of this module: run once, in one test).
    check_recovered_with_batch_norm(default_run.record, default_run.history)
    assert len(default_run.record.attempts) == 2

    view, notes, findings, trial, history = (
        default_run.view, default_run.notes, default_run.findings, default_run.trial, default_run.history)

    assert view.status == "SUCCEEDED"
    assert [a["number"] for a in view.attempts] == [1, 2]
    assert findings["findings"][0]["rule"] == "ExplodingTensor"
    assert notes[-1].event_type == "completed"
    assert history[-1]["type"] == "ExecutionSucceeded"
    # The exploded attempt's tensors, as captured by the job, through the Trial API.
    assert any(name.startswith("gradients/") for name in trial.tensor_names())
