"""Debugger users' names, rules and actions work as in smdebug: tensors answer to the names smdebug's
PyTorch hook gives them, ClassImbalance reads an unchanged script's loss inputs, a rule that finds no
tensor says so, Email/SMS actions notify without stopping, and a custom rule in smdebug's style runs
in the job and out of it (``invoke_rule``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from stabilizer_sentinel.capture.capture import Capture, CaptureConfigError, parse_capture
from stabilizer_sentinel.capture.trial import MemoryTrial
from stabilizer_sentinel.capture.trial import create_trial as open_store
from stabilizer_sentinel.detection.sentinel import build_monitoring
from stabilizer_sentinel.rules import parse_rule_list
from stabilizer_sentinel.smdebug_compat import (
    RuleEvaluationConditionMet,
    SmdebugTrial,
    TensorUnavailable,
    create_trial,
    invoke_rule,
    load_rule,
)

RULE_FILE = Path(__file__).resolve().parents[3] / "conformance" / "rules" / "accuracy_drop.py"


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.relu1, self.fc = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.relu1(self.fc1(x)))


def batches(steps: int, labels: torch.Tensor | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(32, 4, generator=generator),
             torch.randint(0, 3, (32,), generator=generator) if labels is None else labels) for _ in range(steps)]


def train_unchanged(model: nn.Module, step_hook, data) -> None:
    """A loop that reports nothing but its loss: labels reach the capture through the loss module."""
    criterion = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(data):
        loss = criterion(model(x), y)
        loss.backward()
        step_hook(step, loss)
        model.zero_grad()


def test_tensors_carry_smdebug_names_in_the_store_and_the_trial(tmp_path: Path) -> None:
    model = SmallNet()
    capture = Capture(model, parse_capture({"custom": {"include_regex": ".*CrossEntropyLoss|.*relu1_output|.*fc.weight",
                                                       "save_interval": 1}}), out_dir=tmp_path)
    data = batches(2)

    def step(n: int, loss: torch.Tensor) -> None:
        capture.end_step(n, loss=loss)
        capture.begin_step(n + 1)

    capture.begin_step(0)
    train_unchanged(model, step, data)
    capture.close()
    trial = open_store(str(tmp_path))
    view = SmdebugTrial(trial)
    names = set(view.tensor_names())
    assert {"CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1", "CrossEntropyLoss_output_0", "relu1_output_0",
            "SmallNet_fc.weight", "gradient/SmallNet_fc.weight"} <= names
    assert np.array_equal(view.tensor("CrossEntropyLoss_input_1").value(1), data[1][1].numpy())
    # The store's own names keep working, and regexes match either name.
    assert trial.tensor("CrossEntropyLoss_input_1").name == "labels/labels"
    assert trial.tensor_names(regex="relu1_output") == ["activations/relu1"]
    with pytest.raises(TensorUnavailable, match="CrossEntropyLoss_0_input_0"):
        view.tensor("CrossEntropyLoss_0_input_0")


def test_class_imbalance_reads_an_unchanged_script_s_loss_inputs_by_their_smdebug_names(tmp_path: Path) -> None:
    rules = [{"name": "ClassImbalance", "parameters": {"labels_regex": "CrossEntropyLoss_input_1",
                                                       "predictions_regex": "CrossEntropyLoss_input_0",
                                                       "argmax": "True", "samples": "60"}}]
    model = SmallNet()
    capture, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="stop", capture=None,
                                         checkpoint_dir=tmp_path, tensor_dir=None)
    skewed = torch.tensor([0] * 31 + [1])  # 31 to 1: more than the threshold of 10
    verdicts = []

    def step(n: int, loss: torch.Tensor) -> None:
        verdicts.append(sentinel.after_backward(n, epoch=0, phase="main", learning_rate=0.1, loss=loss))
        capture.begin_step(n + 1)

    capture.begin_step(0)
    train_unchanged(model, step, batches(11, labels=skewed))
    fired = [v for v in verdicts if v.stop]
    assert fired and fired[0].findings[0]["rule"] == "ClassImbalance"
    assert fired[0].findings[0]["tensor"] == "labels/labels" and "imbalance 31" in fired[0].findings[0]["message"]


def test_a_rule_that_matches_no_tensor_says_so_when_the_run_ends(tmp_path: Path) -> None:
    rules = [{"name": "ClassImbalance", "parameters": {"labels_regex": "CrossEntropyLoss_0_input_1"}}]
    model = SmallNet()
    capture, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="stop", capture=None,
                                         checkpoint_dir=tmp_path, tensor_dir=None)

    def step(n: int, loss: torch.Tensor) -> None:
        assert not sentinel.after_backward(n, epoch=0, phase="main", learning_rate=0.1, loss=loss).stop
        capture.begin_step(n + 1)

    capture.begin_step(0)
    train_unchanged(model, step, batches(3))
    sentinel.close()
    (finding,) = [f for f in json.loads((tmp_path / "findings.json").read_text())["findings"]
                  if f["rule"] == "NoTensorMatched"]
    assert finding["value"] == "ClassImbalance"
    assert "ClassImbalance: labels_regex 'CrossEntropyLoss_0_input_1' matched no tensor" in finding["message"]
    assert "CrossEntropyLoss_input_1" in finding["message"]  # what the job did save


@pytest.mark.parametrize(
    ("actions", "stops", "notify"),
    [
        ([{"name": "email", "endpoint": "mlteam@example.com"}, {"name": "sms", "endpoint": "+15555550100"}],
         False, ["email:mlteam@example.com", "sms:+15555550100"]),
        ([{"name": "stoptraining"}, {"name": "email", "endpoint": "mlteam@example.com"}],
         True, ["email:mlteam@example.com"]),
        (None, True, None),
    ],
)
def test_stop_training_stops_and_email_or_sms_only_notify(tmp_path: Path, actions, stops, notify) -> None:
    params = {"threshold": "1e9"}  # every gradient is "vanishing": the rule fires at the first step
    if actions is not None:
        params["action_json"] = json.dumps(actions)
    model = SmallNet()
    capture, sentinel = build_monitoring(model, sentinel_rules=[{"name": "VanishingGradient", "parameters": params}],
                                         sentinel_action="stop", capture=None, checkpoint_dir=tmp_path, tensor_dir=None)
    verdicts = []

    def step(n: int, loss: torch.Tensor) -> None:
        verdicts.append(sentinel.after_backward(n, epoch=0, phase="main", learning_rate=0.1, loss=loss))
        capture.begin_step(n + 1)

    capture.begin_step(0)
    train_unchanged(model, step, batches(1))
    (finding,) = verdicts[0].findings
    assert verdicts[0].stop is stops
    assert finding["action"] == ("stop" if stops else "notify") and finding.get("notify") == notify


def test_a_custom_rule_in_smdebug_s_style_runs_in_the_job_and_out_of_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STABILIZER_CODE_DIR", str(RULE_FILE.parents[1]))
    rules = [{"name": "CheckAccuracy", "parameters": {
        "source_s3_uri": "rules/accuracy_drop.py", "rule_to_invoke": "AccuracyDrop",
        "previous_accuracy": "0.9", "threshold": "0.05"}}]
    model = SmallNet()
    # As Debugger's example does, the hook saves the loss module's inputs (a collection by include_regex).
    saved = {"custom": {"include_regex": ".*CrossEntropyLoss", "save_interval": 1}}
    capture, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="stop", capture=saved,
                                         checkpoint_dir=tmp_path, tensor_dir=tmp_path / "tensors")

    def step(n: int, loss: torch.Tensor) -> None:
        sentinel.after_backward(n, epoch=0, phase="main", learning_rate=0.1, loss=loss)
        capture.begin_step(n + 1)

    capture.begin_step(0)
    train_unchanged(model, step, batches(2))
    x, y = batches(1)[0]
    with torch.no_grad():  # an untrained network: about a third right, far below 0.9
        logits = model(x)
        verdict = sentinel.after_eval(1, epoch=0, phase="main", learning_rate=0.1,
                                      loss=float(nn.functional.cross_entropy(logits, y)), labels=y, outputs=logits)
    assert verdict.stop and verdict.findings[0]["rule"] == "CheckAccuracy"
    assert verdict.findings[0]["message"] == ("Evaluation of the rule CheckAccuracy (AccuracyDrop, a custom rule) "
                                              "at step 1 resulted in the condition being met")
    sentinel.close()
    # Out of the job: the same file, loaded as Debugger would, over the store the job wrote.
    trial = create_trial(str(tmp_path / "tensors"))
    rule = load_rule(RULE_FILE, "AccuracyDrop")(trial, previous_accuracy="0.9", threshold="0.05")
    with pytest.raises(RuleEvaluationConditionMet) as met:
        invoke_rule(rule, start_step=0, end_step=None, raise_eval_cond=True)
    assert met.value.step == 1
    calm = load_rule(RULE_FILE, "AccuracyDrop")(trial, previous_accuracy="0.0")
    invoke_rule(calm, start_step=0, end_step=5)  # the condition never met: returns


def test_invoke_rule_runs_a_built_in_rule_over_a_range_of_steps() -> None:
    trial = MemoryTrial()
    for step in range(6):
        value = np.full(4, 1e-9 if step >= 3 else 1.0, np.float32)
        trial.add(step, "TRAIN", {"gradients/w": (("gradients",), value)})
    (spec,) = parse_rule_list([{"name": "VanishingGradient"}])
    invoke_rule(spec.build(trial), start_step=0, end_step=3)  # steps 0..2 are healthy
    with pytest.raises(RuleEvaluationConditionMet) as met:
        invoke_rule(spec.build(trial), start_step=0, end_step=None, raise_eval_cond=True)
    assert met.value.step == 3


def test_a_custom_rule_reading_a_tensor_the_job_never_saved_says_so_at_the_end(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("STABILIZER_CODE_DIR", str(RULE_FILE.parents[1]))
    rules = [{"name": "CheckAccuracy", "parameters": {
        "source_s3_uri": "rules/accuracy_drop.py", "rule_to_invoke": "AccuracyDrop",
        "predictions": "CrossEntropyLoss_0_input_0", "labels": "CrossEntropyLoss_0_input_1"}}]
    model = SmallNet()
    saved = {"custom": {"include_regex": ".*CrossEntropyLoss", "save_interval": 1}}
    capture, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="stop", capture=saved,
                                         checkpoint_dir=tmp_path, tensor_dir=None)

    def step(n: int, loss: torch.Tensor) -> None:
        sentinel.after_backward(n, epoch=0, phase="main", learning_rate=0.1, loss=loss)
        capture.begin_step(n + 1)

    capture.begin_step(0)
    train_unchanged(model, step, batches(2))
    x, y = batches(1)[0]
    with torch.no_grad():
        logits = model(x)
    assert not sentinel.after_eval(1, epoch=0, phase="main", learning_rate=0.1, loss=1.0, labels=y,
                                   outputs=logits).stop
    sentinel.close()
    (finding,) = [f for f in json.loads((tmp_path / "findings.json").read_text())["findings"]
                  if f["rule"] == "NoTensorMatched"]
    assert "CheckAccuracy read tensors the job never saved: no tensor named 'CrossEntropyLoss_0_input_0'" in \
        finding["message"]
    assert "CrossEntropyLoss_input_0" in finding["message"]  # what it did save


def test_class_imbalance_on_a_job_that_saves_labels_alone_judges_the_labels_and_is_no_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A loop that passes its labels and computes its loss functionally: no predictions are saved.
    rules = [{"name": "ClassImbalance", "parameters": {"samples": "60"}}]
    model = SmallNet()
    capture, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="stop", capture=None,
                                         checkpoint_dir=tmp_path, tensor_dir=None)
    capture.begin_step(0)
    with caplog.at_level("WARNING", logger="stabilizer_sentinel.rules"):
        for n, (x, y) in enumerate(batches(21)):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            assert not sentinel.after_backward(n, epoch=0, phase="main", learning_rate=0.1, loss=loss, labels=y).stop
            model.zero_grad()
            capture.begin_step(n + 1)
    sentinel.close()
    written = tmp_path / "findings.json"
    findings = json.loads(written.read_text())["findings"] if written.exists() else []
    assert [f for f in findings if f["rule"] == "NoTensorMatched"] == []
    assert ("ClassImbalance: mispredictions not judged: predictions_regex '.*predictions' matched no tensor the "
            "job saved; judging the class counts from the labels alone") in caplog.messages


def test_a_collection_whose_schedule_never_came_is_not_a_tensor_that_matched_nothing(tmp_path: Path) -> None:
    # A resumed run of steps 5..7 with gradients saved every 100 steps saves no gradient: the rule had
    # nothing to judge, which is no misnamed tensor (a collection nobody configured is refused at start).
    # (A misnamed regex on a collection that was saved is still reported: the test above.)
    rules = [{"name": "ExplodingTensor", "parameters": {"collection_names": "gradients"}}]
    model = SmallNet()
    capture, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action="stop",
                                         capture={"gradients": {"save_interval": 100}},
                                         checkpoint_dir=tmp_path, tensor_dir=None)

    def step(n: int, loss: torch.Tensor) -> None:
        assert not sentinel.after_backward(n + 5, epoch=0, phase="main", learning_rate=0.1, loss=loss).stop
        capture.begin_step(n + 6)

    capture.begin_step(5)
    train_unchanged(model, step, batches(3))
    sentinel.close()
    written = tmp_path / "findings.json"
    findings = json.loads(written.read_text())["findings"] if written.exists() else []
    assert [f for f in findings if f["rule"] == "NoTensorMatched"] == []


def mlp() -> nn.Sequential:
    """A user's own MLP: no module named ``fc`` (smdebug names its outputs ``0_output_0`` ... ``2_output_0``)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_a_collection_built_after_the_loss_module_s_first_call_saves_its_tensors_from_step_0(tmp_path: Path) -> None:
    # The launcher attaches at the first optimizer step, after the loss module's first call: it hands the
    # module and that call's inputs over, and `.*fc_output|.*CrossEntropyLoss` selects the loss tensors
    # (no module is named fc: that alternative matches nothing, the regex as a whole does).
    model, criterion = mlp(), nn.CrossEntropyLoss()
    data = batches(2)
    x, y = data[0]
    logits = model(x)
    loss = criterion(logits, y)
    capture = Capture(model, parse_capture({"custom_collection": {"include_regex": ".*fc_output|.*CrossEntropyLoss",
                                                                  "save_interval": 1}}), out_dir=tmp_path)
    capture.loss_module_seen(criterion, (logits.detach(), y))
    loss.backward()
    capture.end_step(0, loss=loss)
    capture.begin_step(1)
    x, y = data[1]
    loss = criterion(model(x), y)
    capture.end_step(1, loss=loss)
    capture.close()
    view = create_trial(str(tmp_path))
    names = ["CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1", "CrossEntropyLoss_output_0"]
    assert sorted(view.tensor_names(collection="custom_collection")) == names
    assert all(view.tensor(name).steps() == [0, 1] for name in names)
    assert np.array_equal(view.tensor("CrossEntropyLoss_input_1").value(0), data[0][1].numpy())
    assert np.array_equal(view.tensor("CrossEntropyLoss_input_0").value(0), logits.argmax(1).numpy())


def test_a_collection_whose_regex_matches_nothing_fails_naming_it_with_loss_and_module_names(tmp_path: Path) -> None:
    # Never silence: after the first step (the loss module known) the job fails, naming the collection.
    model = mlp()
    capture = Capture(model, parse_capture({"custom_collection": {"include_regex": ".*fc_output", "save_interval": 1},
                                            "losses": {"save_interval": 1}}), out_dir=tmp_path)

    def step(n: int, loss: torch.Tensor) -> None:
        capture.end_step(n, loss=loss)
        capture.begin_step(n + 1)

    capture.begin_step(0)
    with pytest.raises(CaptureConfigError) as error:
        train_unchanged(model, step, batches(3))
    capture.close()
    said = str(error.value)
    assert "capture.custom_collection: include_regex ['.*fc_output'] matches no tensor" in said
    for name in ("CrossEntropyLoss_output_0", "CrossEntropyLoss_input_0", "CrossEntropyLoss_input_1",
                 "0_output_0", "2_output_0", "Sequential_0.weight", "losses/loss", "activations/2"):
        assert repr(name) in said, name


def test_the_loss_module_handed_over_names_the_losses_collection_as_smdebug_does(tmp_path: Path) -> None:
    model, criterion = mlp(), nn.CrossEntropyLoss()
    x, y = batches(1)[0]
    loss = criterion(model(x), y)
    capture = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path)
    capture.loss_module_seen(criterion, None)
    capture.end_step(0, loss=loss)
    capture.close()
    assert create_trial(str(tmp_path)).tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
