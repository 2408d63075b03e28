"""The plain-loop level: three added lines protect a loop; the hooks do the rest."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from stabilizer_sentinel import create_trial, watch
from stabilizer_sentinel.loops.optimizer_hooks import LEARNING_KEY, STATE_KEY
from stabilizer_sentinel.rules import RuleFinding
from tests.unit.sentinel.support import FIXTURES, findings, job_env, logged, run, summary

SCRIPT = FIXTURES / "regression" / "plain_loop.py"


def test_the_integration_is_three_lines():
    added = [line for line in SCRIPT.read_text().splitlines() if line.rstrip().endswith("# sentinel")]
    assert len(added) == 3
    assert added[0].startswith("import stabilizer_sentinel")


@pytest.mark.slow
def test_a_diverging_loop_is_stopped_at_its_first_non_finite_step(tmp_path):
    # The same script with a sentinel that only records (action notify) shows where it first goes non-finite.
    free = run([str(SCRIPT), "--lr", "3", "--steps", "8"], SCRIPT.parent,
               job_env(tmp_path / "free", {"action": "notify"}))
    assert free.returncode == 0, free.stderr
    expected = next(step for step, norm in logged(free.stdout) if not math.isfinite(norm))

    job = tmp_path / "job"
    result = run([str(SCRIPT), "--lr", "3", "--steps", "8"], SCRIPT.parent, job_env(job))
    assert result.returncode == 86, result.stdout + result.stderr
    (finding,) = findings(job)
    assert finding["rule"] == "ExplodingTensor" and finding["step"] == expected
    assert finding["tensor"].startswith("gradients/") and finding["value"] in ("nan", "inf")
    assert finding["learning_rate"] == 3.0
    assert (job / "failure").read_text().startswith(f"RuleStop: ExplodingTensor at step {expected}")
    # Stopped before the optimizer applied that step: no log line for it.
    assert max(step for step, _ in logged(result.stdout)) == expected - 1
    # Too short for the learning check's first window, its summary still says where the loss started.
    first = logged(free.stdout, "loss")[0][1]
    assert expected < 5 and summary(job)["first_loss"] == pytest.approx(first, rel=1e-4)


@pytest.mark.slow
def test_a_healthy_loop_runs_to_the_end_and_closes_the_store(tmp_path):
    config = {"capture": {"gradients": {"save_interval": 5}}}
    result = run([str(SCRIPT), "--lr", "0.05", "--steps", "12"], SCRIPT.parent, job_env(tmp_path, config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("done")
    assert "sentinel" not in result.stderr  # a healthy run: the watcher wrote nothing on its streams
    assert findings(tmp_path) == []
    written = summary(tmp_path)  # written at the end though no rule fired
    assert written["integration"] == "library" and written["ended"] == "completed" and written["exception"] is None
    assert (written["steps_taken"], written["steps_observed"], written["steps_skipped"]) == (12, 12, 0)
    assert (written["first_step"], written["last_step"]) == (0, 11)
    assert written["learned"] is True and written["last_loss"] < written["first_loss"]
    assert written["restores"] is False and written["started_from"] is None
    end = json.loads((tmp_path / "checkpoints" / "tensors" / "training_end.json").read_text())
    assert end["status"] == "completed"  # closed at interpreter exit, with no close() in the script
    trial = create_trial(tmp_path / "checkpoints" / "tensors")
    assert trial.tensor("gradients/0.weight").steps() == [0, 5, 10]


def _tiny(tmp_path, config):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    env = {"STABILIZER_CONFIG": json.dumps(config), "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}
    return model, optimizer, watch(model, optimizer, environ=env)


def _train(guard, optimizer, model, steps: int) -> None:
    """``steps`` healthy steps on one constant batch, each loss reported before the optimizer step."""
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        guard.step(loss)
        optimizer.step()


def test_the_step_count_survives_an_optimizer_checkpoint(tmp_path):
    model, optimizer, guard = _tiny(tmp_path, {"rules": [{"name": "ExplodingTensor"}]})
    _train(guard, optimizer, model, 3)
    saved = optimizer.state_dict()
    assert saved[STATE_KEY] == 3
    guard.close()
    _, resumed_optimizer, resumed = _tiny(tmp_path, {"rules": [{"name": "ExplodingTensor"}]})
    resumed_optimizer.load_state_dict(saved)
    assert resumed.step_number == 3
    resumed.close()


def test_the_learning_check_start_survives_an_optimizer_checkpoint(tmp_path):
    model, optimizer, guard = _tiny(tmp_path, {"rules": [{"name": "ExplodingTensor"}]})
    _train(guard, optimizer, model, 6)
    saved = optimizer.state_dict()
    first = saved[LEARNING_KEY]["first"]
    assert first is not None and first[0] == 4  # the first 5-step window ended at step 4
    guard.close()
    _, resumed_optimizer, resumed = _tiny(tmp_path, {"rules": [{"name": "ExplodingTensor"}]})
    resumed_optimizer.load_state_dict(saved)
    assert resumed.sentinel.learning.state_dict() == saved[LEARNING_KEY]
    resumed.close()


def test_a_non_finite_loss_reported_before_the_step_stops_it_in_process(tmp_path):
    model, optimizer, guard = _tiny(tmp_path, {"rules": [{"name": "ExplodingTensor"}], "action": "stop"})
    optimizer.zero_grad()
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    guard.step(loss * float("nan"))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(SystemExit) as stopped:
        optimizer.step()
    assert stopped.value.code == 86
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert (tmp_path / "failure").read_text().startswith("RuleStop: ExplodingTensor at step 0: loss is non-finite")


def test_ranks_that_agreed_to_stop_wait_for_each_other_only_once_their_files_are_written(tmp_path):
    # torchrun stops a host's other ranks as soon as one exits: one that has not written yet would not.
    _, _, guard = _tiny(tmp_path, {"rules": [{"name": "ExplodingTensor"}], "action": "stop"})
    finding = RuleFinding("ExplodingTensor", 5, "losses/loss", "nan", "loss is non-finite")
    assert guard.sentinel.report(finding, {"epoch": 0, "phase": "train", "learning_rate": 0.1}, source="rank 1").stop
    written = []

    def leave():  # the barrier; the other rank already gone
        document = json.loads((tmp_path / "ckpt" / "findings.json").read_text())
        written.append(((tmp_path / "failure").exists(), [(f["rule"], f["step"]) for f in document["findings"]]))
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(SystemExit) as stopped:
        guard.sentinel.exit_for_rule_stop(leave=leave)
    assert stopped.value.code == 86
    assert written == [(True, [("ExplodingTensor", 5)])]


def _watched(tmp_path, model, optimizer, batch, steps: int) -> tuple[list[float], dict]:
    """``steps`` steps of ``model`` on ``batch`` (inputs, targets), watched with VanishingGradient (which reads
    every gradient at its first step) and in-job recovery (copies of the state); the losses and the summary."""
    config = {"rules": [{"name": "ExplodingTensor"}, {"name": "VanishingGradient"}], "recovery": "in_job"}
    env = {"STABILIZER_CONFIG": json.dumps(config), "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "STABILIZER_FAILURE_FILE": str(tmp_path / "failure")}
    guard = watch(model, optimizer, environ=env)
    inputs, targets = batch
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (model(inputs) - targets).pow(2).mean()
        loss.backward()
        guard.step(loss)
        optimizer.step()
        losses.append(loss.item())
    guard.close()
    return losses, json.loads((tmp_path / "ckpt" / "findings.json").read_text())["summary"]


@pytest.mark.slow
def test_a_network_of_bfloat16_weights_is_watched_and_trains_as_unwatched(tmp_path):
    # NumPy has no bfloat16: the gradients a rule reads were once handed to it as they were, and the
    # watched script died at its first step (TypeError: Got unsupported ScalarType BFloat16).
    def network():
        torch.manual_seed(0)
        model = nn.Linear(8, 1).to(torch.bfloat16)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    inputs = torch.randn(64, 8, dtype=torch.bfloat16)
    batch = (inputs, inputs.sum(1, keepdim=True))
    model, optimizer = network()
    free = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = (model(inputs) - batch[1]).pow(2).mean()
        loss.backward()
        optimizer.step()
        free.append(loss.item())
    watched, seen = _watched(tmp_path, *network(), batch, 8)
    assert watched == free and seen["steps_observed"] == 8 and seen["exception"] is None


@pytest.mark.slow
def test_a_sparse_gradient_is_checked_by_its_stored_values(tmp_path):
    # An embedding with sparse=True: the total norm and the capture have no kernel for a sparse tensor
    # as it is (NotImplementedError: 'aten::linalg_vector_norm' ... 'SparseCPU' backend).
    torch.manual_seed(0)
    model = nn.Embedding(100, 8, sparse=True)
    batch = (torch.randint(0, 100, (32, 4)), torch.randn(32, 4, 8))
    losses, seen = _watched(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1), batch, 8)
    assert seen["steps_observed"] == 8 and seen["exception"] is None and losses[-1] < losses[0]
    # The norm of a sparse gradient is its dense gradient's: an index given twice has its rows summed.
    from stabilizer_sentinel.loops.gradients import total_norm

    rows = torch.sparse_coo_tensor([[1, 1, 3]], torch.ones(3, 2), (5, 2), check_invariants=True)
    assert total_norm([rows]).item() == pytest.approx(total_norm([rows.to_dense()]).item()) == math.sqrt(10)
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    assert total_norm([dense.to_sparse_csr(), dense]).item() == pytest.approx(math.sqrt(26))
