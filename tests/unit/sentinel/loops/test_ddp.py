"""DDP under torchrun (gloo, 2 CPU processes): one verdict, at one step, on every rank; one findings file."""

from __future__ import annotations

import re

import pytest

from tests.unit.sentinel.support import FIXTURES, findings, job_env, run, summary

pytestmark = pytest.mark.slow  # two torchrun workers: about 24 s each on a loaded 2-core machine

SCRIPT = FIXTURES / "ddp" / "train.py"


@pytest.mark.long
def test_a_non_finite_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path):
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--tee", "3",
               str(SCRIPT), "--bad-rank", "1", "--bad-step", "5", "--steps", "20"]
    result = run(command, SCRIPT.parent, job_env(tmp_path), timeout=180)  # a rank left in a collective hangs here
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    stopped = re.findall(r"\[default(\d)\]:sentinel stopped the job at step (\d+)", output)
    assert sorted(stopped) == [("0", "5"), ("1", "5")], output
    assert not re.search(r"rank=\d step=([5-9]|\d\d)\b", output), "no rank took the stopped step or any later"
    assert "done" not in output
    (finding,) = findings(tmp_path)  # written by rank 0 alone, holding rank 1's finding
    assert (finding["step"], finding["rank"], finding["tensor"]) == (5, 1, "losses/loss")
    assert (tmp_path / "failure").read_text().startswith("RuleStop: ExplodingTensor at step 5")


def test_a_healthy_ddp_run_finishes_on_every_rank(tmp_path):
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--tee", "3",
               str(SCRIPT), "--bad-rank", "-1", "--steps", "6"]
    result = run(command, SCRIPT.parent, job_env(tmp_path), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"rank=(\d) done", result.stdout)) == ["0", "1"]
    assert findings(tmp_path) == []  # rank 0's file, with the summary of the run
    assert (summary(tmp_path)["ended"], summary(tmp_path)["steps_taken"]) == ("completed", 6)
