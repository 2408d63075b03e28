"""Every job leaves a summary: watched by default ("auto"), to its end, whatever the end was.

Job processes, as a job runs: the autostart ``sitecustomize`` for "auto", ``python -m
stabilizer_sentinel.launch`` for the launcher, the fixture's own ``watch()`` lines for the library.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from tests.helpers import MODEL_DIR, in_make_test_all
from tests.unit.sentinel.support import FIXTURES, findings, job_env, logged, run, summary

pytestmark = pytest.mark.slow  # every test runs a script as its own process

LOOPS = FIXTURES / "loops" / "loops.py"
RNN = FIXTURES / "loops" / "rnn_lm.py"
AUTOSTART = f"{MODEL_DIR}:{MODEL_DIR / 'stabilizer_sentinel' / 'autostart'}"


def in_a_job(tmp_path, script, config, *args):
    """Run ``script`` as a SageMaker job's entry point would run, the autostart directory on its path."""
    env = job_env(tmp_path, config, PYTHONPATH=AUTOSTART, SM_USER_ENTRY_POINT=script.name)
    return run([script.name, *args], script.parent, env)


def test_auto_the_launcher_watches_a_script_that_never_calls_watch(tmp_path):
    result = in_a_job(tmp_path, LOOPS, {"integration": "auto"}, "--steps", "12")
    assert result.returncode == 0, result.stderr
    written = summary(tmp_path)
    assert written["integration"] == "launcher" and written["ended"] == "completed"
    assert (written["steps_taken"], written["steps_observed"]) == (12, 12)
    assert written["restores"] is True  # a relaunch under the launcher resumes from the newest checkpoint


def test_auto_watches_a_loop_over_bare_tensors_that_never_calls_watch(tmp_path):
    result = in_a_job(tmp_path, LOOPS, {"integration": "auto"}, "--kind", "bare", "--steps", "12", "--nan-from", "6")
    assert result.returncode == 86, result.stderr
    (finding,) = findings(tmp_path)
    assert (finding["rule"], finding["step"]) == ("ExplodingTensor", 6)
    written = summary(tmp_path)
    assert written["integration"] == "launcher" and written["ended"] == "rule_stop"
    assert written["restores"] is False  # no network to load a checkpoint into: a relaunch starts fresh


@pytest.mark.long
def test_a_script_that_watches_its_training_after_an_unwatched_pre_training_is_judged_on_what_it_watches(
    tmp_path,
):
    # Under "auto" the hooks attached at the pre-training's first step; the script's watch() of the
    # training it means comes later and decides: one guard from then on, one summary, the script's.
    result = in_a_job(tmp_path, LOOPS, {"integration": "auto"}, "--pretrain", "6", "--watch", "1", "--steps", "12")
    assert result.returncode == 0, result.stderr
    written = summary(tmp_path)
    assert written["integration"] == "library" and written["learned"] is True
    assert (written["steps_taken"], written["steps_observed"]) == (12, 12)


def test_auto_stands_down_for_a_script_that_watches_itself(tmp_path):
    result = in_a_job(tmp_path, LOOPS, {"integration": "auto"}, "--steps", "12", "--watch", "1")
    assert result.returncode == 0, result.stderr
    written = summary(tmp_path)
    assert written["integration"] == "library"
    assert (written["steps_taken"], written["steps_observed"]) == (12, 12)  # one guard counted, not two


@pytest.mark.parametrize("integration", ["launcher", *in_make_test_all("library")])
def test_a_script_that_dies_of_an_exception_leaves_a_summary_with_its_line_and_keeps_its_status(tmp_path, integration):
    command = {"library": [str(LOOPS), "--watch", "1"], "launcher": ["-m", "stabilizer_sentinel.launch", str(LOOPS)]}
    result = run([*command[integration], "--raise-at", "5"], LOOPS.parent, job_env(tmp_path))
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "RuntimeError: the data loader broke at step 5" in result.stderr
    written = summary(tmp_path)
    assert written["integration"] == integration and written["ended"] == "exception"
    assert written["exception"] == "RuntimeError: the data loader broke at step 5"
    assert (written["steps_taken"], written["last_step"]) == (5, 4)


def test_an_interrupted_script_leaves_a_summary_that_says_so(tmp_path):
    result = run([str(LOOPS), "--watch", "1", "--interrupt-at", "3"], LOOPS.parent, job_env(tmp_path))
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr
    written = summary(tmp_path)
    assert (written["ended"], written["exception"], written["steps_taken"]) == ("interrupted", "KeyboardInterrupt", 3)


@pytest.mark.long
def test_an_rnn_language_model_updating_by_hand_is_stopped_as_diverging_before_its_loss_overflows(tmp_path):
    # Unwatched, its loss climbs from 6.9 to 152 at batch 22, then at batch 23 math.exp(loss) overflows
    # in its log line. 152 is above Diverging's bound once; batch 23's loss is an explosion at once
    # (jump_spreads), found at that batch's update, before its log line.
    free = run([str(RNN), "--lr", "1", "--batches", "30"], RNN.parent, job_env(tmp_path / "free"))
    assert free.returncode == 1 and "OverflowError: math range error" in free.stderr

    notified = tmp_path / "notify"
    seen = run(["-m", "stabilizer_sentinel.launch", str(RNN), "--lr", "1", "--batches", "30"], RNN.parent,
               job_env(notified, {"action": "notify"}))
    assert seen.returncode == 1 and "OverflowError" in seen.stderr  # recorded, and the script's own end kept
    (finding,) = findings(notified)
    assert finding["rule"] == "Diverging" and finding["step"] == 23
    written = summary(notified)
    assert written["ended"] == "exception" and written["exception"] == "OverflowError: math range error"
    assert written["integration"] == "launcher" and written["first_step"] == 1  # its first update went unseen

    stopped = tmp_path / "stop"
    command = ["-m", "stabilizer_sentinel.launch", str(RNN), "--lr", "1", "--batches", "30"]
    result = run(command, RNN.parent, job_env(stopped))
    assert result.returncode == 86 and "OverflowError" not in result.stderr
    assert [f["rule"] for f in findings(stopped)] == ["Diverging"]
    assert summary(stopped)["ended"] == "rule_stop"


def test_the_launcher_resumes_an_unchanged_script_from_the_newest_checkpoint(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("regression_problem", FIXTURES / "regression" / "problem.py")
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    regression = problem.regression
    x, y, model, optimizer = regression(0.02)
    with torch.no_grad():
        fresh = float(nn.functional.mse_loss(model(x), y))
    for _ in range(30):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        trained = float(nn.functional.mse_loss(model(x), y))
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": 30},
               job / "checkpoints" / "checkpoint-00000030.pt")

    result = run(["-m", "stabilizer_sentinel.launch", str(LOOPS), "--steps", "5"], LOOPS.parent, job_env(job))
    assert result.returncode == 0, result.stderr
    first_loss = logged(result.stdout, "loss")[0][1]
    assert abs(first_loss - trained) < 1e-3 * max(trained, 1) and trained < fresh / 10
    written = summary(job)
    assert written["started_from"] == "checkpoint-00000030.pt" and written["restores"] is True
    assert (written["first_step"], written["last_step"], written["steps_taken"]) == (30, 34, 5)


@pytest.mark.long  # the launcher watching Lightning, rolling back: the test after next
def test_auto_watches_a_lightning_script_through_the_launcher_and_stops_it_at_its_first_non_finite_step(tmp_path):
    script = FIXTURES / "loops" / "lightning_fit.py"
    launcher = in_a_job(tmp_path / "launcher", script, {"integration": "auto"}, "--nan-from", "3")
    assert launcher.returncode == 86, launcher.stdout + launcher.stderr
    (finding,) = findings(tmp_path / "launcher")
    assert (finding["rule"], finding["step"]) == ("ExplodingTensor", 3)
    assert summary(tmp_path / "launcher")["integration"] == "launcher"


def test_auto_stands_down_for_a_lightning_callback_which_rolls_back_inside_the_job(tmp_path):
    """The SentinelCallback checks and counts Lightning's steps itself: the rollback's rate is applied
    around the update by the optimizer's step hooks, the copies are loaded into the Trainer's module."""
    script = FIXTURES / "loops" / "lightning_fit.py"
    result = in_a_job(tmp_path, script, {"integration": "auto", "recovery": "in_job"},
                      "--callback", "1", "--lr", "0.2", "--steps", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stabilizer launcher" not in result.stderr
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == [] and document["rollbacks"][-1]["outcome"] == "recovered"
    written = document["summary"]
    assert (written["integration"], written["ended"], written["steps_taken"]) == ("lightning", "completed", 60)
    losses = [loss for _, loss in logged(result.stdout, "loss")]
    assert len(losses) == 60 and math.isfinite(losses[-1]) and losses[-1] < losses[0]


def test_a_lightning_script_at_a_rate_it_cannot_take_is_rolled_back_inside_the_job_through_the_launcher(tmp_path):
    """Lightning runs forward and backward inside ``optimizer.step(closure)``: the launcher attaches
    before any module call, and watches the optimizer's tensors. A rollback puts them back in place."""
    script = FIXTURES / "loops" / "lightning_fit.py"
    result = in_a_job(tmp_path, script, {"integration": "auto", "recovery": "in_job"}, "--lr", "0.2", "--steps", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == [] and document["rollbacks"][-1]["outcome"] == "recovered"
    losses = [loss for _, loss in logged(result.stdout, "loss")]
    assert len(losses) == 60 and math.isfinite(losses[-1]) and losses[-1] < losses[0]
    assert document["summary"]["ended"] == "completed"
