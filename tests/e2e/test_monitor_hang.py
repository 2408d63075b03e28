"""A job whose process froze is seen by the monitor, from the job's metric stream alone.

The script (tests/e2e/fixtures/frozen_job) logs its loss, then stops itself with SIGSTOP: no
watchdog of its own runs (hang floor 0), so nothing in the job can act. Its loss lines reach the
local CloudWatch as SageMaker sends them; the monitor finds the stream silent for longer than
`hang.monitor_seconds`, calls it a Hang, stops the job and ends the execution (no relaunch is
allowed here, to keep the test short).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stabilizer.local.engine.deployment import LocalSettings, Project
from stabilizer.local.engine.engine import LocalEngine

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIR = Path(__file__).resolve().parent / "fixtures" / "frozen_job"


def test_a_frozen_job_is_detected_by_the_monitor_from_its_metric_stream_and_stopped(digits_channels, tmp_path):
    execution_input = {
        "wait_seconds": 1,
        "job": {
            "source": str(SCRIPT_DIR),
            "entry_point": "freeze.py",
            "hyperparameters": {"steps": 20, "freeze-at": 10},
            "metric_definitions": [{"Name": "train:loss", "Regex": r"loss=(\S+)"}],
            "loss_metric": "train:loss",
            "hang": {"floor_seconds": 0, "monitor_seconds": 3, "relaunches": 0},
        },
    }
    settings = LocalSettings(stop_grace_seconds=2)
    with LocalEngine(tmp_path / "runs", digits_channels["train"].parent, project=Project.discover(ROOT),
                     settings=settings) as engine:
        record = engine.run(execution_input, name="e2e-frozen-job")
        [job] = engine.sagemaker.jobs.values()
        log = job.log_path.read_text()
        stop_requested = next(t["StartTime"] for t in job.transitions if t["Status"] == "Stopping")
    state = record.state or {}
    [attempt] = state["attempts"]
    assert attempt["finding"]["rule"] == "Hang", attempt
    assert "no train:loss line in its metric stream for" in attempt["finding"]["message"]
    assert attempt["status"] == "Stopped"  # the monitor stopped it: the job did not stop itself
    assert "a hang, not an instability" in attempt["decision"]["reason"]
    assert state["outcome"] == "gave_up" and "job.hang.relaunches is 0" in state["reason"]
    frozen_at = float(re.search(r"freezing at=([\d.]+)", log).group(1))
    assert "step=10 " not in log  # it never logged again
    seconds = stop_requested.timestamp() - frozen_at
    print(f"frozen -> StopTrainingJob: {seconds:.1f} s")
    assert 3 <= seconds < 30, seconds
