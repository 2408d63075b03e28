"""Detection of Debugger's further built-in rules on labelled short real runs of model/train.py.

Each case runs the rule with Debugger's defaults except where a parameter has to say what to look
at (a selection, a bound): a pathological run must be flagged by its rule; the matching healthy
run must not be. StalledTrainingRule is judged the way only it can be, from outside the job, by
the out-of-job evaluator following the store of a job that stops making progress.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.detection.test_detection import SMALL, derived_channel, findings
from tests.helpers import MODEL_DIR, TRAIN_SCRIPT, JobDirs, model_module, run_train

_data = model_module("data")
read_channel = _data.read_channel

pytestmark = [pytest.mark.slow, pytest.mark.long]


def monitored(rules: list[dict], capture: dict) -> list[str]:
    return ["--sentinel_rules", json.dumps(rules), "--sentinel_action", "notify", "--capture", json.dumps(capture)]


def fired(job: JobDirs, rule: str) -> list[dict]:
    return [f for f in findings(job) if f["rule"] == rule]


def normalised(tmp_path: Path, channels: dict[str, Path]) -> dict[str, Path]:
    x, _ = read_channel(channels["train"])
    mean, std = float(x.mean()), float(x.std())
    return {name: derived_channel(tmp_path / name, path, scale=1 / std, shift=-mean / std)
            for name, path in channels.items()}


def test_unnormalised_images_are_flagged_by_check_input_images(tmp_path, digits_channels):
    # The digits are in [0, 1] with mean 0.30; standardised they have mean 0.
    rules, capture = [{"name": "CheckInputImages"}], {"inputs": {"save_interval": 1}}
    raw, standard = JobDirs(tmp_path / "raw"), JobDirs(tmp_path / "standard")
    for job, channels in ((raw, digits_channels), (standard, normalised(tmp_path, digits_channels))):
        result = run_train([*SMALL, "--add_batch_norm", "1", "--max_steps", "6", *monitored(rules, capture)],
                           job.env(channels))
        assert result.returncode == 0, result.stderr
    (finding,) = fired(raw, "CheckInputImages")
    assert finding["step"] == 3 and finding["value"] == pytest.approx(0.305, abs=0.01)  # 512 images at step 3
    assert fired(standard, "CheckInputImages") == []


def test_exploding_gradients_are_flagged_by_tensor_variance_before_they_are_non_finite(tmp_path, digits_channels):
    rules = [{"name": "TensorVariance", "parameters": {"collection_names": "gradients", "max_threshold": "1"}}]
    capture = {"gradients": {"save_interval": 1}}
    exploding, healthy = JobDirs(tmp_path / "exploding"), JobDirs(tmp_path / "healthy")
    result = run_train(["--max_steps", "3", "--log_every", "1", *monitored(rules, capture)],
                       exploding.env(digits_channels))
    assert result.returncode == 0, result.stderr
    (finding,) = fired(exploding, "TensorVariance")
    assert finding["step"] <= 2 and finding["value"] > 1  # the reference recipe's norm is non-finite at 3
    result = run_train([*SMALL, "--add_batch_norm", "1", "--max_steps", "12", *monitored(rules, capture)],
                       healthy.env(digits_channels))
    assert result.returncode == 0, result.stderr
    assert fired(healthy, "TensorVariance") == []


def test_vanishing_inputs_are_flagged_by_poor_weight_initialization(tmp_path, digits_channels):
    # Inputs scaled to ~1e-5 of their range: every gradient is tiny, so their spread is too. With
    # the default distribution_range (0.001) PyTorch's default initialisation of this healthy
    # network is flagged as well (its gradients span ~7e-4 at step 0), so the bound is 1e-5 here;
    # patience 10 leaves the loss criterion out (only the first 10 steps are analysed).
    channels = {name: derived_channel(tmp_path / name, path, scale=1 / 255**2)
                for name, path in digits_channels.items()}
    rules = [{"name": "PoorWeightInitialization", "parameters": {"distribution_range": "1e-5", "patience": "10"}}]
    tiny, healthy = JobDirs(tmp_path / "tiny"), JobDirs(tmp_path / "healthy")
    # Without batch norm nothing rescales the tiny signal, as in the VanishingGradient case.
    for job, data, recipe in ((tiny, channels, []), (healthy, digits_channels, ["--add_batch_norm", "1"])):
        result = run_train([*SMALL, *recipe, "--max_steps", "10", *monitored(rules, {})], job.env(data))
        assert result.returncode == 0, result.stderr
    (finding,) = fired(tiny, "PoorWeightInitialization")
    assert finding["step"] == 0 and "5th and 95th percentiles" in finding["message"]
    assert fired(healthy, "PoorWeightInitialization") == []


def test_exploding_pre_activations_are_flagged_by_saturated_activation(tmp_path, digits_channels):
    # The reference network has ELU, not tanh: the rule reads the activations' inputs with the tanh
    # thresholds (+-9.4999), which the exploding recipe leaves on almost every unit by step 2.
    rules = [{"name": "SaturatedActivation", "parameters": {"tensor_regex": "activation_inputs/"}}]
    capture = {"activation_inputs": {"save_interval": 1}}
    exploding, healthy = JobDirs(tmp_path / "exploding"), JobDirs(tmp_path / "healthy")
    result = run_train(["--max_steps", "3", *monitored(rules, capture)], exploding.env(digits_channels))
    assert result.returncode == 0, result.stderr
    (finding,) = fired(exploding, "SaturatedActivation")
    assert finding["tensor"].startswith("activation_inputs/") and finding["value"] > 50
    result = run_train([*SMALL, "--add_batch_norm", "1", "--max_steps", "12", *monitored(rules, capture)],
                       healthy.env(digits_channels))
    assert result.returncode == 0, result.stderr
    assert fired(healthy, "SaturatedActivation") == []


def test_a_network_that_does_not_learn_is_flagged_by_confusion(tmp_path, digits_channels):
    # Learning rate 0: at the first evaluation the untrained network's predictions are judged.
    job = JobDirs(tmp_path / "frozen")
    result = run_train([*SMALL, "--add_batch_norm", "1", "--num_epochs", "1", "--warmup_learning_rate", "0",
                        "--learning_rate", "0", *monitored([{"name": "Confusion"}], {})], job.env(digits_channels))
    assert result.returncode == 0, result.stderr
    (finding,) = fired(job, "Confusion")
    assert finding["tensor"] == "predictions/predictions" and finding["value"] < 0.9


def test_a_job_that_stops_making_progress_is_flagged_by_stalled_training_rule(tmp_path, digits_channels):
    job = JobDirs(tmp_path / "job")
    tensors = job.checkpoints / "tensors"
    training = subprocess.Popen(
        [sys.executable, str(TRAIN_SCRIPT), *SMALL, "--add_batch_norm", "1", "--num_epochs", "30", "--batch_size", "16",
         "--capture", json.dumps({"losses": {"save_interval": 1}})],
        cwd=MODEL_DIR, env=job.env(digits_channels), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status = tmp_path / "status.json"
    evaluator = None
    try:
        # Followed from its third saved step on, as Debugger's rule container joins a running job.
        wait_for_steps(tensors, 3)
        evaluator = subprocess.Popen(
            [sys.executable, "-m", "stabilizer_sentinel.evaluator", "--tensors", str(tensors), "--rules",
             json.dumps([{"name": "StalledTrainingRule", "parameters": {"threshold": "20"}}]),
             "--status-file", str(status), "--poll-seconds", "0.2"],
            cwd=MODEL_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_steps(tensors, 8)
        deadline = time.monotonic() + 60
        while not status.exists():
            assert time.monotonic() < deadline, "the evaluator wrote no status"
            time.sleep(0.1)
        progress = json.loads(status.read_text())["DebugRuleEvaluationStatuses"][0]
        assert progress["RuleEvaluationStatus"] == "InProgress"  # steps keep coming: no finding
        os.kill(training.pid, signal.SIGSTOP)  # the job hangs (a stuck data loader, a dead peer)
        assert evaluator.wait(timeout=120) == 0
        (verdict,) = json.loads(status.read_text())["DebugRuleEvaluationStatuses"]
        assert verdict["RuleEvaluationStatus"] == "IssuesFound"
        assert "no new tensor for" in verdict["StatusDetails"]
    finally:
        os.kill(training.pid, signal.SIGCONT)
        training.kill()
        training.wait()
        if evaluator is not None:
            evaluator.kill()


def wait_for_steps(tensors: Path, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(list((tensors / "index").glob("*.json"))) < count:
        assert time.monotonic() < deadline, f"fewer than {count} steps in {tensors} after {timeout} s"
        time.sleep(0.1)
