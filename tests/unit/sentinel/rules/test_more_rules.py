"""Debugger's further built-in rules and the profiler rules: firing at their documented thresholds, and not."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from stabilizer_sentinel.capture.profiler import SystemProfiler, SystemSampler, load, summary
from stabilizer_sentinel.capture.trial import MemoryTrial, create_trial
from stabilizer_sentinel.detection.sentinel import build_monitoring
from stabilizer_sentinel.rules import RuleConfigError, parse_rule_list
from tests.unit.sentinel.tinynet import batch, tiny_net


def build(trial, name, **params):
    (spec,) = parse_rule_list([{"name": name, "parameters": params}])
    return spec.build(trial)


def test_saturated_activation_counts_units_whose_tanh_inputs_lie_beyond_the_thresholds():
    rng = np.random.default_rng(0)
    healthy = rng.standard_normal((64, 8)).astype(np.float32)
    saturated = healthy.copy()
    saturated[:, :5] = 12.0  # 5 of 8 units beyond 9.4999 on every input
    for value, fires in ((healthy, False), (saturated, True)):
        trial = MemoryTrial()
        trial.add(0, "TRAIN", {"activation_inputs/encoder.tanh": (("activation_inputs",), value)})
        rule = build(trial, "SaturatedActivation")
        assert rule.invoke_at_step(0) is fires
    sigmoid = MemoryTrial()
    sigmoid.add(0, "TRAIN", {"activation_inputs/gate.sigmoid": (("activation_inputs",), np.full((4, 2), 12.0))})
    assert build(sigmoid, "SaturatedActivation").invoke_at_step(0) is False  # 12 < 16.99999 for a sigmoid


def test_tensor_variance_fires_outside_its_bounds_and_needs_a_selection_and_a_bound():
    trial = MemoryTrial()
    trial.add(0, "TRAIN", {"weights/w": (("weights",), np.array([0.0, 2.0], np.float32))})  # variance 1
    assert build(trial, "TensorVariance", collection_names="weights", max_threshold="0.5").invoke_at_step(0)
    assert not build(trial, "TensorVariance", collection_names="weights", max_threshold="1.5").invoke_at_step(0)
    assert build(trial, "TensorVariance", tensor_regex="w", min_threshold="2").invoke_at_step(0)
    with pytest.raises(RuleConfigError, match="specify max_threshold or min_threshold"):
        build(trial, "TensorVariance", collection_names="weights")


def test_confusion_on_debuggers_own_test_cases():
    def trial_with(labels, predictions, mode="EVAL"):
        trial = MemoryTrial()
        trial.add(1, mode, {"labels/labels": (("labels",), labels),
                            "predictions/predictions": (("predictions",), predictions)})
        return trial

    y = np.random.default_rng(0).integers(10, size=100)
    assert not build(trial_with(y, y), "Confusion").invoke_at_step(1)  # identity: quiet
    y = np.arange(10)
    y_hat = y.copy()
    y_hat[4] = 7
    assert build(trial_with(y, y_hat), "Confusion", category_no="10").invoke_at_step(1)
    rule = build(trial_with(y, y_hat), "Confusion", category_no="10", min_diag="0.0", max_off_diag="0.01")
    assert rule.invoke_at_step(1) and "are class 4" in rule.finding.message
    # Training batches are not judged: an untrained network's matrix always fails.
    assert not build(trial_with(y, y_hat, mode="TRAIN"), "Confusion", category_no="10").invoke_at_step(1)


def test_check_input_images_fires_on_unnormalised_images_once_enough_were_seen():
    rng = np.random.default_rng(0)
    raw = rng.random((100, 3, 8, 8)).astype(np.float32)  # [0, 1]: mean 0.5
    for images, fires in ((raw, True), ((raw - 0.5) / 0.29, False)):
        trial = MemoryTrial(tensor_history=10)
        rule = build(trial, "CheckInputImages")
        fired = []
        for step in range(6):
            trial.add(step, "TRAIN", {"inputs/inputs": (("inputs",), images)})
            if rule.invoke_at_step(step):
                fired.append(step)
        assert (fired[:1] == [4]) if fires else not fired  # 500 images at the fifth batch


def test_poor_weight_initialization_on_variance_ratio_narrow_gradients_and_a_flat_loss():
    trial = MemoryTrial()
    wide = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    trial.add(0, "TRAIN", {"activation_inputs/l1.relu": (("activation_inputs",), wide),
                           "activation_inputs/l2.relu": (("activation_inputs",), wide * 4)})  # variance x16
    assert build(trial, "PoorWeightInitialization").invoke_at_step(0)
    assert not build(trial, "PoorWeightInitialization", threshold="20").invoke_at_step(0)
    grads = MemoryTrial()
    grads.add(0, "TRAIN", {"gradients/w": (("gradients",), wide * 1e-4)})  # p95 - p5 ~ 3.3e-4
    assert build(grads, "PoorWeightInitialization").invoke_at_step(0)
    assert not build(grads, "PoorWeightInitialization", distribution_range="1e-4").invoke_at_step(0)
    flat = MemoryTrial()
    rule = build(flat, "PoorWeightInitialization")
    fired = []
    for step in range(12):
        flat.add(step, "TRAIN", {"losses/loss": (("losses",), np.float32(2.3))})
        if rule.invoke_at_step(step):
            fired.append(step)
    assert fired == [5, 6, 7, 8, 9]  # five steps after the best at 0; only the first ten steps analysed


def test_stalled_training_rule_fires_only_after_threshold_seconds_without_a_tensor():
    rule = build(MemoryTrial(), "StalledTrainingRule", threshold="60")
    assert not rule.invoke_at_step(5)
    assert not rule.invoke_idle(59.0, 5)
    assert rule.invoke_idle(61.0, 5) and "after step 5" in rule.finding.message


def samples(gpu, cpu, iowait=0.0, n=10):
    return [{"timestamp": 1000.0 + i, "step": i, "cpu": [cpu, 5.0], "cpu_total": cpu / 2, "iowait": iowait,
             "memory": 40.0, "gpu": [gpu], "gpu_memory": [30.0]} for i in range(n)]


@pytest.mark.parametrize(
    ("rule", "params", "series", "fires"),
    [
        ("LowGPUUtilization", {"patience": "5"}, samples(gpu=20, cpu=10), True),
        ("LowGPUUtilization", {"patience": "5"}, samples(gpu=95, cpu=10), False),
        ("LowGPUUtilization", {"patience": "50"}, samples(gpu=20, cpu=10), False),
        ("CPUBottleneck", {"patience": "5"}, samples(gpu=5, cpu=95), True),
        ("CPUBottleneck", {"patience": "5"}, samples(gpu=5, cpu=85), False),
        ("CPUBottleneck", {"patience": "5"}, samples(gpu=50, cpu=95), False),
        ("IOBottleneck", {"patience": "5"}, samples(gpu=50, cpu=10, iowait=60), True),
        ("IOBottleneck", {"patience": "5"}, samples(gpu=50, cpu=10, iowait=40), False),
        ("OverallSystemUsage", {}, samples(gpu=50, cpu=95), False),
    ],
)
def test_profiler_rules_at_their_documented_thresholds(rule, params, series, fires):
    trial = MemoryTrial()
    for sample in series:
        trial.add_system(sample)
    assert build(trial, rule, **params).invoke_at_step(9) is fires


def test_profiler_rules_without_a_gpu_find_no_gpu_problem():
    trial = MemoryTrial()
    for sample in samples(gpu=0, cpu=99, iowait=99):
        sample["gpu"] = []
        trial.add_system(sample)
    for name in ("LowGPUUtilization", "CPUBottleneck", "IOBottleneck"):
        assert not build(trial, name, patience="1").invoke_at_step(9), name


def test_the_profiler_samples_proc_and_the_store_and_overall_usage_read_it(tmp_path):
    sampler = SystemSampler()
    first = sampler.sample(step=3)
    assert first["step"] == 3 and len(first["cpu"]) >= 1 and 0 <= first["memory"] <= 100
    model = tiny_net()
    rules = json.dumps([{"name": "OverallSystemUsage"}, {"name": "CPUBottleneck", "parameters": {"patience": "0"}}])
    _, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="notify", capture=None,
                                         checkpoint_dir=tmp_path, tensor_dir=tmp_path / "tensors",
                                         profiler_interval_ms=20)
    assert sentinel.profiler is not None
    deadline = time.monotonic() + 5
    step = 0
    while time.monotonic() < deadline and sentinel.profiler.samples_taken < 10:
        x, y = batch(step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        assert not sentinel.after_backward(step, epoch=0, phase="main", learning_rate=0.1, loss=loss).findings
        step += 1
        time.sleep(0.01)
    sentinel.close()
    written = load(str(tmp_path / "tensors"))
    assert len(written) >= 10 and written == sorted(written, key=lambda s: s["timestamp"])
    assert {"cpu", "cpu_total", "iowait", "memory", "gpu", "gpu_memory"} <= set(written[0])
    assert create_trial(str(tmp_path / "tensors")).system_samples() == written
    assert set(summary(written)) >= {"CPU", "CPU memory", "I/O wait"}


def test_profiler_interval_must_be_positive():
    with pytest.raises(ValueError, match="at least 1 ms"):
        SystemProfiler(0, sampler=SystemSampler())
