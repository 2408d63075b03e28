"""Built-in rules fire on the condition they name and stay quiet on healthy values; rule lists are validated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stabilizer_sentinel.capture.trial import MemoryTrial
from stabilizer_sentinel.rules import RULES, Rule, RuleConfigError, parse_rule_list, register_rule

# Transcribed from AWS's "List of built-in rules" guide (debugger-built-in-rules.md), not from our code,
# except LossNotDecreasing's `mode`: the guide's table says GLOBAL, its text describes what happens
# when no mode is passed, and that is our default (docs/rules.md).
GUIDE_DEFAULTS = {
    "ExplodingTensor": {"collection_names": None, "tensor_regex": None, "only_nan": False},
    "VanishingGradient": {"threshold": 1e-7},
    "LossNotDecreasing": {"collection_names": None, "tensor_regex": None, "use_losses_collection": True,
                          "num_steps": 10, "diff_percent": 0.1, "increase_threshold_percent": 5.0, "mode": None},
    "Overfit": {"tensor_regex": None, "start_step": 0, "patience": 1, "ratio_threshold": 0.1},
    "Overtraining": {"patience_train": 5, "patience_validation": 10, "delta": 0.01},
    "WeightUpdateRatio": {"num_steps": None, "large_threshold": 10.0, "small_threshold": 1e-8, "epsilon": 1e-9},
    "AllZero": {"collection_names": None, "tensor_regex": None, "threshold": 100.0},
    "UnchangedTensor": {"collection_names": None, "tensor_regex": None, "num_steps": 3, "rtol": 1e-5,
                        "atol": 1e-8, "equal_nan": False},
    "ClassImbalance": {"threshold_imbalance": 10.0, "threshold_misprediction": 0.7, "samples": 500,
                       "argmax": False, "labels_regex": ".*labels", "predictions_regex": ".*predictions"},
    "DeadRelu": {"tensor_regex": [".*relu_output"], "threshold_inactivity": 1.0, "threshold_layer": 50.0},
    "PoorWeightInitialization": {"activation_inputs_regex": [".*relu_input"], "threshold": 10.0,
                                 "distribution_range": 0.001, "patience": 5, "steps": 10},
    "SaturatedActivation": {"collection_names": None, "tensor_regex": [".*tanh_input|.*sigmoid_input"],
                            "threshold_tanh_min": -9.4999, "threshold_tanh_max": 9.4999,
                            "threshold_sigmoid_min": -23, "threshold_sigmoid_max": 16.99999,
                            "threshold_inactivity": 1.0, "threshold_layer": 50.0},
    "TensorVariance": {"collection_names": None, "tensor_regex": None, "max_threshold": None, "min_threshold": None},
    "StalledTrainingRule": {"threshold": 1800, "stop_training_on_fire": False, "training_job_name_prefix": None},
    "Confusion": {"category_no": None, "labels": "labels", "predictions": "predictions",
                  "labels_collection": "labels", "predictions_collection": "predictions", "min_diag": 0.9,
                  "max_off_diag": 0.1},
    "LowGPUUtilization": {"threshold_p95": 70, "threshold_p5": 10, "window": 500, "patience": 1000,
                          "scan_interval_us": 60_000_000},
    "CPUBottleneck": {"threshold": 50, "gpu_threshold": 10, "cpu_threshold": 90, "patience": 100,
                      "scan_interval_us": 60_000_000},
    "IOBottleneck": {"threshold": 50, "gpu_threshold": 70, "io_threshold": 50, "patience": 1000,
                     "scan_interval_us": 60_000_000},
    "OverallSystemUsage": {"scan_interval_us": 60_000_000},
}
# Where our default differs from the guide's, on purpose (docs/rules.md): the guide's default is
# still accepted as a value.
OUR_DEFAULTS = {("CheckInputImages", "regex"): ".*hybridsequential0_input_0|inputs/inputs"}


def test_built_in_rules_have_the_guides_names_parameters_and_defaults():
    from stabilizer_sentinel.rules import rule_parameters

    for name, defaults in GUIDE_DEFAULTS.items():
        got = {p: list(d) if isinstance(d, tuple) else d for p, (_, d) in rule_parameters(RULES[name]).items()}
        assert got == defaults, name
    check_input = {p: d for p, (_, d) in rule_parameters(RULES["CheckInputImages"]).items()}
    assert check_input == {"threshold_mean": 0.2, "threshold_samples": 500, "channel": 1,
                           "regex": OUR_DEFAULTS[("CheckInputImages", "regex")]}
    # Beside Debugger's rules, the entries that carry the sentinel's own checks' thresholds.
    assert set(RULES) == {*GUIDE_DEFAULTS, "CheckInputImages", "NotLearning", "Diverging"}


def grads(trial: MemoryTrial, step: int, **values: np.ndarray) -> None:
    trial.add(step, "TRAIN", {f"gradients/{k}": (("gradients",), v) for k, v in values.items()})


def run(rule: Rule, steps: list[int]) -> int | None:
    for step in steps:
        if rule.invoke_at_step(step):
            return step
    return None


def build(trial: MemoryTrial, name: str, **params: str) -> Rule:
    (spec,) = parse_rule_list([{"name": name, "parameters": params}])
    return spec.build(trial)


def test_exploding_tensor_names_the_first_non_finite_tensor_in_network_order():
    trial = MemoryTrial()
    ok = np.ones((3, 3), np.float32)
    grads(trial, 0, **{"a.weight": ok, "b.weight": ok})
    grads(trial, 5, **{"a.weight": ok, "b.weight": np.array([1.0, np.inf], np.float32)})
    grads(trial, 9, **{"a.weight": np.array([np.nan], np.float32), "b.weight": ok})
    rule = build(trial, "ExplodingTensor")
    assert run(rule, [0, 5, 9]) == 5
    assert (rule.finding.tensor, rule.finding.value) == ("gradients/b.weight", "inf")
    only_nan = build(trial, "ExplodingTensor", only_nan="True", collection_names="gradients")
    assert run(only_nan, [0, 5, 9]) == 9 and only_nan.finding.value == "nan"
    regex = build(trial, "ExplodingTensor", tensor_regex="gradients/a\\..*")
    assert run(regex, [0, 5]) is None


def test_vanishing_gradient_fires_below_the_mean_absolute_threshold_and_ignores_biases():
    trial = MemoryTrial()
    grads(trial, 0, **{"w.weight": np.full(4, 1e-3, np.float32), "w.bias": np.zeros(4, np.float32)})
    grads(trial, 1, **{"w.weight": np.full(4, 5e-8, np.float32), "w.bias": np.zeros(4, np.float32)})
    rule = build(trial, "VanishingGradient")
    assert run(rule, [0, 1]) == 1 and rule.finding.tensor == "gradients/w.weight"
    assert run(build(trial, "VanishingGradient", threshold="1e-8"), [0, 1]) is None


def test_vanishing_gradient_leaves_a_gradient_of_exactly_zero_at_its_first_step_to_the_next():
    # LoRA's A under a B initialised to zero: exactly zero at the first step, by design; the first update ends
    # it. A network dead from its start is found at the next saved step.
    trial = MemoryTrial()
    grads(trial, 0, **{"lora.A": np.zeros(4, np.float32), "dead.weight": np.zeros(4, np.float32)})
    grads(trial, 10, **{"lora.A": np.full(4, 1e-3, np.float32), "dead.weight": np.zeros(4, np.float32)})
    rule = build(trial, "VanishingGradient")
    assert run(rule, [0]) is None
    assert run(rule, [10]) == 10 and rule.finding.tensor == "gradients/dead.weight"


def losses(trial: MemoryTrial, values: dict[int, float], mode: str = "TRAIN") -> None:
    for step, value in values.items():
        trial.add(step, mode, {"losses/loss": (("losses",), np.float32(value))})


def test_loss_not_decreasing_compares_with_the_newest_step_at_least_num_steps_behind():
    # The guide's example: loss saved every 3 steps, num_steps 10: step 21 is compared with step 9,
    # and the next check is at 33 (31 and 32 are not saved).
    trial = MemoryTrial()
    losses(trial, {s: 1.0 for s in range(0, 40, 3)})
    rule = build(trial, "LossNotDecreasing")
    assert run(rule, [21]) == 21 and "value 1 at step 9" in rule.finding.message
    assert run(rule, [24, 27, 30]) is None
    assert run(rule, [33]) == 33 and "at step 21" in rule.finding.message


def test_loss_not_decreasing_on_debuggers_own_test_data():
    # smdebug's tests (tests/analysis/rules/test_loss_not_decreasing.py, removed in 2019): losses
    # at steps 0, 4, ..., 16; the rule fires at step 12 (0.30 vs 0.3 at step 0), and a rule reused
    # after firing does not fire at 16 (0.28 vs 0.33 at step 4). Two loss tensors, no "losses"
    # collection: with no patterns, every scalar tensor is compared.
    values = [0.3, 0.33, 0.31, 0.30, 0.28]
    for kwargs in ({}, {"tensor_regex": "loss, losses"}, {"collection_names": "default"}):
        trial = MemoryTrial()
        for i, value in enumerate(values):
            trial.add(i * 4, "TRAIN", {f"loss_{k}": (("default",), np.float32(value)) for k in range(2)})
        rule = build(trial, "LossNotDecreasing", **kwargs)
        assert run(rule, range(17)) == 12, kwargs
        assert run(rule, range(13, 17)) is None, kwargs


def test_loss_not_decreasing_at_the_documented_diff_percent():
    # A decrease of exactly 0.1% per 10 steps passes diff_percent 0.1; 0.05% does not.
    for per_check, fires in ((0.0011, False), (0.0005, True)):
        trial = MemoryTrial()
        losses(trial, {s: 2.0 * (1 - per_check) ** (s / 10) for s in range(31)})
        assert (run(build(trial, "LossNotDecreasing"), range(31)) is not None) is fires, per_check


def test_loss_not_decreasing_fires_when_the_loss_rises_above_its_best_by_increase_threshold_percent():
    trial = MemoryTrial()
    # 1.0 at 0, 2.0 at 10 (a rise: fires on diff_percent), 1.5 at 20: 25% down from step 10, but
    # 50% above the lowest loss compared (1.0).
    losses(trial, {0: 1.0, 10: 2.0, 20: 1.5})
    rule = build(trial, "LossNotDecreasing")
    assert run(rule, [10]) == 10 and "less than the required decrease" in rule.finding.message
    assert run(rule, [20]) == 20 and "above its lowest value 1" in rule.finding.message
    assert run(build(trial, "LossNotDecreasing", increase_threshold_percent="60"), [10, 20]) == 10


def test_loss_not_decreasing_modes_eval_first_then_train_and_global():
    trial = MemoryTrial()
    losses(trial, {s: 2.0 - 0.05 * s for s in range(24)})  # training loss falls
    losses(trial, {11: 1.0, 23: 1.2}, mode="EVAL")  # validation loss rises
    assert run(build(trial, "LossNotDecreasing"), [10]) is None  # no EVAL value yet: TRAIN
    default = build(trial, "LossNotDecreasing")
    assert run(default, range(24)) == 23 and default.finding.mode == "EVAL"
    assert run(build(trial, "LossNotDecreasing", mode="TRAIN"), range(24)) is None
    assert run(build(trial, "LossNotDecreasing", mode="GLOBAL"), range(24)) is None
    assert run(build(trial, "LossNotDecreasing", mode="global"), [10, 20]) is None


def test_overfit_compares_validation_with_the_training_loss_since_the_last_evaluation():
    trial = MemoryTrial()
    losses(trial, {s: 1.0 - s * 0.01 for s in range(30)})
    losses(trial, {9: 0.95, 19: 1.2, 29: 1.4}, mode="EVAL")
    rule = build(trial, "Overfit", patience="2")
    assert run(rule, list(range(30))) == 29
    assert rule.finding.mode == "EVAL" and rule.finding.value == pytest.approx((1.4 - 0.755) / 0.755, rel=1e-3)
    assert run(build(trial, "Overfit", start_step="25", patience="2"), list(range(30))) is None


def weights(trial: MemoryTrial, step: int, value: np.ndarray) -> None:
    trial.add(step, "TRAIN", {"weights/w.weight": (("weights",), value)})


def test_weight_update_ratio_fires_on_frozen_and_on_huge_updates():
    frozen, healthy, huge = MemoryTrial(), MemoryTrial(), MemoryTrial()
    w = np.ones(10, np.float32)
    for step in range(3):
        weights(frozen, step, w)
        weights(healthy, step, w + 0.01 * step)
        weights(huge, step, w * 100**step)
    assert run(build(frozen, "WeightUpdateRatio"), [0, 1, 2]) == 1
    assert run(build(healthy, "WeightUpdateRatio"), [0, 1, 2]) is None
    assert run(build(huge, "WeightUpdateRatio"), [0, 1, 2]) == 1


def test_all_zero_and_unchanged_tensor():
    trial = MemoryTrial()
    for step in range(4):
        value = np.zeros(5, np.float32) if step >= 2 else np.arange(5, dtype=np.float32) + step
        trial.add(step, "TRAIN", {"weights/w.weight": (("weights",), value)})
    assert run(build(trial, "AllZero", collection_names="weights"), range(4)) == 2
    assert run(build(trial, "AllZero", collection_names="weights", threshold="10"), range(4)) == 0
    unchanged = build(trial, "UnchangedTensor", tensor_regex="weights/.*", num_steps="2")
    assert run(unchanged, range(4)) == 3 and "steps 2..3" in unchanged.finding.message
    with pytest.raises(RuleConfigError, match="specify collection_names or tensor_regex"):
        build(trial, "AllZero")


def test_class_imbalance_judges_the_training_steps_as_the_guide_documents():
    # Rules run as steps arrive (a MemoryTrial keeps only the last few batches of labels).
    balanced, skewed = MemoryTrial(), MemoryTrial()
    on_balanced, on_skewed = build(balanced, "ClassImbalance"), build(skewed, "ClassImbalance")
    rng = np.random.default_rng(0)
    fired = []
    for step in range(5):
        balanced.add(step, "TRAIN", {"labels/labels": (("labels",), rng.integers(0, 10, 128))})
        skew = np.where(rng.random(128) < 0.9, 0, rng.integers(1, 10, 128))
        skewed.add(step, "TRAIN", {"labels/labels": (("labels",), skew)})
        assert not on_balanced.invoke_at_step(step)
        if on_skewed.invoke_at_step(step):
            fired.append(step)
    assert fired[0] == 3  # 512 samples >= 500 at the fourth batch
    assert on_skewed.finding.tensor == "labels/labels" and on_skewed.finding.value > 10
    # Mispredictions are counted over the training steps too, and judged once `samples` were seen.
    labels = np.repeat(np.arange(10), 20)
    scores = np.eye(10)[labels]
    scores[labels == 7] = np.eye(10)[1]  # class 7 always predicted as class 1
    trial = MemoryTrial()
    rule = build(trial, "ClassImbalance", labels_regex="CrossEntropyLoss_input_1",
                 predictions_regex="CrossEntropyLoss_input_0", argmax="True")
    for step in range(3):
        trial.add(step, "TRAIN", {"labels/labels": (("labels",), labels),
                                  "predictions/predictions": (("predictions",), scores)},
                  {"labels/labels": "CrossEntropyLoss_input_1", "predictions/predictions": "CrossEntropyLoss_input_0"})
    assert run(rule, range(3)) == 2  # 600 samples >= 500 at the third step
    assert "class 7 was mispredicted on 100% of its 60 training samples" in rule.finding.message


def test_class_imbalance_on_labels_alone_judges_the_imbalance_and_says_mispredictions_were_not(caplog):
    # The guide's two checks: the per-class counts need labels only; the per-class mispredictions
    # need predictions. A job that saves labels alone has its imbalance judged, not an error.
    rng = np.random.default_rng(0)
    balanced, skewed = MemoryTrial(), MemoryTrial()
    on_balanced, on_skewed = build(balanced, "ClassImbalance"), build(skewed, "ClassImbalance")
    fired = []
    with caplog.at_level("WARNING", logger="stabilizer_sentinel.rules"):
        for step in range(5):
            balanced.add(step, "TRAIN", {"labels/labels": (("labels",), rng.integers(0, 10, 128))})
            skewed.add(step, "TRAIN", {"labels/labels": (("labels",), np.where(rng.random(128) < 0.95, 0, 1))})
            assert not on_balanced.invoke_at_step(step)
            if on_skewed.invoke_at_step(step):
                fired.append(step)
    assert on_balanced.unmatched() is None and on_skewed.unmatched() is None
    assert fired[0] == 3  # 512 labels >= samples 500
    skipped = "mispredictions not judged: predictions_regex '.*predictions' matched no tensor the job saved"
    assert skipped in on_skewed.finding.message
    assert skipped in on_balanced.not_judged()
    # Said once per rule in the job's log, when it first judges the counts without predictions.
    assert [r.getMessage() for r in caplog.records].count(f"ClassImbalance: {skipped}; "
                                                          "judging the class counts from the labels alone") == 2


def test_class_imbalance_judges_mispredictions_over_the_steps_that_saved_predictions():
    # Predictions saved at every other step: class 7 is always mispredicted where it was predicted,
    # which is 100% of its predicted samples, not 50% of all its labels.
    labels = np.repeat(np.arange(10), 20)
    predictions = np.where(labels == 7, 1, labels)
    trial = MemoryTrial()
    rule = build(trial, "ClassImbalance", samples="800")
    for step in range(4):
        tensors = {"labels/labels": (("labels",), labels)}
        if step % 2:
            tensors["predictions/predictions"] = (("predictions",), predictions)
        trial.add(step, "TRAIN", tensors)
    assert run(rule, range(4)) == 3
    assert "class 7 was mispredicted on 100% of its 40 training samples with a prediction" in rule.finding.message
    assert rule.not_judged() is None


def test_class_imbalance_with_labels_regex_matching_nothing_is_still_an_error_naming_it():
    trial = MemoryTrial()
    trial.add(0, "TRAIN", {"labels/labels": (("labels",), np.zeros(8, np.int64)),
                           "predictions/predictions": (("predictions",), np.zeros(8, np.int64))})
    rule = build(trial, "ClassImbalance", labels_regex="CrossEntropyLoss_0_input_1")
    assert run(rule, [0]) is None
    assert rule.unmatched().startswith("ClassImbalance: labels_regex 'CrossEntropyLoss_0_input_1' matched no tensor")


def test_class_imbalance_does_not_judge_each_evaluation():
    labels = np.repeat(np.arange(10), 60)
    predictions = labels.copy()
    predictions[labels == 7] = 1
    trial = MemoryTrial()
    trial.add(4, "EVAL", {"labels/labels": (("labels",), labels),
                          "predictions/predictions": (("predictions",), predictions)})
    assert run(build(trial, "ClassImbalance"), range(5)) is None


def test_dead_relu_counts_dead_relu_units_and_saturated_elu_units():
    rng = np.random.default_rng(0)
    healthy_relu = np.maximum(rng.standard_normal((32, 8, 4, 4)), 0).astype(np.float32)
    dead_relu = healthy_relu.copy()
    dead_relu[:, :5] = 0.0  # 5 of 8 channels never active
    pre = rng.standard_normal((32, 8, 4, 4)).astype(np.float32)
    healthy_elu = np.where(pre > 0, pre, np.expm1(pre))
    saturated_elu = healthy_elu.copy()
    saturated_elu[:, :6] = np.expm1(-8.0)  # pinned at about -1: derivative ~3e-4
    for value, fires in ((healthy_relu, False), (dead_relu, True), (healthy_elu, False), (saturated_elu, True)):
        trial = MemoryTrial()
        trial.add(0, "TRAIN", {"activations/block.act": (("activation_outputs",), value)})
        assert (run(build(trial, "DeadRelu", tensor_regex="block.act"), [0]) == 0) is fires
        # Debugger's default, ".*relu_output", selects modules named like relu (smdebug: "<module>_output_0"),
        # and here every activation module too: a ReLU named relu1 or act is not missed.
        for module in ("layer1.relu", "relu1", "block.act"):
            named = MemoryTrial()
            named.add(0, "TRAIN", {f"activations/{module}": (("activation_outputs",), value)})
            assert (run(build(named, "DeadRelu"), [0]) == 0) is fires, module
        # A regex of the user's own selects what it matches, as in Debugger.
        assert run(build(trial, "DeadRelu", tensor_regex=".*conv_output"), [0]) is None


def test_dead_relu_reads_modules_named_relu1_in_a_real_network():
    import torch

    from stabilizer_sentinel.capture.capture import Capture

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.relu1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
            torch.nn.init.constant_(self.fc1.bias, -100.0)  # every unit of relu1 dead

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.relu1(self.fc1(x)))

    model, memory = Net(), MemoryTrial()
    rule = build(memory, "DeadRelu")
    capture = Capture(model)
    capture.require(rule.collections_needed(), memory, save_interval=1)
    capture.begin_step(0)
    model(torch.randn(16, 4)).sum().backward()
    capture.end_step(0)
    assert memory.smdebug_name_of("activations/relu1") == "relu1_output_0"
    assert run(rule, [0]) == 0 and rule.finding.tensor == "activations/relu1"
    capture.close()


def test_unknown_rules_and_parameters_are_rejected_listing_the_valid_ones():
    with pytest.raises(RuleConfigError) as error:
        parse_rule_list('[{"name": "ExplodingTensors"}]')
    assert "unknown rule 'ExplodingTensors'; rules: " in str(error.value)
    assert "VanishingGradient" in str(error.value)
    with pytest.raises(RuleConfigError) as error:
        parse_rule_list([{"name": "VanishingGradient", "parameters": {"treshold": "1e-6"}}])
    assert "unknown parameter 'treshold'; VanishingGradient takes ['threshold']" in str(error.value)
    with pytest.raises(RuleConfigError, match=r"rules\[0\] \(ExplodingTensor\).only_nan: expected True or False"):
        parse_rule_list([{"name": "ExplodingTensor", "parameters": {"only_nan": "sometimes"}}])
    with pytest.raises(RuleConfigError, match="expected a list"):
        parse_rule_list('{"name": "ExplodingTensor"}')


def test_rule_parameters_are_strings_as_in_debugger_and_debuggers_own_shape_is_accepted():
    (ours,) = parse_rule_list(json.dumps([{"name": "ExplodingTensor", "parameters": {
        "collection_names": "gradients, losses", "only_nan": "False"}}]))
    assert ours.parameters == {"collection_names": ["gradients", "losses"], "only_nan": False}
    (theirs,) = parse_rule_list([{"RuleConfigurationName": "LossNotDecreasing",
                                  "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": "20",
                                                     "mode": "TRAIN"}}])
    assert theirs.name == "LossNotDecreasing" and theirs.parameters == {"num_steps": 20, "mode": "TRAIN"}


def test_a_user_written_rule_is_registered_by_name_and_configured_by_a_rule_list():
    @register_rule
    class GradientAboveLimit(Rule):
        """Fires when any gradient element exceeds ``limit`` in absolute value."""

        required_collections = {"gradients": 10}

        def __init__(self, base_trial, *, limit: float = 100.0) -> None:
            super().__init__(base_trial)
            self.limit = limit

        def invoke_at_step(self, step: int) -> bool:
            for name in self.base_trial.tensor_names(collection="gradients", step=step):
                peak = float(np.abs(self.base_trial.tensor(name).value(step)).max())
                if peak > self.limit:
                    return self.fire(step, f"{name} reached {peak:g}", name, peak)
            return False

    try:
        trial = MemoryTrial()
        grads(trial, 0, **{"w.weight": np.array([1.0, -3.0], np.float32)})
        grads(trial, 1, **{"w.weight": np.array([1.0, -300.0], np.float32)})
        (spec,) = parse_rule_list('[{"name": "GradientAboveLimit", "parameters": {"limit": "50"}}]')
        rule = spec.build(trial)
        assert run(rule, [0, 1]) == 1 and rule.finding.value == 300.0
        with pytest.raises(RuleConfigError, match=r"valid parameters: \['limit'\]"):
            parse_rule_list('[{"name": "GradientAboveLimit", "parameters": {"threshold": "50"}}]')
    finally:
        RULES.pop("GradientAboveLimit", None)


@pytest.mark.parametrize("raw", ['"ExplodingTensor"', "ExplodingTensor", b"[]", 3])
def test_a_rule_list_that_is_not_a_list_is_refused_as_the_workflow_refuses_it(raw):
    from stabilizer_contract.catalogue import check_rule_list

    with pytest.raises(RuleConfigError) as in_job:
        parse_rule_list(raw)
    with pytest.raises(RuleConfigError) as at_input:
        check_rule_list(raw)
    assert str(in_job.value) == str(at_input.value)
    assert str(in_job.value).startswith("rules: expected a")
