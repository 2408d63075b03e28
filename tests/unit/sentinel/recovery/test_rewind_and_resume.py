"""A loop protected by ``watch()`` keeps its last healthy state and resumes from it with ``guard.restore()``."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from stabilizer_contract.checkpoints import checkpoint_name, checkpoint_step, checkpoints_in
from stabilizer_sentinel import watch
from tests.unit.sentinel.support import FIXTURES, findings, job_env, logged, run, summary

PLAIN = FIXTURES / "regression" / "plain_loop.py"
RESUMING = FIXTURES / "regression" / "resuming_loop.py"


def _first_non_finite(script, root, *args: str) -> int:
    free = run([str(script), *args], script.parent, job_env(root, {"action": "notify"}))
    assert free.returncode == 0, free.stderr
    return next(step for step, norm in logged(free.stdout) if not math.isfinite(norm))


@pytest.mark.slow
def test_a_stopped_plain_loop_leaves_the_state_from_before_the_explosion(tmp_path):
    args = ("--lr", "0.1", "--steps", "20")
    exploded_at = _first_non_finite(PLAIN, tmp_path / "free", *args)
    assert exploded_at > 5  # the loop took a copy before it went non-finite

    job = tmp_path / "job"
    result = run([str(PLAIN), *args], PLAIN.parent, job_env(job))
    assert result.returncode == 86, result.stdout + result.stderr
    # The loss reached ten times its start before it overflowed: stopped there, as Diverging.
    (first, *_) = findings(job)
    assert first["rule"] == "Diverging" and 5 < first["step"] < exploded_at, first
    stopped_at = first["step"]
    saved = checkpoints_in(job / "checkpoints")
    assert saved, "no rewind checkpoint next to findings.json"
    for path in saved:
        step = checkpoint_step(path.name)
        assert path.name == checkpoint_name(step) and step < stopped_at and step % 5 == 0
        state = torch.load(path, weights_only=True)
        assert state["next_step"] == step and all(torch.isfinite(v).all() for v in state["model"].values())
    assert checkpoint_step(saved[-1].name) >= stopped_at - 10  # the newest is at most two copies old


def _explode(tmp_path, lr: str = "0.05") -> tuple[int, list]:
    """Run the resuming loop until the sentinel stops it; its checkpoints (the rewind's)."""
    job = tmp_path / "exploded"
    result = run([str(RESUMING), "--lr", lr, "--steps", "20"], RESUMING.parent, job_env(job))
    assert result.returncode == 86, result.stdout + result.stderr
    return findings(job)[0]["step"], checkpoints_in(job / "checkpoints")


@pytest.mark.long  # make test resumes through the resume channel below and through the launcher (autostart)
def test_restore_resumes_the_weights_and_the_step_count_from_the_resume_channel(tmp_path):
    exploded_at, saved = _explode(tmp_path)
    newest = saved[-1]
    next_step = checkpoint_step(newest.name)
    assert 0 < next_step < exploded_at

    job = tmp_path / "relaunch"
    restored = tmp_path / "restored.pt"
    env = job_env(job, SM_CHANNEL_RESUME=str(newest.parent))
    result = run([str(RESUMING), "--lr", "0.01", "--steps", "20", "--restored", str(restored)], RESUMING.parent, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"sentinel: resumed from {newest} at step {next_step}" in result.stderr
    assert f"start={next_step} guard_step={next_step}" in result.stdout.splitlines()
    expected = torch.load(newest, weights_only=True)["model"]
    weights = torch.load(restored, weights_only=True)
    assert all(torch.equal(weights[key], expected[key]) for key in expected)
    # The loop skipped the steps done before the checkpoint, and the guard counted from there.
    assert [step for step, _ in logged(result.stdout)] == list(range(next_step, 20))
    written = summary(job)  # the workflow reads where this run started, and that a relaunch resumes it
    assert (written["started_from"], written["restores"], written["first_step"], written["last_step"]) == (
        newest.name, True, next_step, 19)


@pytest.mark.slow
@pytest.mark.long
def test_a_checkpoint_of_another_architecture_starts_fresh_and_says_so(tmp_path):
    _, saved = _explode(tmp_path)
    job = tmp_path / "wider"
    env = job_env(job, SM_CHANNEL_RESUME=str(saved[-1].parent))
    result = run([str(RESUMING), "--lr", "0.02", "--steps", "3", "--width", "32"], RESUMING.parent, env)
    assert result.returncode == 0, result.stdout + result.stderr
    (message,) = [line for line in result.stderr.splitlines() if "does not fit" in line]
    assert str(saved[-1]) in message and "shape" in message and message.endswith("starting from step 0")
    assert "start=0 guard_step=0" in result.stdout.splitlines()
    assert [step for step, _ in logged(result.stdout)] == [0, 1, 2]


def test_restore_without_any_checkpoint_starts_at_step_0(tmp_path):
    model, optimizer = _tiny()
    guard = watch(model, optimizer, environ=_env(tmp_path, SM_CHANNEL_RESUME=str(tmp_path / "empty")))
    before = [p.detach().clone() for p in model.parameters()]
    assert guard.restore() == 0 and guard.step_number == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    guard.close()
    written = json.loads((tmp_path / "ckpt" / "findings.json").read_text())["summary"]
    assert (written["started_from"], written["restores"]) == (None, True)  # it would resume a relaunch


def test_a_fine_tuning_script_names_the_state_it_started_from(tmp_path):
    model, optimizer = _tiny()
    guard = watch(model, optimizer, environ=_env(tmp_path), started_from="s3://bucket/pretrained/model.pt")
    guard.close()
    written = json.loads((tmp_path / "ckpt" / "findings.json").read_text())["summary"]
    assert (written["started_from"], written["restores"]) == ("s3://bucket/pretrained/model.pt", False)


def test_a_loop_over_bare_tensors_resumes_its_own_tensors_from_its_checkpoint(tmp_path):
    """``watch([w, b], optimizer)``: the checkpoints hold the loop's tensors, and ``restore()`` puts them
    back into the relaunched loop's (an empty copy once fitted anything and loaded nothing)."""
    torch.manual_seed(0)
    weight, bias = torch.randn(2, 4, requires_grad=True), torch.zeros(2, requires_grad=True)
    optimizer = torch.optim.SGD([weight, bias], lr=0.1)
    guard = watch([weight, bias], optimizer, environ=_env(tmp_path / "first"))
    for step in range(12):
        optimizer.zero_grad()
        loss = (torch.ones(3, 4) @ weight.T + bias).pow(2).mean()
        loss.backward()
        if step == 8:
            weight.grad[0, 0] = float("nan")
        guard.step(loss)
        optimizer.step()
    guard.close()
    saved = checkpoints_in(tmp_path / "first" / "ckpt")
    assert saved, "no checkpoint of the loop's tensors"
    state = torch.load(saved[-1], weights_only=True)
    assert set(state["model"]) == {"tensor0", "tensor1"}

    fresh_weight, fresh_bias = torch.zeros(2, 4, requires_grad=True), torch.ones(2, requires_grad=True)
    relaunched = watch([fresh_weight, fresh_bias], torch.optim.SGD([fresh_weight, fresh_bias], lr=0.1),
                       environ=_env(tmp_path / "second", SM_CHANNEL_RESUME=str(saved[-1].parent)))
    assert relaunched.restore() == checkpoint_step(saved[-1].name) > 0
    assert torch.equal(fresh_weight, state["model"]["tensor0"]) and torch.equal(fresh_bias, state["model"]["tensor1"])
    relaunched.close()


def _tiny() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _env(tmp_path, **extra: str) -> dict[str, str]:
    return {"STABILIZER_CONFIG": json.dumps({"action": "notify"}), "STABILIZER_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
            "STABILIZER_FAILURE_FILE": str(tmp_path / "failure"), **extra}


def _train(guard, model, optimizer, steps: int, poison_at: int) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        if step == poison_at:
            model[0].weight.grad[0, 0] = float("nan")
        guard.step(loss)
        optimizer.step()


def test_the_guard_copies_every_few_steps_and_persists_at_the_first_finding(tmp_path):
    model, optimizer = _tiny()
    guard = watch(model, optimizer, environ=_env(tmp_path), rewind_every=3, rewind_keep=2)
    _train(guard, model, optimizer, 12, poison_at=10)
    assert guard.sentinel.rewind is guard.rewind and guard.rewind.frozen
    assert [s.next_step for s in guard.rewind.snapshots] == [6, 9]
    assert [p.name for p in checkpoints_in(tmp_path / "ckpt")] == [checkpoint_name(6), checkpoint_name(9)]
    assert (tmp_path / "ckpt" / "findings.json").exists()
    guard.close()


def test_restore_keeps_the_scripts_learning_rate_and_the_checkpoints_momentum(tmp_path):
    model, optimizer = _tiny()
    guard = watch(model, optimizer, environ=_env(tmp_path), rewind_every=3)
    _train(guard, model, optimizer, 12, poison_at=10)
    guard.close()
    saved = torch.load(checkpoints_in(tmp_path / "ckpt")[-1], weights_only=True)

    model, optimizer = _tiny()
    for group in optimizer.param_groups:
        group["lr"] = 0.01  # the relaunch's remedy
    resumed = watch(model, optimizer, environ=_env(tmp_path / "relaunch", SM_CHANNEL_RESUME=str(tmp_path / "ckpt")))
    assert resumed.restore() == 9 and resumed.step_number == 9
    assert optimizer.param_groups[0]["lr"] == 0.01
    first = optimizer.param_groups[0]["params"][0]
    assert torch.equal(optimizer.state[first]["momentum_buffer"], saved["optimizer"]["state"][0]["momentum_buffer"])
    resumed.close()


def test_rewind_every_0_writes_no_checkpoint(tmp_path):
    model, optimizer = _tiny()
    guard = watch(model, optimizer, environ=_env(tmp_path), rewind_every=0)
    _train(guard, model, optimizer, 12, poison_at=10)
    assert guard.rewind is None and guard.sentinel.rewind is None
    assert guard.findings and checkpoints_in(tmp_path / "ckpt") == []
    guard.close()
