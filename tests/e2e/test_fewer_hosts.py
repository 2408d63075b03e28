"""A relaunch after a hang on fewer hosts, when the job allows it (`job.min_instance_count`).

Two hosts of one rank each; the rank on algo-2 falls asleep at step 8 (tests/fixtures/ddp/hang.py),
rank 0's watchdog finds the job held up by it, stops every rank and writes the checkpoint. With
`min_instance_count` 1 the relaunch runs on one host without algo-2, and resumes from that
checkpoint on a world of one rank: DDP's state is the same on every rank, so rank 0's copy fits
any number of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stabilizer.local.engine.deployment import Project
from stabilizer.local.engine.engine import LocalEngine

pytestmark = [pytest.mark.slow, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]


def test_a_host_that_held_up_the_job_is_left_out_of_the_relaunch_which_resumes_on_one_host(digits_channels, tmp_path):
    job = {
        "source": str(ROOT / "tests" / "fixtures" / "ddp"),
        "entry_point": "hang.py",
        "integration": "library",
        "instance_count": 2,
        "min_instance_count": 1,
        "instance_type": "ml.g5.xlarge",  # torch_distributed runs on GPU instances (the SDK's rule)
        "distribution": {"torch_distributed": {"enabled": True}, "processes_per_host": 1},
        "hyperparameters": {"sleep-rank": 1, "sleep-step": 8, "once": 1, "steps": 20},
        "hang": {"floor_seconds": 2, "factor": 10},
    }
    with LocalEngine(tmp_path / "runs", digits_channels["train"].parent, project=Project.discover(ROOT)) as engine:
        record = engine.run({"wait_seconds": 1, "job": job}, name="e2e-fewer-hosts")
        jobs = list(engine.sagemaker.jobs.values())
        counts = [j.request["ResourceConfig"]["InstanceCount"] for j in jobs]
        relaunched = {c.host: c.log_path.read_text() for c in jobs[-1].hosts}
    state = record.state or {}
    first, second = state["attempts"]
    assert first["finding"]["rule"] == "Hang" and "held up by rank 1 on algo-2" in first["finding"]["message"]
    assert first["decision"]["instance_count"] == 1
    assert "on 1 host instead of 2 (without algo-2, which held it up" in first["decision"]["reason"]
    assert counts == [2, 1]
    [log] = relaunched.values()
    [start] = re.findall(r"rank=0 host=algo-1 start=(\d+)", log)
    assert int(start) > 0 and second["resumed_from"]  # rank 0's checkpoint, on a world of one
    assert "rank=0 done" in log and second["status"] == "Completed"
    assert state["outcome"] == "succeeded", state["reason"]
