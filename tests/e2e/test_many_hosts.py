"""Jobs on several instances, run locally as docs/many-hosts.md says: two hosts of torchrun each, every
rank rolled back inside the job together; with recovery relaunch, one stop for every rank at one step
and a relaunch that resumes on two hosts; and a hang that is detected, stopped and retried. Tiny
models on CPU over gloo; hang floors of seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]


def run_input(path: Path, run_dir: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    result = subprocess.run(
        [sys.executable, "-m", "stabilizer.cli", "run", "--local", "--plain", "--input", str(path),
         "--run-dir", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )
    [run_json] = run_dir.glob("local-*/run.json")
    return result, json.loads(run_json.read_text())


def host_logs(run_dir: Path, job_name: str) -> dict[str, str]:
    [jobs] = run_dir.glob("local-*/jobs")
    return {log.parts[-3]: log.read_text() for log in sorted((jobs / job_name).glob("algo-*/logs/training.log"))}


def test_the_two_host_example_rolls_every_rank_back_inside_its_one_job(tmp_path):
    result, record = run_input(ROOT / "examples" / "ddp-two-hosts" / "input.json", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = record["state"]
    (attempt,) = state["attempts"]
    assert state["outcome"] == "succeeded" and attempt["finding"] is None
    (rollback,) = attempt["rollbacks"]
    assert rollback["rule"] in ("Diverging", "ExplodingTensor") and rollback["rate_after"] < rollback["rate_before"]
    logs = host_logs(tmp_path, attempt["job_name"])
    done = sorted(rank for text in logs.values() for rank in re.findall(r"rank=(\d) host=algo-\d done", text))
    assert done == ["0", "1", "2", "3"], logs  # every rank of both hosts trained on to the end
    assert "sentinel stopped the job" not in "".join(logs.values())


def test_the_two_host_example_relaunched_stops_every_rank_at_one_step_and_resumes_on_two_hosts(tmp_path):
    given = json.loads((ROOT / "examples" / "ddp-two-hosts" / "input.json").read_text())
    given["job"]["source"] = str(ROOT / "examples" / "ddp-two-hosts")
    given["job"]["recovery"] = "relaunch"
    path = tmp_path / "input.json"
    path.write_text(json.dumps(given))
    result, record = run_input(path, tmp_path / "runs")
    tmp_path = tmp_path / "runs"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = record["state"]
    first, *rest = state["attempts"]
    assert state["outcome"] == "succeeded"
    assert first["finding"]["rule"] in ("Diverging", "ExplodingTensor")
    logs = host_logs(tmp_path, first["job_name"])
    assert sorted(logs) == ["algo-1", "algo-2"]
    stopped = [int(step) for text in logs.values() for step in re.findall(r"sentinel stopped the job at step (\d+)",
                                                                          text)]
    assert len(stopped) == 4 and set(stopped) == {first["finding"]["step"]}, logs  # every rank, one step
    last = rest[-1]
    assert last["status"] == "Completed" and last["resumed_from"]
    relaunched = host_logs(tmp_path, last["job_name"])
    starts = {(host, int(rank), int(start)) for host, text in relaunched.items()
              for rank, start in re.findall(r"rank=(\d) host=algo-\d world=4 start=(\d+)", text)}
    resumed_at = {start for _, _, start in starts}
    assert {(host, rank) for host, rank, _ in starts} == {("algo-1", 0), ("algo-1", 1), ("algo-2", 2), ("algo-2", 3)}
    assert len(resumed_at) == 1 and resumed_at.pop() > 0  # all four ranks, on both hosts, from one checkpoint


def test_a_rank_asleep_on_the_second_host_is_detected_stopped_and_retried(tmp_path):
    job = {
        "source": str(ROOT / "tests" / "fixtures" / "ddp"),
        "entry_point": "hang.py",
        "integration": "library",
        "instance_count": 2,
        "instance_type": "ml.g5.xlarge",  # torch_distributed runs on GPU instances (the SDK's rule)
        "distribution": {"torch_distributed": {"enabled": True}, "processes_per_host": 1},
        "hyperparameters": {"sleep-rank": 1, "sleep-step": 8, "once": 1, "steps": 30},
        "hang": {"floor_seconds": 2, "factor": 10},
    }
    given = tmp_path / "input.json"
    given.write_text(json.dumps({"job": job}))
    result, record = run_input(given, tmp_path / "runs")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = record["state"]
    first, second = state["attempts"]
    assert first["finding"]["rule"] == "Hang" and first["finding"]["step"] == 8
    assert "held up by rank 1 on algo-2" in first["finding"]["message"]
    assert first["decision"]["remedy"] == "retry" and "a hang, not an instability" in first["decision"]["reason"]
    assert second["run_spec"] == first["run_spec"] and second["resumed_from"]
    assert second["status"] == "Completed" and state["outcome"] == "succeeded"
