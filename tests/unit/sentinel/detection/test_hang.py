"""A loop that stops taking steps is a Hang: the watchdog thread notices it without the stuck thread's
help, names the rank that holds the others up, records the finding and ends the job (status 86), long
before any collective timeout. Floors of seconds keep the tests short; the defaults are minutes."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.helpers import in_make_test_all
from tests.unit.sentinel.support import FIXTURES, findings, job_env, rank_output, run, torchrun

pytestmark = pytest.mark.slow  # every test runs a looping script as its own process

SCRIPT = FIXTURES / "ddp" / "hang.py"
FLOOR = 2.0
BOUNDS = {"STABILIZER_HANG_FLOOR_SECONDS": str(FLOOR), "STABILIZER_HANG_FACTOR": "10"}


def slept_at(output: str) -> float:
    return float(re.search(r"sleeping at=(\d+\.\d+)", output).group(1))


def test_a_rank_asleep_in_its_loop_is_a_hang_and_every_rank_is_stopped(tmp_path):
    command = [*torchrun(tmp_path / "logs"), str(SCRIPT), "--sleep-rank", "1", "--sleep-step", "8"]
    result = run(command, SCRIPT.parent, job_env(tmp_path, **BOUNDS), timeout=120)  # not the sleep's 120 s
    ended = time.time()
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "done" not in output
    (finding,) = findings(tmp_path)  # rank 0 records it, naming the sleeper
    assert (finding["rule"], finding["step"], finding["tensor"]) == ("Hang", 8, "steps/rank1")
    assert "held up by rank 1 on algo-1 at step 8 (before its forward pass)" in finding["message"]
    assert finding["value"] >= FLOOR
    assert (tmp_path / "failure").read_text().startswith("RuleStop: Hang at step 8: no optimizer step for")
    # Both ranks were ended by their own watchdog, not by the other's crash.
    said = rank_output(tmp_path / "logs", "stderr")
    assert sorted(re.findall(r"\[default(\d)\]:sentinel stopped the job: RuleStop: Hang", said)) == ["0", "1"], output
    slept = slept_at(rank_output(tmp_path / "logs"))
    assert ended - slept < FLOOR + 15  # detected at the floor, ended within seconds of it


def test_a_single_process_loop_that_stops_stepping_is_stopped_with_a_hang_finding(tmp_path):
    result = run([str(SCRIPT), "--sleep-rank", "0", "--sleep-step", "5"], SCRIPT.parent,
                 job_env(tmp_path, **BOUNDS), timeout=60)
    assert result.returncode == 86, result.stdout + result.stderr
    (finding,) = findings(tmp_path)
    assert (finding["rule"], finding["step"], finding["tensor"]) == ("Hang", 5, "steps/rank0")
    assert finding["message"].startswith("no optimizer step for ")
    assert "bound 2.0 s = max(floor 2 s, 10 x median step" in finding["message"]
    assert result.stderr.count("sentinel: Hang at step 5:") == 1, result.stderr  # said twice before stop 78


def test_the_watchdog_stays_quiet_on_a_healthy_loop(tmp_path):
    result = run([str(SCRIPT), "--sleep-rank", "-1", "--steps", "30", "--step-seconds", "0.1"], SCRIPT.parent,
                 job_env(tmp_path, **BOUNDS), timeout=60)
    assert result.returncode == 0 and "rank=0 done" in result.stdout, result.stderr
    assert "Hang" not in [finding["rule"] for finding in findings(tmp_path)]
    progress = json.loads((tmp_path / "checkpoints" / "progress.json").read_text())  # the monitor's view
    assert 15 <= progress["step"] <= 30  # rewritten as the steps went on (at most every floor / 2 s here)


def test_an_evaluation_longer_than_the_bound_after_the_last_step_is_work_not_a_hang(tmp_path):
    # Three times the floor of forward passes with no optimizer step (a final evaluation, an export):
    # the training thread computes, so the clock restarts at every tick (judged by steps alone, it was
    # stopped and its model never saved).
    result = run([str(SCRIPT), "--sleep-rank", "-1", "--steps", "10", "--work-after", str(3 * FLOOR)],
                 SCRIPT.parent, job_env(tmp_path, **BOUNDS), timeout=60)
    assert result.returncode == 0 and "rank=0 evaluated" in result.stdout, result.stdout + result.stderr
    assert "Hang" not in [finding["rule"] for finding in findings(tmp_path)]


def test_an_evaluation_in_a_child_process_the_loop_waits_for_is_work_and_a_child_that_sleeps_is_a_hang(tmp_path):
    # Stop 78's harm hunt: an evaluator run with subprocess.run (or data loader workers) past the bound, the
    # training thread waiting for it, was a Hang (exit 86, the rest of the run and its saved model lost).
    result = run([str(SCRIPT), "--sleep-rank", "-1", "--steps", "10", "--work-elsewhere", str(3 * FLOOR)],
                 SCRIPT.parent, job_env(tmp_path / "busy", **BOUNDS), timeout=60)
    assert result.returncode == 0 and "rank=0 scored" in result.stdout, result.stdout + result.stderr
    assert "Hang" not in [finding["rule"] for finding in findings(tmp_path / "busy")]
    # A child that does nothing is waited for as a hung loader or collective is.
    result = run([str(SCRIPT), "--sleep-rank", "-1", "--steps", "10", "--wait-elsewhere", "60"],
                 SCRIPT.parent, job_env(tmp_path / "idle", **BOUNDS), timeout=60)
    assert result.returncode == 86, result.stdout + result.stderr
    (finding,) = findings(tmp_path / "idle")
    assert (finding["rule"], finding["step"]) == ("Hang", 10)


@pytest.mark.long  # a setting read where the bound's is: make test refuses a bad one (below)
def test_the_watchdog_can_be_turned_off(tmp_path):
    off = run([str(SCRIPT), "--sleep-rank", "0", "--sleep-step", "2", "--sleep-seconds", "3", "--steps", "4"],
              SCRIPT.parent, job_env(tmp_path, STABILIZER_HANG_FLOOR_SECONDS="0"), timeout=60)
    assert off.returncode == 0 and "rank=0 done" in off.stdout, off.stderr


@pytest.mark.parametrize("value", ["-1", *in_make_test_all("soon")])
def test_a_bad_bound_is_refused_naming_the_variable(tmp_path, value):
    result = run([str(SCRIPT), "--steps", "1"], SCRIPT.parent,
                 job_env(tmp_path, STABILIZER_HANG_FLOOR_SECONDS=value), timeout=60)
    assert result.returncode != 0
    assert "STABILIZER_HANG_FLOOR_SECONDS: expected" in result.stderr


@pytest.mark.long
def test_a_rank_persistently_slower_than_the_others_is_reported_with_its_rank_and_host(tmp_path):
    command = [*torchrun(tmp_path / "logs"), str(SCRIPT), "--sleep-rank", "-1", "--slow-rank", "1",
               "--slow-seconds", "0.15", "--steps", "40"]
    env = job_env(tmp_path, STABILIZER_HANG_FLOOR_SECONDS="3", STABILIZER_STRAGGLER_FACTOR="2",
                  SM_CURRENT_HOST="algo-2")
    result = run(command, SCRIPT.parent, env, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output  # a straggler slows the job; it does not stop it
    document = json.loads((tmp_path / "checkpoints" / "stragglers.json").read_text())
    (straggler,) = document["stragglers"]
    assert (straggler["rank"], straggler["host"]) == (1, "algo-2")
    assert straggler["factor"] >= 2
    assert "Hang" not in [finding["rule"] for finding in findings(tmp_path)]
