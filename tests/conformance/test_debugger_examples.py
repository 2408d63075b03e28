"""Debugger users migrate unchanged: the Debugger configurations of the public PyTorch example notebooks
of SageMaker Debugger (aws/amazon-sagemaker-examples, sagemaker-debugger/), written here as the
notebooks write them, go through ``client.start(job=estimator)`` locally.

Each test names its notebook. Only the training script and the data are this project's own
(tests/conformance/job: a small classifier, a few seconds of training); the rules, hook
configurations, profiler configurations and custom rules are the notebooks'.

- pytorch_custom_container/pytorch_byoc_smdebug: VanishingGradient. Runs; gradients saved every
  500 steps.
- pytorch_model_debugging/pytorch_script_change_smdebug: VanishingGradient, Overfit, Overtraining,
  PoorWeightInitialization, ProfilerReport; the hook's train/eval intervals. Runs (the script calls
  watch() where it called smdebug's hook).
- model_specific_realtime_analysis/cnn_class_activation_maps: a custom collection by include_regex;
  ClassImbalance on CrossEntropyLoss_input_1 / _input_0. Runs unchanged under the launcher; the
  tensors carry smdebug's names.
- pytorch_iterative_model_pruning: a custom collection; Rule.custom reading CrossEntropyLoss_0_input_0.
  Runs; the custom rule reads names of the notebook's own hook and says it found none.
- pytorch_profiling/pt-resnet-profiling-single-gpu-single-node: LossNotDecreasing, LowGPUUtilization,
  ProfilerReport; ProfilerConfig with FrameworkProfile. Runs; system metrics every 500 ms, no
  framework metrics (as SageMaker for PyTorch 2.x).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow
os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
sagemaker = pytest.importorskip("sagemaker")
from sagemaker.debugger import (  # noqa: E402 - after the skip
    CollectionConfig,
    DebuggerHookConfig,
    FrameworkProfile,
    ProfilerConfig,
    ProfilerRule,
    Rule,
    rule_configs,
)

HERE = Path(__file__).resolve().parent
JOB = HERE / "job"
ROLE = "arn:aws:iam::123456789012:role/sagemaker-execution"


@pytest.fixture
def channels(tmp_path: Path) -> dict[str, str]:
    """Four classes of 8x8 images, one bright quadrant each, with noise: learnt within an epoch."""
    rng = np.random.default_rng(0)
    out = {}
    for name, count in (("train", 1024), ("test", 256)):
        y = rng.integers(0, 4, count)
        x = rng.normal(0, 0.3, (count, 1, 8, 8)).astype("float32")
        for cls in range(4):
            rows, cols = divmod(cls, 2)
            x[y == cls, 0, rows * 4:rows * 4 + 4, cols * 4:cols * 4 + 4] += 1.0
        folder = tmp_path / "data" / name
        folder.mkdir(parents=True)
        np.save(folder / "x.npy", x)
        np.save(folder / "y.npy", y.astype("int64"))
        out[name] = f"file://{folder}"
    return out


@pytest.fixture
def sdk_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)


def estimator(entry_point: str, epochs: int = 4, **debugger: Any) -> Any:
    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    return PyTorch(entry_point=entry_point, source_dir=str(JOB), role=ROLE, framework_version="2.8.0",
                   py_version="py312", instance_type="ml.m5.xlarge", instance_count=1,
                   hyperparameters={"epochs": epochs}, max_run=600, sagemaker_session=LocalSession(), **debugger)


def run(tmp_path: Path, job: Any, channels: dict[str, str]) -> tuple[Any, Any, dict[str, Any]]:
    from stabilizer.client.local_client import LocalClient

    with LocalClient.open(tmp_path / "runs", data_dir=tmp_path / "data") as client:
        arn = client.start({"wait_seconds": 1, "limits": {"max_num_retraining": 0}}, job=job, inputs=channels)
        view = client.wait(arn, timeout=300)
        store = client.tensor_store(arn, 1) if view.state and view.state.get("attempts") else None
    return view, store, view.state or {}


@pytest.mark.long
def test_pytorch_custom_container_vanishing_gradient(tmp_path, channels, sdk_env):
    # pytorch_custom_container/pytorch_byoc_smdebug.ipynb
    rules = [
        Rule.sagemaker(rule_configs.vanishing_gradient())
    ]
    view, store, state = run(tmp_path, estimator("train_unchanged.py", rules=rules), channels)
    assert view.status == "SUCCEEDED", (state.get("reason"), view.cause)
    assert [r["name"] for r in state["monitoring"]["rules"]] == ["VanishingGradient"]
    from stabilizer_sentinel.smdebug_compat import create_trial

    trial = create_trial(store)
    # The rule's collection as Debugger saves it: every 500 steps (step 0 of this short run).
    assert trial.steps(mode="TRAIN") == [0]
    assert "gradient/SmallNet_fc.weight" in trial.tensor_names(collection="gradients")


@pytest.mark.long
def test_pytorch_model_debugging_rules_and_hook_intervals(tmp_path, channels, sdk_env):
    # pytorch_model_debugging/pytorch_script_change_smdebug.ipynb
    rules = [
        Rule.sagemaker(rule_configs.vanishing_gradient()),
        Rule.sagemaker(rule_configs.overfit()),
        Rule.sagemaker(rule_configs.overtraining()),
        Rule.sagemaker(rule_configs.poor_weight_initialization()),
        ProfilerRule.sagemaker(rule_configs.ProfilerReport()),
    ]
    hook_config = DebuggerHookConfig(
        hook_parameters={"train.save_interval": "100", "eval.save_interval": "10"}
    )
    job = estimator("train_watched.py", rules=rules, debugger_hook_config=hook_config)
    view, store, state = run(tmp_path, job, channels)
    assert view.status == "SUCCEEDED", (state.get("reason"), view.cause)
    ran = {r["name"] for r in state["monitoring"]["rules"]}
    assert ran >= {"VanishingGradient", "Overfit", "Overtraining", "PoorWeightInitialization", "LowGPUUtilization"}
    from stabilizer_sentinel.smdebug_compat import create_trial

    trial = create_trial(store)
    assert trial.steps(mode="TRAIN")[:2] == [0, 100]  # losses at the hook's train.save_interval
    assert len(trial.steps(mode="EVAL")) == 4  # every evaluation
    assert trial.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]


@pytest.mark.long  # make test runs the Debugger page's estimator (test_debugger_page_run.py), the same rules
def test_cnn_class_activation_maps_collection_and_class_imbalance(tmp_path, channels, sdk_env):
    # model_specific_realtime_analysis/cnn_class_activation_maps
    debugger_hook_config = DebuggerHookConfig(
        collection_configs=[
            CollectionConfig(
                name="custom_collection",
                parameters={"include_regex":
                            ".*bn|.*bias|.*downsample|.*ResNet_input|.*image|.*fc_output|.*CrossEntropyLoss",
                            "train.save_interval": "100",
                            "eval.save_interval": "1"})])
    class_imbalance_rule = Rule.sagemaker(base_config=rule_configs.class_imbalance(),
                                          rule_parameters={"labels_regex": "CrossEntropyLoss_input_1",
                                                           "predictions_regex": "CrossEntropyLoss_input_0",
                                                           "argmax": "True"})
    job = estimator("train_unchanged.py", debugger_hook_config=debugger_hook_config, rules=[class_imbalance_rule])
    view, store, state = run(tmp_path, job, channels)
    assert view.status == "SUCCEEDED", (state.get("reason"), view.cause)
    assert state["attempts"][0]["watched"]["integration"] == "launcher"  # the script is unchanged
    from stabilizer_sentinel.smdebug_compat import create_trial

    names = set(create_trial(store).tensor_names(collection="custom_collection"))
    assert {"fc_output_0", "CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1", "CrossEntropyLoss_output_0",
            "SmallNet_fc.bias"} <= names


@pytest.mark.long
def test_iterative_model_pruning_custom_rule_says_which_tensor_it_never_found(tmp_path, channels, sdk_env):
    # pytorch_iterative_model_pruning/iterative_model_pruning_resnet.ipynb: its hook and custom rule
    debugger_hook_config = DebuggerHookConfig(
        collection_configs=[
            CollectionConfig(
                name="custom_collection",
                parameters={
                    "include_regex": ".*relu|.*weight|.*bias|.*running_mean|.*running_var|.*CrossEntropyLoss",
                    "save_interval": "100",
                },
            )
        ]
    )
    check_accuracy_rule = Rule.custom(
        name="CheckAccuracy",
        image_uri="759209512951.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rule-evaluator:latest",
        instance_type="ml.c4.xlarge",
        volume_size_in_gb=400,
        source=str(HERE / "rules" / "accuracy_drop.py"),
        rule_to_invoke="AccuracyDrop",
        rule_parameters={"previous_accuracy": "0.0",
                         "threshold": "0.05",
                         "predictions": "CrossEntropyLoss_0_input_0",
                         "labels": "CrossEntropyLoss_0_input_1"},
    )
    job = estimator("train_watched.py", debugger_hook_config=debugger_hook_config, rules=[check_accuracy_rule])
    view, _, state = run(tmp_path, job, channels)
    # The notebook's names come from its own hook subclass, which numbers calls (`_0`); the job saves
    # smdebug's standard names, and the rule says so instead of staying silent.
    finding = state["attempts"][0]["finding"]
    assert finding["rule"] == "NoTensorMatched" and finding["value"] == "CheckAccuracy"
    assert "CrossEntropyLoss_0_input_0" in finding["message"] and "CrossEntropyLoss_input_0" in finding["message"]
    assert view.status == "FAILED" and state["outcome"] == "unverified"
    assert "CrossEntropyLoss_0_input_0" in state["reason"]


@pytest.mark.long
def test_pytorch_profiling_rules_and_profiler_config(tmp_path, channels, sdk_env):
    # pytorch_profiling/pt-resnet-profiling-single-gpu-single-node.ipynb
    rules = [
        Rule.sagemaker(rule_configs.loss_not_decreasing()),
        ProfilerRule.sagemaker(rule_configs.LowGPUUtilization()),
        ProfilerRule.sagemaker(rule_configs.ProfilerReport()),
    ]
    profiler_config = ProfilerConfig(
        system_monitor_interval_millis=500, framework_profile_params=FrameworkProfile(num_steps=10)
    )
    # Long enough (about two seconds here) for several system samples 500 ms apart.
    job = estimator("train_unchanged.py", epochs=40, profiler_config=profiler_config, rules=rules)
    with pytest.warns(UserWarning, match="no framework metrics are collected"):  # as SageMaker says for 2.8
        view, store, state = run(tmp_path, job, channels)
    assert view.status == "SUCCEEDED", (state.get("reason"), view.cause)
    assert [r["name"] for r in state["monitoring"]["rules"]] == [
        "LossNotDecreasing", "LowGPUUtilization", "CPUBottleneck", "IOBottleneck", "OverallSystemUsage"]
    from stabilizer_sentinel.capture.trial import create_trial

    samples = create_trial(store).system_samples()
    assert samples and {"cpu", "memory", "iowait"} <= set(samples[0])
