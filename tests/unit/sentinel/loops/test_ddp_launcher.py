"""DDP under torchrun with the launcher: an unchanged script, watched on every rank, stopped at one step."""

from __future__ import annotations

import re

import pytest

from tests.unit.sentinel.support import FIXTURES, findings, job_env, run, summary

pytestmark = pytest.mark.slow  # two torchrun workers

SCRIPT = FIXTURES / "ddp" / "unchanged.py"


def test_the_launcher_stops_an_unchanged_ddp_script_on_every_rank_before_the_bad_step(tmp_path):
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--tee", "3",
               "-m", "stabilizer_sentinel.launch", str(SCRIPT), "--bad-rank", "1", "--bad-step", "5", "--steps", "20"]
    result = run(command, SCRIPT.parent, job_env(tmp_path), timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    stopped = re.findall(r"\[default(\d)\]:sentinel stopped the job at step (\d+)", output)
    assert sorted(stopped) == [("0", "5"), ("1", "5")], output
    assert not re.search(r"rank=\d step=([5-9]|\d\d)\b", output), "no rank applied the bad step or any later"
    assert {(f["rule"], f["step"]) for f in findings(tmp_path)} == {("ExplodingTensor", 5)}
    written = summary(tmp_path)
    assert (written["integration"], written["ended"], written["steps_taken"]) == ("launcher", "rule_stop", 5)
