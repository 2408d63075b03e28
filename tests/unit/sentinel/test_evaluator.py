"""The out-of-job evaluator follows a store while it is written and reports Debugger-shaped statuses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from stabilizer_sentinel.capture.capture import Capture, parse_capture
from tests.unit.sentinel.tinynet import tiny_net

MODEL_DIR = Path(__file__).resolve().parents[3] / "model"
RULES = [{"name": "ExplodingTensor"}, {"name": "VanishingGradient"}]


def start(tensors: Path, status: Path, rules=RULES, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stabilizer_sentinel.evaluator", "--tensors", str(tensors), "--rules", json.dumps(rules),
         "--status-file", str(status), "--poll-seconds", "0.05", *extra],
        cwd=MODEL_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def statuses(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text())
    return {s["RuleConfigurationName"]: s for s in data["DebugRuleEvaluationStatuses"]}


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def save_gradients(capture: Capture, model: torch.nn.Module, step: int, value: float) -> None:
    for param in model.parameters():
        param.grad = torch.full_like(param, value)
    capture.end_step(step, loss=1.0)
    capture.flush()


@pytest.mark.slow
def test_statuses_follow_the_job_step_by_step(tmp_path):
    model = tiny_net()
    capture = Capture(model, parse_capture({"gradients": {"save_interval": 1}, "losses": {"save_interval": 1}}),
                      out_dir=tmp_path / "tensors")
    status = tmp_path / "status.json"
    process = start(tmp_path / "tensors", status)
    try:
        for step in range(3):
            save_gradients(capture, model, step, 0.01)
        wait_for(lambda: json.loads(status.read_text())["last_step"] == 2)
        assert {s["RuleEvaluationStatus"] for s in statuses(status).values()} == {"InProgress"}
        save_gradients(capture, model, 3, float("nan"))
        found = wait_for(lambda: statuses(status)["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound"
                         and statuses(status)["ExplodingTensor"])
        assert "Evaluation of the rule ExplodingTensor at step 3 resulted in the condition being met" in \
            found["StatusDetails"]
        assert statuses(status)["VanishingGradient"]["RuleEvaluationStatus"] == "InProgress"
        capture.close()
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
    final = statuses(status)
    assert final["VanishingGradient"]["RuleEvaluationStatus"] == "NoIssuesFound"
    assert final["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound"
    assert json.loads(status.read_text())["loaded_all_steps"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ({"name": "ExplodingTensor", "parameters": {"only": "1"}}, "unknown parameter 'only'"),
        ({"name": "VanishingGradient", "parameters": {"thresold": "1e-6"}}, "unknown parameter 'thresold'"),
        ({"name": "VanishingGradient", "parameters": {"threshold": "-1"}}, "(VanishingGradient).threshold"),
        ({"name": "LossNotDecreasing", "parameters": {"num_steps": "ten"}}, "expected an integer >= 1, got 'ten'"),
        ({"name": "ExplodingTensor", "parameters": {"only_nan": "maybe"}}, "expected True or False, got 'maybe'"),
        ({"name": "AllZero"}, "specify collection_names or tensor_regex"),
        ({"name": "NLPSequenceRatio"}, "only SageMaker Debugger runs NLPSequenceRatio"),
        ({"RuleConfigurationName": "Custom", "RuleParameters": {"rule_to_invoke": "NoSuchRule"}}, "unknown rule"),
    ],
)
def test_a_bad_rule_list_is_an_error_status_and_exit_2_not_a_traceback(tmp_path, rule, said):
    status = tmp_path / "status.json"
    process = start(tmp_path / "tensors", status, [rule])
    assert process.wait(timeout=30) == 2
    (only,) = statuses(status).values()
    assert only["RuleEvaluationStatus"] == "Error"
    assert only["StatusDetails"].startswith("ClientError: ") and said in only["StatusDetails"]
    assert "Traceback" not in process.stderr.read()


@pytest.mark.slow
def test_sigterm_stops_rules_still_in_progress(tmp_path):
    status = tmp_path / "status.json"
    process = start(tmp_path / "tensors", status)
    wait_for(status.exists)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert {s["RuleEvaluationStatus"] for s in statuses(status).values()} == {"Stopped"}


@pytest.mark.slow
def test_idle_timeout_without_end_marker_is_an_error(tmp_path):
    status = tmp_path / "status.json"
    process = start(tmp_path / "tensors", status, RULES, "--idle-timeout", "0.5")
    assert process.wait(timeout=30) == 0
    details = {s["RuleEvaluationStatus"]: s["StatusDetails"] for s in statuses(status).values()}
    assert list(details) == ["Error"] and "no new tensors for 0.5 s" in details["Error"]


def test_a_finished_store_is_evaluated_to_the_end_in_process(tmp_path):
    """A flat loss on a finished store: LossNotDecreasing fires at its first comparison (step 10)."""
    from stabilizer_sentinel.evaluator import main

    model = tiny_net()
    capture = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path / "tensors")
    for step in range(25):
        capture.end_step(step, loss=float(np.float32(2.3)))
    capture.close()
    status = tmp_path / "status.json"
    assert main(["--tensors", str(tmp_path / "tensors"), "--rules", '[{"name": "LossNotDecreasing"}]',
                 "--status-file", str(status)]) == 0
    (only,) = statuses(status).values()
    assert only["RuleEvaluationStatus"] == "IssuesFound" and "at step 10" in only["StatusDetails"]


@pytest.mark.parametrize(("share_of_class_0", "status_found"), [(0.5, "NoIssuesFound"), (0.97, "IssuesFound")])
def test_class_imbalance_on_a_store_of_labels_alone_judges_the_counts_and_says_what_it_skipped(
        tmp_path, share_of_class_0, status_found):
    from stabilizer_sentinel.evaluator import main

    capture = Capture(tiny_net(), parse_capture({"labels": {"save_interval": 1}}), out_dir=tmp_path / "tensors")
    rng = np.random.default_rng(0)
    for step in range(6):
        labels = np.where(rng.random(100) < share_of_class_0, 0, 1)
        capture.end_step(step, loss=1.0, labels=torch.from_numpy(labels))
    capture.close()
    status = tmp_path / "status.json"
    assert main(["--tensors", str(tmp_path / "tensors"), "--rules", '[{"name": "ClassImbalance"}]',
                 "--status-file", str(status)]) == 0
    (only,) = statuses(status).values()
    assert only["RuleEvaluationStatus"] == status_found
    assert "mispredictions not judged: predictions_regex '.*predictions' matched no tensor" in only["StatusDetails"]


def test_a_rule_that_fires_while_the_job_is_idle_is_reported_in_debuggers_words(tmp_path):
    """StalledTrainingRule fires between steps; its status reads as a rule fired at a step does."""
    from stabilizer_sentinel.capture.trial import create_trial
    from stabilizer_sentinel.evaluator import Evaluator
    from stabilizer_sentinel.rules import parse_rule_list

    model = tiny_net()
    capture = Capture(model, parse_capture({"losses": {"save_interval": 1}}), out_dir=tmp_path / "tensors")
    for step in range(3):
        capture.end_step(step, loss=1.0)
    capture.flush()
    trial = create_trial(tmp_path / "tensors")
    (spec,) = parse_rule_list([{"name": "StalledTrainingRule", "parameters": {"threshold": "60"}}])
    evaluator = Evaluator(trial, [spec.build(trial)], ["StalledTrainingRule"], tmp_path / "status.json")
    evaluator.poll()
    assert statuses(tmp_path / "status.json")["StalledTrainingRule"]["RuleEvaluationStatus"] == "InProgress"
    evaluator.last_progress -= 61  # a minute without a new step
    evaluator.poll()
    stalled = statuses(tmp_path / "status.json")["StalledTrainingRule"]
    assert stalled["RuleEvaluationStatus"] == "IssuesFound"
    assert stalled["StatusDetails"].startswith(
        "RuleEvaluationConditionMet: Evaluation of the rule StalledTrainingRule at step 2 resulted in the "
        "condition being met."
    )
    capture.close()
