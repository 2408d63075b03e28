"""In-job recovery with a loss scaler (``torch.amp.GradScaler``): its state goes back with the copy it was
taken with, and a probe whose steps it skips has failed.

The launcher runs the calibration corpus's mixed-precision script unchanged in a job process
(tests/corpus/amp_gradscaler/train.py), as a job would.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from stabilizer_sentinel.loops.step_clock import ScalerWatch
from stabilizer_sentinel.recovery.rewind import Rewind
from tests.unit.sentinel.support import job_env, run, summary

AMP = Path(__file__).resolve().parents[3] / "corpus" / "amp_gradscaler" / "train.py"


def _scaled(tmp_path) -> tuple[torch.amp.GradScaler, ScalerWatch, Rewind]:
    """A rewind whose optimizer a GradScaler (scale 1024) steps, as the guard wires it."""
    model = torch.nn.Linear(2, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale exists from the first scale()
    watch = ScalerWatch(guard=None)
    watch.scaler = scaler  # what the wrapped GradScaler.step does at its first step
    rewind = Rewind(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=tmp_path)
    rewind.scaling = watch
    return scaler, watch, rewind


def test_a_copy_holds_the_scalers_state_after_its_steps_update_and_a_rollback_puts_it_back_at_the_next(tmp_path):
    scaler, watch, rewind = _scaled(tmp_path)
    # A copy taken at the end of a step the scaler skipped (an overflow at 1024): the scale the next step
    # runs at is the one its update() sets, 512; 1024 would overflow again.
    copy = rewind.take_now(5)
    scaler.update(new_scale=512.0)
    watch.updated()  # what the wrapped GradScaler.update does after it
    assert copy.scaler is not None and copy.scaler["scale"] == 512.0
    scaler.update(new_scale=64.0)  # a run-up's overflows halved it, step after step
    watch.updated()
    rewind.load(copy)  # at the end of a step, before the script's update()
    assert scaler.get_scale() == 64.0  # the step under way keeps the scale its gradients were scaled with
    scaler.update(new_scale=32.0)  # that update would fold the undone step's overflow in
    watch.updated()
    assert scaler.get_scale() == 512.0
    scaler.update(new_scale=256.0)
    watch.updated()
    assert scaler.get_scale() == 256.0  # once: the scale is the script's again


def test_a_copy_without_a_scaler_holds_no_scaler_state(tmp_path):
    model = torch.nn.Linear(2, 1)
    rewind = Rewind(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=tmp_path)
    rewind.scaling = ScalerWatch(guard=None)  # a guard whose optimizer no GradScaler stepped
    assert rewind.take_now(5).scaler is None


def test_a_copy_taken_and_put_back_in_the_same_step_leaves_the_scale_as_its_update_sets_it(tmp_path):
    # A probe's end state taken and kept on at once: the scaler goes on as its own update leaves it.
    scaler, watch, rewind = _scaled(tmp_path)
    rewind.load(rewind.take_now(5))
    scaler.update(new_scale=128.0)
    watch.updated()
    assert scaler.get_scale() == 128.0


@pytest.mark.slow  # the job's own process
def test_the_launcher_rolls_back_a_mixed_precision_script_with_its_scale_and_fails_probes_the_scaler_skips(tmp_path):
    # At 1,000 times its rate the script's first step explodes. The probes at the higher rates overflow
    # float16 at the restored scale, step after step: the scaler skips them, their losses stay where they
    # began, and they would pass for rates that train. The scale the script prints after the rollback is
    # the one the restored state had, not the run-up's halved one (which stays for 2,000 steps).
    result = run(["-m", "stabilizer_sentinel.launch", str(AMP), "--lr", "3"], AMP.parent,
                 job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == []
    decision = document["rollbacks"][0]
    assert decision["outcome"] == "recovered" and decision["restored_step"] == 0
    skipped = [p for p in decision["probed"] if (p["failed"] or "").startswith("the loss scaler skipped")]
    assert skipped and all(p["factor"] > decision["factor"] for p in skipped)
    scales = [float(m.group(1)) for m in re.finditer(r"scale: (\S+)", result.stdout)]
    assert scales[-1] == scales[0] == 2.0**16, result.stdout[-400:]
    assert summary(tmp_path)["ended"] == "completed"


@pytest.mark.slow
@pytest.mark.long  # the job's own process again: a variant of the test above (the mechanism: the first test here)
def test_a_copy_taken_while_the_scaler_still_calibrates_is_no_scale_that_overflows_for_ever(tmp_path):
    # From a first scale of 2**30 the scaler skips a dozen steps before one fits, and the copies at steps
    # 5 and 10 are taken at skipped steps. Each holds the scale its step's update left (halved), and a
    # probe's skips before its first applied step are the scale still calibrating: a rate trains, where
    # each copy's scale overflowing again used to fail every probe and stop the job.
    result = run(["-m", "stabilizer_sentinel.launch", str(AMP), "--lr", "3", "--init_scale", str(2.0**30)],
                 AMP.parent, job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["findings"] == [] and document["rollbacks"][0]["outcome"] == "recovered"
    assert summary(tmp_path)["ended"] == "completed"
