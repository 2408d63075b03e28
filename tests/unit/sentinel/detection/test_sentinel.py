"""The in-job sentinel: finite check every step, rules at save steps, the findings file, exit status 86."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from stabilizer_sentinel import create_trial
from stabilizer_sentinel.detection.sentinel import EXIT_RULE_STOP, build_monitoring
from tests.unit.sentinel.tinynet import batch, tiny_net

EXPLODING = [{"name": "ExplodingTensor", "parameters": {"collection_names": "gradients", "only_nan": "False"}}]


def loop(tmp_path, rules, steps, *, action="stop", capture=None, lr=0.1, poison=None, warmup_steps=3):
    """A training loop with the hook points train.py has. ``poison(step, model)`` may corrupt gradients."""
    model = tiny_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    cap, sentinel = build_monitoring(model, sentinel_rules=rules, sentinel_action=action, capture=capture or {},
                                     checkpoint_dir=tmp_path / "checkpoints",
                                     tensor_dir=tmp_path / "checkpoints" / "tensors",
                                     failure_file=tmp_path / "output" / "failure")
    verdicts = {}
    for step in range(steps):
        x, y = batch(step)
        cap.begin_step(step)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        if poison:
            poison(step, model)
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        verdict = sentinel.after_backward(step, epoch=step // 4, phase="warmup" if step < warmup_steps else "main",
                                          learning_rate=lr, loss=loss, grad_norm=grad_norm, inputs=x, labels=y,
                                          outputs=logits)
        verdicts[step] = verdict
        if verdict.stop:
            return model, sentinel, verdicts
        optimizer.step()
    sentinel.close()
    return model, sentinel, verdicts


def poison_layer(at_step: int, layer: str):
    def poison(step, model):
        if step == at_step:
            dict(model.named_parameters())[layer].grad[0, 0] = float("nan")
    return poison


def test_first_non_finite_gradient_stops_the_step_and_writes_the_contract_findings(tmp_path):
    model, sentinel, verdicts = loop(tmp_path, EXPLODING, 10, poison=poison_layer(5, "blocks.1.linear.weight"))
    assert max(verdicts) == 5 and verdicts[5].stop and not any(v.stop for s, v in verdicts.items() if s < 5)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad step never reached the weights
    findings = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert findings["version"] == 2 and findings["job_action"] == "stop"
    (finding,) = findings["findings"]
    assert finding["rule"] == "ExplodingTensor" and finding["step"] == 5
    assert (finding["epoch"], finding["phase"], finding["learning_rate"]) == (1, "main", 0.1)
    assert finding["tensor"] == "gradients/blocks.1.linear.weight" and finding["value"] == "nan"
    assert finding["message"] == "gradient norm is non-finite at step 5"
    evidence = finding["evidence"]
    assert evidence["first_nonfinite_layer"] == "blocks.1.linear.weight"
    assert [s for s, _ in evidence["loss_history"]] == [0, 1, 2, 3, 4, 5]
    assert evidence["grad_norm_history"][-1] == [5, "nan"] and isinstance(evidence["grad_norm_history"][0][1], float)

    with pytest.raises(SystemExit) as exit_info:
        sentinel.exit_for_rule_stop()
    assert exit_info.value.code == EXIT_RULE_STOP == 86
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.startswith("RuleStop: ExplodingTensor at step 5")
    assert not (tmp_path / "checkpoints" / "tensors").exists()  # capture was not asked for any collection


def test_the_store_shows_the_non_finite_gradient_at_the_stopping_step(tmp_path):
    capture = {"gradients": {"save_interval": 100}, "losses": {"save_interval": 1}}
    _, sentinel, _ = loop(tmp_path, EXPLODING, 10, capture=capture, poison=poison_layer(3, "head.weight"))
    with pytest.raises(SystemExit):
        sentinel.exit_for_rule_stop()
    trial = create_trial(str(tmp_path / "checkpoints" / "tensors"))
    assert trial.tensor("gradients/head.weight").steps() == [0, 3]
    assert torch.isnan(torch.from_numpy(trial.tensor("gradients/head.weight").value(3))).any()
    assert trial.steps() == [0, 1, 2, 3] and trial.loaded_all_steps and trial.end_status == "rule_stop"


def test_a_non_finite_loss_is_reported_as_the_loss(tmp_path):
    model = tiny_net()
    _, sentinel = build_monitoring(model, sentinel_rules=EXPLODING, sentinel_action="stop", capture={},
                                   checkpoint_dir=tmp_path, tensor_dir=None)
    loss = torch.tensor(float("inf"))
    verdict = sentinel.after_backward(0, epoch=0, phase="warmup", learning_rate=0.1, loss=loss,
                                      grad_norm=torch.tensor(1.0))
    assert verdict.stop and verdict.findings[0]["tensor"] == "losses/loss" and verdict.findings[0]["value"] == "inf"



@pytest.mark.parametrize("tensor_dir", [None, "tensors"])
def test_a_float64_loss_beyond_float32s_range_is_finite_not_an_explosion(tmp_path, tensor_dir):
    # Stop 77's harm hunt: a float64 run's loss of 4.2e39 was read through float32 (the sentinel's read of the loss
    # and the gradient norm together, the captured loss) as inf: "non-finite", where it was finite.
    model = tiny_net().double()
    _, sentinel = build_monitoring(model, sentinel_rules=EXPLODING, sentinel_action="stop",
                                   capture={"losses": {"save_interval": 1}} if tensor_dir else {},
                                   checkpoint_dir=tmp_path, tensor_dir=tmp_path / tensor_dir if tensor_dir else None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow in a cast either
        verdict = sentinel.after_backward(0, epoch=0, phase="warmup", learning_rate=0.1,
                                          loss=torch.tensor(4.2e39, dtype=torch.float64),
                                          grad_norm=torch.tensor(1.0, dtype=torch.float64))
    assert not verdict.stop and verdict.findings == []

def test_notify_keeps_training_and_reports_each_rule_once(tmp_path):
    def poison(step, model):
        if step >= 4:
            model.head.weight.grad.fill_(float("nan"))

    _, _, verdicts = loop(tmp_path, EXPLODING, 8, action="notify", poison=poison)
    assert max(verdicts) == 7 and not any(v.stop for v in verdicts.values())
    findings = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert findings["job_action"] == "notify" and [f["step"] for f in findings["findings"]] == [4]


def test_rules_run_at_save_steps_on_tensors_held_in_memory(tmp_path):
    rules = [{"name": "LossNotDecreasing", "parameters": {"num_steps": "5"}},
             {"name": "WeightUpdateRatio"}, *EXPLODING]
    # LR 0: weights never move, the loss does not decrease.
    loop(tmp_path, rules, 30, action="notify", lr=0.0)
    findings = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())["findings"]
    by_rule = {f["rule"]: f for f in findings}
    # Weights are held every 100 steps (only step 0 so far): WeightUpdateRatio has nothing to compare.
    # A loss that never moves is also the sentinel's own NotLearning, which does not hide the rule.
    assert set(by_rule) - {"NotLearning"} == {"LossNotDecreasing"}
    step = by_rule["LossNotDecreasing"]["step"]
    assert step % 5 == 0 and 5 <= step <= 15  # a check step; the first window may still look like progress
    # Rule-only collections stay in memory: nothing was asked of the disk.
    assert not (tmp_path / "checkpoints" / "tensors").exists()


def test_weight_update_ratio_sees_frozen_weights_when_weights_are_captured(tmp_path):
    rules = [{"name": "WeightUpdateRatio"}]
    loop(tmp_path, rules, 6, action="notify", lr=0.0, capture={"weights": {"save_interval": 2}})
    (finding,) = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())["findings"]
    assert finding["rule"] == "WeightUpdateRatio" and finding["step"] == 2 and finding["value"] == 0.0
    assert create_trial(str(tmp_path / "checkpoints" / "tensors")).steps() == [0, 2, 4]


def test_without_rules_capture_works_and_the_sentinel_is_silent_on_a_finite_run(tmp_path):
    _, sentinel, verdicts = loop(tmp_path, [], 5, capture={"losses": {"save_interval": 2}})
    assert not sentinel.enabled and not any(v.stop for v in verdicts.values())
    assert not (tmp_path / "checkpoints" / "findings.json").exists()
    assert create_trial(str(tmp_path / "checkpoints" / "tensors")).steps() == [0, 2, 4]


@pytest.mark.parametrize("rules", [[], [{"name": "VanishingGradient"}]], ids=["no rules", "no ExplodingTensor"])
def test_the_finite_check_runs_whatever_the_rule_list(tmp_path, rules):
    _, _, verdicts = loop(tmp_path, rules, 5, poison=poison_layer(1, "head.weight"))
    assert max(verdicts) == 1 and verdicts[1].stop
    (finding,) = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())["findings"]
    assert (finding["rule"], finding["step"], finding["tensor"]) == ("ExplodingTensor", 1, "gradients/head.weight")


def test_bad_action_is_rejected():
    from stabilizer_sentinel.rules import RuleConfigError

    with pytest.raises(RuleConfigError, match="sentinel_action: expected one of \\['stop', 'notify'\\]"):
        build_monitoring(tiny_net(), sentinel_rules=EXPLODING, sentinel_action="halt", capture={},
                         checkpoint_dir="/tmp/unused", tensor_dir=None)


def test_a_findings_folder_that_cannot_be_made_is_said_once_and_the_run_goes_on(tmp_path, capsys):
    # Outside a job the folder is /opt/ml/checkpoints: a user who may not create it got a traceback at the
    # script's exit, and a finding's write raised inside its step (stop 63's hunt).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _, sentinel = build_monitoring(tiny_net(), sentinel_rules=EXPLODING, sentinel_action="stop", capture={},
                                   checkpoint_dir=blocker / "checkpoints", tensor_dir=None)
    sentinel.write(ended=None)
    sentinel.write(ended="completed")
    assert capsys.readouterr().err.count("findings.json could not be written") == 1


# A network's first losses at a rate 1,000 times too high, trained before the sentinel watched it (the launcher's next
# phase: a network trained after another whose optimizer the script still holds; stop 86's hunt).
UNWATCHED = [19.3, 18382.0, 1261.9, 4299.3, 9436.5, 7984.7, 3375.9, 1023.4, 1915.4, 4571.2, 4256.4, 2857.8]


@pytest.mark.parametrize("trained", [10, 12])
def test_losses_trained_before_the_sentinel_watched_are_judged_as_if_it_had(tmp_path, trained):
    # Until stop 87 the learning check took those steps' start alone: the explosion went unjudged, and the run,
    # back down 300 steps later, was called learned. Now it goes on from where it would stand had it watched them:
    # found at the first watched step, whether the losses before it had already made the finding (12) or it is
    # made with that step's (10); the steps lost are counted from there.
    model = tiny_net()
    _, sentinel = build_monitoring(model, sentinel_rules=None, sentinel_action="stop", capture={},
                                   checkpoint_dir=tmp_path / "checkpoints", tensor_dir=None)
    sentinel.trained_unwatched(UNWATCHED[:trained])
    assert [loss for _, loss in sentinel.loss_history] == UNWATCHED[:trained]
    verdict = sentinel.after_backward(trained, epoch=None, phase=None, learning_rate=30.0,
                                      loss=torch.tensor(4256.0 if trained == 10 else 1685.9),
                                      grad_norm=torch.tensor(1.0))
    (finding,) = verdict.findings
    assert verdict.stop and (finding["rule"], finding["step"]) == ("Diverging", trained)
    assert ("found in the losses of the 12 steps it trained before" in finding["message"]) == (trained == 12)
    assert [loss for _, loss in finding["evidence"]["loss_history"]][:trained] == UNWATCHED[:trained]


def test_healthy_losses_trained_before_the_sentinel_watched_leave_nothing_to_report(tmp_path):
    model = tiny_net()
    _, sentinel = build_monitoring(model, sentinel_rules=None, sentinel_action="stop", capture={},
                                   checkpoint_dir=tmp_path / "checkpoints", tensor_dir=None)
    sentinel.trained_unwatched([2.3 - 0.01 * step for step in range(50)])
    verdict = sentinel.after_backward(50, epoch=None, phase=None, learning_rate=0.1, loss=torch.tensor(1.8),
                                      grad_norm=torch.tensor(1.0))
    assert not verdict.stop and verdict.findings == [] and sentinel.learning.start_loss == pytest.approx(2.28)
