"""A straggler reaches the person and the record: two ranks on one host, rank 1 slower than rank 0 in
every step (tests/fixtures/ddp/hang.py --slow-rank); rank 0's watchdog writes stragglers.json, the
monitor reads it from S3, tells the straggler with its rank and host once, and the attempt keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stabilizer.local.engine.deployment import Project
from stabilizer.local.engine.engine import LocalEngine

pytestmark = [pytest.mark.slow, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]


def test_a_straggler_is_told_with_its_rank_and_host_and_kept_on_the_attempt(digits_channels, tmp_path):
    job = {
        "source": str(ROOT / "tests" / "fixtures" / "ddp"),
        "entry_point": "hang.py",
        "integration": "library",
        "instance_type": "ml.g5.xlarge",  # torch_distributed runs on GPU instances (the SDK's rule)
        "distribution": {"torch_distributed": {"enabled": True}, "processes_per_host": 2},
        "hyperparameters": {"sleep-rank": -1, "slow-rank": 1, "slow-seconds": 0.15, "steps": 40},
        "hang": {"floor_seconds": 3, "straggler_factor": 2},
    }
    with LocalEngine(tmp_path / "runs", digits_channels["train"].parent, project=Project.discover(ROOT)) as engine:
        record = engine.run({"wait_seconds": 1, "job": job}, name="e2e-straggler")
    [attempt] = (record.state or {})["attempts"]
    assert [(s["rank"], s["host"]) for s in attempt["stragglers"]] == [(1, "algo-1")]
    told = [note for note in record.notifications if "rank 1 on algo-1 is" in note.message]
    assert len(told) == 1, [note.subject for note in record.notifications]  # once per attempt
    assert attempt["status"] == "Completed"  # a straggler slows the job; it does not stop it
