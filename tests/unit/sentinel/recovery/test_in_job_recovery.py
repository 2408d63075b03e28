"""In-job recovery (stabilizer_sentinel.recovery.recovery): a rate the network cannot take is lowered inside the
job, from the last healthy state, at a rate probed from it; the schedule the script writes keeps its shape.

The library runs in this process (``runpy`` of tests/fixtures/recovery/too_fast.py with ``--watch 1``).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch

import stabilizer.bench
from stabilizer_sentinel.job_config import StabilizerConfigError, parse_config
from stabilizer_sentinel.recovery.recovery import restore_point
from stabilizer_sentinel.recovery.rewind import Rewind, Snapshot
from tests.unit.sentinel.support import FIXTURES, job_env, run

SCRIPT = FIXTURES / "recovery" / "too_fast.py"


def train(tmp_path, monkeypatch, *args: str, recovery: str | None = "in_job", watch: bool = True):
    """Run the script here; (exit status, its stdout lines, findings.json or None)."""
    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": recovery} if recovery else {}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STABILIZER_FAILURE_FILE", str(tmp_path / "failure"))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--watch", str(int(watch)), *args])
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out):
        try:
            scope = runpy.run_path(str(SCRIPT), run_name="__main__")
            if watch:
                scope["guard"].close()  # what the interpreter's exit does for a job
        except SystemExit as stopped:
            status = int(stopped.code or 0)
    path = tmp_path / "checkpoints" / "findings.json"
    document = json.loads(path.read_text()) if path.exists() else None
    return status, out.getvalue().splitlines(), document


def final(lines: list[str]) -> float:
    return float(lines[-1].removeprefix("final="))


def rates(lines: list[str]) -> list[float]:
    return [float(line.rsplit("lr=", 1)[1]) for line in lines if line.startswith("step=")]


@pytest.mark.slow  # trains the regression for hundreds of steps, twice
def test_an_explosion_is_rolled_back_and_trained_on_at_a_probed_rate_inside_the_job(tmp_path, monkeypatch):
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.5")
    assert status == 0, lines[-3:]
    assert document["findings"] == []  # nothing left for the workflow to remedy
    first = document["rollbacks"][0]
    assert first["rule"] == "ExplodingTensor" and first["outcome"] == "recovered"
    assert first["restored_step"] < first["step"] and first["steps_lost"] == first["step"] + 1 - first["restored_step"]
    assert first["learning_rate_before"] == 0.5 and first["learning_rate_after"] < 0.5
    probed = first["probed"]
    assert len(probed) >= 4 and max(p["learning_rate"] for p in probed) / min(p["learning_rate"] for p in probed) >= 10
    assert first["learning_rate_after"] in [p["learning_rate"] for p in probed if p["failed"] is None]
    # The rates as a person reads them (0.5 x 1/3 is 0.166666666667, not 0.16666666666666666).
    assert all(p["learning_rate"] == float(f"{p['learning_rate']:.12g}") for p in probed)
    summary = document["summary"]
    assert summary["ended"] == "completed" and summary["learned"] is True

    # Near what the same script reaches at a rate it can take (the recovery benchmark prints the ratios).
    _, healthy, _ = train(tmp_path / "healthy", monkeypatch, "--lr", "0.01", recovery=None, watch=False)
    assert final(lines) < 3 * final(healthy)


@pytest.mark.slow  # trains the regression for hundreds of steps, twice
@pytest.mark.parametrize("schedule", ["scheduler", "manual"])
def test_the_scripts_own_schedule_keeps_its_shape(tmp_path, monkeypatch, schedule):
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.5", "--schedule", schedule)
    assert status == 0 and document["rollbacks"]
    _, unwatched, _ = train(tmp_path / "unwatched", monkeypatch, "--lr", "0.5", "--schedule", schedule,
                            recovery=None, watch=False)
    # The script reads back the rates it set, step for step; the factor lives only inside optimizer.step().
    assert len(rates(lines)) == 300 and rates(lines) == rates(unwatched)


def test_a_rising_schedule_is_held_at_the_highest_rate_the_kept_probe_trained_at(tmp_path, monkeypatch):
    """A warm-up the script writes, rising a hundredfold to a rate the regression cannot take. The job
    rolls back during the climb; the probes measured the rates they ran at, and the climb would carry
    the chosen factor past them (it diverged again, rolled back twice and ended at twice the loss of
    the same warm-up to 0.02). Held at the kept probe's highest rate, one rollback is enough."""
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "1", "--schedule", "warmup")
    assert status == 0, lines[-3:]
    [rollback] = document["rollbacks"]
    kept = next(p for p in rollback["probed"] if p["factor"] == rollback["factor"])
    assert rollback["outcome"] == "recovered" and rollback["rate_ceiling"] >= kept["learning_rate"]
    _, healthy, _ = train(tmp_path / "healthy", monkeypatch, "--lr", "0.02", "--schedule", "warmup", watch=False)
    assert final(lines) < final(healthy)
    # The script still reads back the rates it wrote: the ceiling lives inside optimizer.step() too.
    assert len(rates(lines)) == 300
    assert all(math.isclose(rate, 0.01 + 0.99 * step / 300, rel_tol=1e-5) for step, rate in enumerate(rates(lines)))


def test_a_fault_no_rate_fixes_stops_the_job_as_before_with_what_was_probed(tmp_path, monkeypatch):
    status, _, document = train(tmp_path, monkeypatch, "--lr", "0.01", "--poison", "1")
    assert status == 86
    (finding,) = document["findings"]
    assert finding["rule"] == "ExplodingTensor" and finding["step"] == 3
    (decision,) = document["rollbacks"]
    assert decision["outcome"] == "stopped" and decision["learning_rate_after"] is None
    assert all(p["failed"] for p in decision["probed"]) and len(decision["probed"]) == 8  # two rounds
    assert (tmp_path / "failure").read_text().startswith("RuleStop: ExplodingTensor at step 3")
    assert document["summary"]["ended"] == "rule_stop"


@pytest.mark.slow  # trains the regression for 300 steps, twice
def test_the_scripts_moving_average_of_the_weights_restarts_from_where_the_rollback_goes_on(tmp_path, monkeypatch):
    # The script updates its EMA after each step: by the rollback's end it has averaged in the exploded steps
    # and every probe's (1e18 and more). It restarts from the weights the job goes on from.
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.5", "--ema", "0.99")
    assert status == 0, lines[-3:]
    first = document["rollbacks"][0]
    assert first["outcome"] == "recovered" and first["averages_restarted"] == 1
    averaged = float(next(line for line in lines if line.startswith("ema_final=")).removeprefix("ema_final="))
    _, healthy, _ = train(tmp_path / "healthy", monkeypatch, "--lr", "0.01", "--ema", "0.99", recovery=None,
                          watch=False)
    reference = float(next(line for line in healthy if line.startswith("ema_final=")).removeprefix("ema_final="))
    assert math.isfinite(averaged) and averaged < 3 * reference, (averaged, reference)


@pytest.mark.slow  # trains the regression for 300 steps, twice
def test_a_head_kept_apart_from_the_watched_network_goes_back_with_it(tmp_path, monkeypatch):
    # One optimizer over the network and a head the guard does not hold (``watch(encoder, optimizer)``, or a
    # launcher that found the encoder): the head's weights go back with the copy. Before, they kept the
    # run-up's, and no rate trained from there: the job stopped at the finding.
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.5", "--apart", "1")
    _, whole, reference = train(tmp_path / "whole", monkeypatch, "--lr", "0.5")
    assert status == 0, lines[-3:]
    assert [d["outcome"] for d in document["rollbacks"]] == [d["outcome"] for d in reference["rollbacks"]]
    assert final(lines) == final(whole)  # the same weights, the same steps: the same run


def test_relaunch_stops_at_the_finding_as_it_always_did(tmp_path, monkeypatch):
    status, _, document = train(tmp_path, monkeypatch, "--lr", "0.5", recovery="relaunch")
    assert status == 86
    assert document["findings"][0]["rule"] == "ExplodingTensor" and "rollbacks" not in document


@pytest.mark.slow  # trains the regression for hundreds of steps, twice
def test_a_healthy_run_recovering_in_the_job_trains_exactly_as_unwatched(tmp_path, monkeypatch):
    status, watched, document = train(tmp_path, monkeypatch, "--lr", "0.01", "--schedule", "scheduler")
    _, unwatched, _ = train(tmp_path / "unwatched", monkeypatch, "--lr", "0.01", "--schedule", "scheduler",
                            recovery=None, watch=False)
    assert status == 0 and "rollbacks" not in document
    assert watched == unwatched  # every loss, every rate, bit for bit
    # Where the run ended, for the benchmarks' recovered quality: the mean of its last five losses.
    last = [float(line.split()[1].removeprefix("loss=")) for line in watched if line.startswith("step=")][-5:]
    assert document["summary"]["last_window_loss"] == pytest.approx(sum(last) / 5, rel=1e-4)


def test_the_recovery_setting_is_checked_by_name():
    assert parse_config({"recovery": "in_job"}).effective_recovery == "in_job"
    assert parse_config({}).effective_recovery == "relaunch"
    with pytest.raises(StabilizerConfigError, match=r"sagemaker_stabilizer.recovery: expected one of"):
        parse_config({"recovery": "inline"})


def test_a_run_that_ends_while_probing_says_so(tmp_path, monkeypatch):
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.5", "--steps", "12")
    assert status == 0 and lines[-1].startswith("final=")
    (decision,) = document["rollbacks"]
    assert decision["outcome"] == "ended" and decision["step"] == 4
    assert sum(p["steps"] for p in decision["probed"]) == 12 - 5  # every step after the rollback probed
    # Not a recipe the job chose: the finding stands for the workflow, with the highest rate a probe trained at.
    (finding,) = document["findings"]
    assert (finding["rule"], finding["step"]) == ("ExplodingTensor", 4) and document["summary"]["ended"] == "completed"
    trained = [p["learning_rate"] for p in decision["probed"] if p["failed"] is None and p["steps"] == 5]
    assert finding["stable_learning_rate"] == max(trained)


def test_a_probe_the_run_ended_in_the_middle_of_is_no_stable_rate(tmp_path, monkeypatch):
    # The run ends two steps into the first probe: two steps at a rate are no evidence it trains.
    status, _, document = train(tmp_path, monkeypatch, "--lr", "0.5", "--steps", "7")
    (decision,) = document["rollbacks"]
    assert status == 0 and decision["outcome"] == "ended" and [p["steps"] for p in decision["probed"]] == [2]
    (finding,) = document["findings"]
    assert finding["stable_learning_rate"] is None or finding["stable_learning_rate"] < decision["probed"][0][
        "learning_rate"], finding


def test_a_probe_that_threw_its_loss_up_and_back_did_not_hold_it():
    from stabilizer_sentinel.recovery.recovery import Probe

    assert Probe(1 / 3, losses=[0.69, 3e11, 3.4e6, 0.34, 0.70]).held(0.1) is False  # super-resolution at 1/3 of 1.0
    assert Probe(1 / 10, losses=[0.69, 0.62, 0.55, 0.5, 0.47]).held(None)
    assert Probe(1 / 10, losses=[0.69, 0.75, 0.72, 0.70, 0.71]).held(None)  # about where it began
    # Near zero the run's noise, not the first step's magnitude, says what is about where it began.
    near_zero = Probe(1 / 10, losses=[0.02, 0.05, 0.03, 0.04, 0.035])
    assert not near_zero.held(None) and near_zero.held(0.01)
    assert Probe(1 / 10).held(None) is False


def test_a_finding_at_the_runs_end_is_its_verdict_not_a_rollback(tmp_path, monkeypatch):
    import torch
    from torch import nn

    from stabilizer_sentinel import watch

    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = watch(model, optimizer)
    for step in range(40):  # a loss that climbs slowly, never past the divergence bound while it runs
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2)).sum() * 0 + 1.0 + 0.05 * step
        loss.backward()
        guard.step(loss)
        optimizer.step()
    guard.close()
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert [f["rule"] for f in document["findings"]] == ["Diverging"] and "rollbacks" not in document


def test_the_first_copy_is_the_state_the_script_starts_training_from(tmp_path, monkeypatch):
    """A script that loads its own checkpoint after watch() (a fine-tune, a resume) rolls back to what it
    loaded, not to the weights it was built with."""
    import torch
    from torch import nn

    from stabilizer_sentinel import watch

    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = watch(model, optimizer)
    loaded = {name: torch.full_like(value, 0.5) for name, value in model.state_dict().items()}
    model.load_state_dict(loaded)  # after watch(): the script's own resume
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    guard.step(loss)
    optimizer.step()
    first = guard.rewind.first
    assert first is not None and first.next_step == 0
    assert all(torch.equal(first.model[name], value) for name, value in loaded.items())
    guard.close()


@pytest.mark.slow  # the job's own process: the log channel reads what it prints
def test_the_non_finite_loss_the_log_printed_for_an_undone_step_is_not_the_runs(tmp_path):
    """The log is the second channel: its "loss=nan" at the step a rollback undid does not make the
    recovered run an explosion (the summary's log_loss)."""
    env = job_env(tmp_path, {"recovery": "in_job", "loss_regex": r"loss=(\S+)"})
    done = run([str(SCRIPT), "--watch", "1", "--lr", "3"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step=3 loss=inf" in done.stdout.splitlines()[3]  # at lr 3 the loss itself overflows at step 3
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert document["rollbacks"][0]["step"] == 3 and document["findings"] == []
    log = document["summary"]["log_loss"]
    assert log["lines"] >= 300 and log["nonfinite_step"] is None


def test_copies_kept_for_the_rollback_alone_are_never_written_as_checkpoints(tmp_path, monkeypatch):
    """The launcher keeps no rewind of its own (rewind_every 0): the copies in-job recovery keeps do not
    change where a relaunch resumes from."""
    import torch
    from torch import nn

    from stabilizer_sentinel import watch

    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    model = nn.Linear(2, 1)
    guard = watch(model, torch.optim.SGD(model.parameters(), lr=0.1), rewind_every=0)
    assert guard.recovery is not None and guard.rewind is not None and guard.rewind.writes is False
    guard.rewind.keep(guard.rewind.take_now(0))
    assert guard.rewind.persist(before_step=10) is None
    assert not list((tmp_path / "checkpoints").glob("checkpoint-*"))
    guard.close()


def test_a_run_that_ends_while_probing_leaves_its_restore_point_for_the_relaunch(tmp_path, monkeypatch):
    """The finding stands and the workflow relaunches: it resumes from the newest checkpoint before the
    run-up, so the state the job rolled back to is written as one (a stopped job writes its copies too)."""
    import torch
    from torch import nn

    from stabilizer_contract.checkpoints import checkpoint_name
    from stabilizer_sentinel import watch

    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    torch.manual_seed(0)
    x_all = torch.randn(512, 8)
    y_all = x_all @ torch.randn(8, 1)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = watch(model, optimizer)
    for step in range(16):
        if step == 10:  # the script's own schedule jumps to a rate the network cannot take
            for group in optimizer.param_groups:
                group["lr"] = 5.0
        x, y = x_all[step * 32:][:32], y_all[step * 32:][:32]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.step()
    guard.close()
    checkpoints = tmp_path / "checkpoints"
    document = json.loads((checkpoints / "findings.json").read_text())
    (decision,) = document["rollbacks"]
    assert decision["outcome"] == "ended" and 0 < decision["restored_step"] <= decision["step"]
    saved = torch.load(checkpoints / checkpoint_name(decision["restored_step"]), weights_only=False)
    assert saved["next_step"] == decision["restored_step"]


@pytest.mark.slow  # trains the regression for hundreds of steps, twice
def test_a_corrupt_batch_in_a_healthy_run_is_rolled_back_and_the_rate_left_as_it_was(tmp_path, monkeypatch):
    """One NaN batch at step 60 of a run stable at its rate: no run-up, so the restored state is first
    replayed at the same rate; it trains, so the explosion was the batch's and the run goes on
    unchanged, its rates the script's (a lower rate would slow a healthy run for one bad record)."""
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.01", "--steps", "150", "--bad_step", "60")
    assert status == 0 and document["findings"] == []
    (decision,) = document["rollbacks"]
    assert (decision["rule"], decision["step"], decision["outcome"]) == ("ExplodingTensor", 60, "transient")
    assert decision["factor"] == 1.0 and decision["learning_rate_after"] == decision["learning_rate_before"] == 0.01
    assert [p["factor"] for p in decision["probed"]] == [1.0] and decision["probe_steps"] == 0
    assert decision["rate_ceiling"] is None  # the rate was not at fault: no ceiling on a schedule that rises later
    assert set(rates(lines)) == {0.01}
    _, clean, _ = train(tmp_path / "clean", monkeypatch, "--lr", "0.01", "--steps", "150", watch=False)
    assert final(lines) < 1.5 * final(clean)


def test_an_explosion_at_a_rate_the_run_just_reached_is_not_replayed_at_that_rate(tmp_path, monkeypatch):
    """A run-up (here the rate itself: the explosion comes at the script's first steps at 0.5) is a
    recipe's: the rollback probes lower rates only."""
    status, _, document = train(tmp_path, monkeypatch, "--lr", "0.5", "--steps", "60")
    assert status == 0
    assert all(p["factor"] < 1 for d in document["rollbacks"] for p in d["probed"])
    assert all(d["outcome"] != "transient" for d in document["rollbacks"])


def test_a_probe_climbs_only_by_more_than_its_runs_per_step_noise():
    """A probe's first and last losses are single steps: on a loss as noisy as batches of four give, a
    rise of half the first loss is noise, not a rate that climbs (the run's per-step noise bounds it)."""
    from stabilizer_sentinel.recovery.recovery import Probe

    probe = Probe(1.0, losses=[0.5, 0.9, 0.3, 0.7, 0.95])
    assert probe.climbing(noise=None)  # no noise known yet: half the first loss is the bound
    assert not probe.climbing(noise=0.4)  # 0.45 above: within 3 deviations of a difference of two steps
    assert Probe(1.0, losses=[0.5, 0.9, 2.0, 3.0, 4.0]).climbing(noise=0.4)
    # From a state with no noise measured, a probe's own later losses give it: thrown up and flat there is a climb.
    thrown = Probe(1.0, losses=[1.4, 34.5, 34.5, 34.5, 34.5, 34.5])
    assert thrown.spread == 0.0 and thrown.climbing(noise=thrown.spread)
    assert not probe.climbing(noise=probe.spread)  # the noisy one: its later losses' spread about their trend


@pytest.mark.slow  # trains a link predictor, in the launcher
def test_probes_a_rate_threw_to_a_saturated_loss_failed_by_the_noise_before_them_not_their_own_jump(tmp_path):
    """From stop 83's hunt (a graph auto-encoder at a thousand times its rate): every probe of the first round
    saturated at exactly -log(1e-15), none failed, as the run's noise, read after the probes' own jumps from the
    restored state's loss, was wider than the jump; the job went on at the highest but one, a hundred times its
    rate, diverged again and was rolled back a second time. A probe now climbs by the noise of the state restored
    (here none: its own later losses')."""
    script = FIXTURES / "recovery" / "saturating.py"
    result = run(["-m", "stabilizer_sentinel.launch", str(script), "--lr", "30"], script.parent,
                 job_env(tmp_path, {"recovery": "in_job"}))
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    (rollback,) = document["rollbacks"]
    saturated = [p for p in rollback["probed"] if p["score"] > 30]
    assert len(saturated) >= 4 and all(p["failed"] == "its loss climbed" for p in saturated)
    assert rollback["factor"] < min(p["factor"] for p in saturated) and document["summary"]["learned"] is True


def test_the_job_goes_on_a_notch_below_the_highest_rate_as_good_as_the_best():
    """A probe's scores are told apart by their noise about the trend, not by the fall itself: a higher
    rate whose loss came down steeply but stayed six times the lower rate's is not its equal."""
    from stabilizer_sentinel.recovery.recovery import NOISE_ERRORS, Probe, choose

    steep = Probe(1 / 30, losses=[40.0, 12.0, 6.0, 3.0, 1.0])  # mean 5.5, a clean fall
    low = Probe(1 / 100, losses=[40.0, 0.9, 0.8, 0.85, 0.7])  # mean 0.81
    # Told apart: 4.7 between the means, against two errors of 0.72 (about the line; 2.4 about the mean).
    assert steep.score - low.score > NOISE_ERRORS * math.hypot(steep.error, low.error)
    assert choose([steep, low]) is low
    # Probes the batches' noise cannot tell apart: the highest is the edge the network took for a few
    # steps, and the job goes on a notch below it; at the edge only when nothing lower trained.
    noisy_high = Probe(1 / 3, losses=[2.0, 1.0, 1.4, 0.8, 1.3])
    noisy_low = Probe(1 / 10, losses=[2.0, 1.1, 0.9, 1.2, 1.0])
    lowest = Probe(1 / 30, losses=[2.0, 1.8, 1.7, 1.7, 1.6])
    assert choose([noisy_high, noisy_low, lowest]) is noisy_low
    assert choose([noisy_high]) is noisy_high


def test_where_the_rate_a_notch_below_the_edge_learned_slower_the_job_may_go_on_at_the_edge():
    """The edge is the highest rate as good as the best; a notch below it is a safety margin where the
    lower rate learned as fast (a cliff's brink). Where the lower rate learned slower beyond the noise, the
    edge is the loss's minimum over the rates: with ``at_minimum`` the job goes on there."""
    from stabilizer_sentinel.recovery.recovery import NOISE_ERRORS, Probe, choose

    above = Probe(1 / 300, losses=[2.3, 2.2, 2.15, 2.1, 2.05])  # trained, slower than the edge
    top = Probe(1 / 1000, losses=[2.3, 1.9, 1.7, 1.55, 1.4])
    below = Probe(1 / 3000, losses=[2.3, 2.2, 2.1, 2.05, 2.0])
    assert below.score - top.score > NOISE_ERRORS * math.hypot(below.error, top.error)
    assert choose([above, top, below]) is below  # the margin, unless the reading holds
    assert choose([above, top, below], at_minimum=True) is top
    # A rate below as good as the edge within the noise: the notch below, either way.
    tied = Probe(1 / 3000, losses=[2.3, 1.95, 1.65, 1.6, 1.38])
    assert choose([above, top, tied], at_minimum=True) is tied


def test_the_edge_is_kept_only_with_one_optimizer_and_no_climb_of_the_rate_since_the_copy():
    """``Recovery._edge_may_be_kept``: the copy's own rate (the script's, as its optimizer held it) against
    the script's rate while the probes ran (each probe's highest rate over its factor)."""
    from types import SimpleNamespace

    from stabilizer_sentinel.recovery.recovery import Probe, Recovery

    def recovery(copy_rate, others=()):
        guard = SimpleNamespace(rewind=SimpleNamespace(others=list(others)))
        kept = Recovery(guard)
        kept._snapshot = SimpleNamespace(optimizer={"param_groups": [{"lr": copy_rate}]})
        return kept

    probes = [Probe(1 / 3, top=1.6 / 3), Probe(1 / 10, top=0.16)]  # the script at 1.6 while they ran
    assert recovery(1.6)._edge_may_be_kept(probes)  # a constant rate
    assert recovery(torch.tensor(2.0))._edge_may_be_kept(probes)  # a decaying one (a tensor rate read too)
    assert not recovery(0.16)._edge_may_be_kept(probes)  # a warm-up's climb since the copy
    assert not recovery(1.6, others=[(None, object())])._edge_may_be_kept(probes)  # a GAN's second optimizer
    assert not recovery(None)._edge_may_be_kept(probes)  # no rate known at the copy


def test_a_probe_whose_every_loss_is_above_every_one_of_the_best_is_never_its_equal():
    """Thrown far up at its first step and falling back fast, a probe's spread about any line is huge, so
    its standard error would tie it with anything; a rank order no noise explains tells them apart."""
    from stabilizer_sentinel.recovery.recovery import NOISE_ERRORS, Probe, edge

    thrown = Probe(1 / 10, losses=[2.3, 30000.0, 3000.0, 300.0, 30.0])  # mean 8,333, error 5,032
    best = Probe(1 / 100, losses=[2.3, 20.0, 15.0, 12.0, 10.0])  # mean 14.25
    assert thrown.score - best.score < NOISE_ERRORS * math.hypot(thrown.error, best.error)  # tied by the errors
    assert thrown.above(best) and not best.above(thrown)
    assert edge([thrown, best]) is best
    # Overlapping losses are for the errors to judge, as are probes with too few losses to rank.
    assert not Probe(1 / 3, losses=[2.0, 1.0, 1.4, 0.8, 1.3]).above(Probe(1 / 10, losses=[2.0, 1.1, 0.9, 1.2, 1.0]))
    assert not Probe(1 / 3, losses=[2.0, 9.0, 8.0]).above(Probe(1 / 10, losses=[2.0, 1.0, 1.0]))


def test_when_the_lowest_rate_probed_is_the_edge_the_job_probes_lower_before_going_on(tmp_path, monkeypatch):
    """At 3,000 times the rate the regression takes, a hundredth of it is the one rate of the first
    round that trains: the edge, with nothing probed below it. Going on there (as the job did) diverged
    again 20 steps later and ended at four times the healthy loss; the job probes the next round's
    highest rate first and goes on a notch below the edge, and ends where the healthy rate does."""
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "30")
    assert status == 0, lines[-3:]
    first = document["rollbacks"][0]
    trained = [p["factor"] for p in first["probed"] if p["failed"] is None]
    assert trained[0] == pytest.approx(1 / 100) and min(trained) < 1 / 100
    assert first["factor"] < 1 / 100
    _, healthy, _ = train(tmp_path / "healthy", monkeypatch, "--lr", "0.01", watch=False)
    assert final(lines) < 1.1 * final(healthy)


@pytest.mark.slow  # trains the regression for 300 steps, twice
def test_a_loss_that_rises_after_a_rollback_goes_back_to_the_best_copy_since_at_a_third(tmp_path, monkeypatch):
    """At 0.4 the probes keep a tenth, which trains for their five steps and is still too high for the
    run: its loss swings up for good a hundred steps on, below any finding's bound. Its windows above the
    best copy since the rollback take it back there, on at a third of that rate (no probe)."""
    status, lines, document = train(tmp_path, monkeypatch, "--lr", "0.4")
    assert status == 0, lines[-3:]
    first, back = document["rollbacks"]
    assert first["probed"] and first["learning_rate_after"] == pytest.approx(0.04)
    assert back["probed"] == [] and back["outcome"] == "recovered" and "rose above the best state" in back["message"]
    assert first["step"] <= back["restored_step"] < back["step"]
    assert back["learning_rate_after"] == pytest.approx(0.04 / 3)
    assert rates(lines)[-1] == pytest.approx(0.4)  # the script's own rate, as it wrote it: the factor is applied
    from stabilizer_sentinel.recovery import recovery

    monkeypatch.setattr(recovery, "RISE_WINDOWS", 10**9)  # the same run with no going back
    _, staying, unchanged = train(tmp_path / "staying", monkeypatch, "--lr", "0.4")
    # None went back on a rise; its swing may still jump past the bound later (on this CPU or that: AMD's
    # arithmetic took the same run past it at step 250, a probed rollback), and it ends far worse either way.
    assert unchanged["rollbacks"][0]["step"] == first["step"] and all(r["probed"] for r in unchanged["rollbacks"])
    assert final(lines) < final(staying) / 10


def test_a_copy_of_the_steps_a_rollback_undid_is_never_a_later_rollbacks_restore_point(tmp_path):
    model = torch.nn.Linear(2, 1)
    rewind = Rewind(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=tmp_path)
    rewind.companion = object()  # in-job recovery's: the first copy and the anchor are kept
    for next_step, level in [(0, None), (5, 1.0), (10, 0.5)]:
        rewind.keep(Snapshot(next_step, {}, {}, level=level))
    # A finding at step 12 rolled back to step 0; the steps after it were undone, and training went on
    # (its step numbers counting on) to a copy at step 30 whose loss is higher than the undone copy's.
    rewind.forget_after(0)
    rewind.keep(Snapshot(30, {}, {}, level=2.0))
    assert [s.next_step for s in rewind.kept()] == [0, 30] and rewind.anchor.next_step == 30
    assert restore_point(rewind, {"step": 34, "onset_step": 32}).next_step == 30


def _copies(tmp_path, first_loss, windows, keep=2, owns=()):
    """A rewind holding the first copy, its step's loss measured, then a copy every 5 steps at ``windows``,
    the first of them with the losses of their own steps, ``owns``, measured."""
    model = torch.nn.Linear(2, 1)
    rewind = Rewind(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=tmp_path, keep=keep)
    rewind.companion = object()
    rewind.keep(Snapshot(0, {}, {}))
    rewind.measured(3, 0.05)  # another step's loss: only a copy's own step measures it
    rewind.measured(0, first_loss)
    for index, level in enumerate(windows, start=1):
        rewind.keep(Snapshot(5 * index, {}, {}, level=level))
        if index <= len(owns):
            rewind.measured(5 * index, owns[index - 1])
    return rewind


def test_a_fine_tune_its_rate_wrecked_within_the_first_window_rolls_back_to_the_pretrained_state(tmp_path):
    # Every window's level is the wrecked one (the pretrained loss 0.1 lasted one step); the first copy's
    # level is the loss of the step taken from it, and the copies above it lost what it knew.
    finding = {"step": 20, "onset_step": 18}
    rewind = _copies(tmp_path, 0.1, [0.9, 0.8, 0.85])
    # The anchor stays the best window: one step's loss is not a window's mean (the first copy is held anyway).
    assert [s.level for s in rewind.kept()] == [0.1, 0.8, 0.85] and rewind.anchor.next_step == 10
    assert restore_point(rewind, finding).next_step == 0
    # Trained from scratch, the first step's loss is the highest, and a later copy is the restore point.
    assert restore_point(_copies(tmp_path, 2.3, [2.0, 1.2, 1.1]), finding).next_step == 15
    # Where the run started is a window's mean, not the first step's loss: measured from 2.3, copies that
    # drifted back to 0.9 and 1.0 from the best, 0.5, would pass for healthy ones.
    assert restore_point(_copies(tmp_path, 2.3, [0.5, 0.9, 1.0], keep=3), finding).next_step == 5


def test_a_run_never_better_than_its_first_step_rolls_back_to_the_state_before_it(tmp_path):
    # The calibration corpus's rnn-lr3.5-noclip: 3.20 at its first step, then 3.28, 4.34, 5.62, 4.20; the
    # copy at step 5 (its window's mean 4.13, within half of 3.20 of the lowest level) went on at 7.77.
    # It holds nothing the first copy lacks, and the run-up's harm.
    assert restore_point(_copies(tmp_path, 3.2, [4.13]), {"step": 6, "onset_step": 5}).next_step == 0
    # One window below the first step's loss by more than the learning check's least fall (5 %) and the
    # run had learned: the bound decides, as before.
    assert restore_point(_copies(tmp_path, 3.2, [3.0, 4.13]), {"step": 11, "onset_step": 10}).next_step == 10
    # Past its first windows (a long plateau within the noise of its first step) the bound decides too:
    # going back to the first copy would cost every step since.
    plateau = _copies(tmp_path, 2.0, [2.02 + 0.01 * (i % 3) for i in range(1, 400)])
    assert restore_point(plateau, {"step": 2001, "onset_step": 1999}).next_step == 1995


def test_a_run_whose_windows_barely_fell_goes_back_to_its_first_copy_when_the_copy_began_above_it(tmp_path):
    """The calibration corpus's transformer-lr1: 2.82 at its first step, then 2.26, 2.41, 2.85, 3.53, a
    window 1.8 % below the first step that hid the rise; the copy at step 5 began its own step at 3.28.
    Going on from it ended at 1.31 times the healthy loss; from the first copy, at the healthy loss."""
    finding = {"step": 31, "onset_step": 16}
    rewind = _copies(tmp_path, 2.82, [2.77], owns=[3.28])
    assert [(s.next_step, s.level, s.own) for s in rewind.kept()] == [(0, 2.82, 2.82), (5, 2.77, 3.28)]
    assert restore_point(rewind, finding).next_step == 0
    # onecycle-lr20: a window 4.8 % below its first step (2.30), and the copy at step 5 began at 1.44: that
    # state had learned, whatever its window's mean says.
    assert restore_point(_copies(tmp_path, 2.30, [2.19], owns=[1.44]), finding).next_step == 5
    # Its own step not measured (a loss read from the log, later): the windows alone, as before.
    assert restore_point(_copies(tmp_path, 2.82, [2.77]), finding).next_step == 5
    # A window below the first step by more than the least fall: the run learned, the bound decides.
    assert restore_point(_copies(tmp_path, 3.2, [3.0], owns=[3.5]), finding).next_step == 5


def autoencoder(lr: float, steps: int, tmp_path, monkeypatch, offset: float = 0.0) -> tuple[int, float]:
    """An autoencoder of scikit-learn's digits (ReLU bottleneck, sigmoid output, Adam) trained here with the
    library's lines and in-job recovery, ``offset`` added to its loss; (exit status, the held-out squared
    error at the end)."""
    from sklearn.datasets import load_digits

    from stabilizer_sentinel import watch

    monkeypatch.setenv("STABILIZER_CONFIG", json.dumps({"recovery": "in_job"}))
    monkeypatch.setenv("STABILIZER_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STABILIZER_FAILURE_FILE", str(tmp_path / "failure"))
    torch.manual_seed(0)
    digits = torch.tensor(load_digits().data / 16.0, dtype=torch.float32)
    train_set, held_out = digits[:1400], digits[1400:]
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64), torch.nn.Sigmoid())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    guard = watch(model, optimizer)
    status = 0
    try:
        for _ in range(steps):
            batch = train_set[torch.randint(0, len(train_set), (64,))]
            loss = torch.nn.functional.mse_loss(model(batch), batch)
            loss = loss + offset if offset else loss
            optimizer.zero_grad()
            loss.backward()
            guard.step(loss)
            optimizer.step()
    except SystemExit as stopped:
        status = int(stopped.code or 0)
    guard.close()
    with torch.no_grad():
        return status, float(torch.nn.functional.mse_loss(model(held_out), held_out))


@pytest.mark.slow  # trains an autoencoder for 150 steps, twice
def test_a_network_a_rate_too_high_killed_is_rolled_back_to_its_start_at_a_lower_rate_not_called_too_slow(
        tmp_path, monkeypatch):
    # At rate 1 (a thousand times its healthy one) every unit dies within five steps: the loss sits at
    # the targets' mean from then on, no lower than a rate too low leaves it, but the weights went far.
    status, held_out = autoencoder(1.0, 150, tmp_path / "high", monkeypatch)
    document = json.loads((tmp_path / "high" / "checkpoints" / "findings.json").read_text())
    (decision,) = document["rollbacks"]
    assert (decision["rule"], decision["restored_step"], decision["outcome"]) == ("Diverging", 0, "recovered")
    assert decision["learning_rate_after"] < 1.0 and "killed the network" in decision["message"]
    assert status == 0 and document["findings"] == [] and document["summary"]["learned"] is True
    assert held_out < 0.1  # the dead network's is 0.16; a healthy rate's 0.04 to 0.07
    # At a rate too low the weights hardly moved: that is NotLearning still, the job stopped for a higher rate.
    status, _ = autoencoder(1e-5, 110, tmp_path / "low", monkeypatch)
    (finding,) = json.loads((tmp_path / "low" / "checkpoints" / "findings.json").read_text())["findings"]
    assert (status, finding["rule"]) == (86, "NotLearning")
    # A healthy rate on a loss 1000 above its fit: it falls far beyond its noise, never by 5 % of its
    # magnitude. NotLearning is wrong there; its weights move, so it is not stopped on its way (since stop 66:
    # stabilizer_sentinel.detection.weight_motion) but found at its end, and no rollback throws its learning away.
    status, _ = autoencoder(0.01, 110, tmp_path / "offset", monkeypatch, offset=1000.0)
    document = json.loads((tmp_path / "offset" / "checkpoints" / "findings.json").read_text())
    assert (status, [f["rule"] for f in document["findings"]]) == (0, ["NotLearning"])
    assert "its weights having moved" in document["findings"][0]["message"]
    assert document.get("rollbacks", []) == []


@pytest.mark.slow  # trains an LSTM for 300 steps, watched and not
def test_a_late_learner_whose_weights_wandered_is_not_read_as_killed_and_learns_as_unwatched(tmp_path):
    # From stop 66's second verdict hunt: at its patience (step 99) the network's weights had moved 0.54 of their
    # norm, past ``MOVED``, and it was read as killed by steps too large: rolled back to its start at a lower rate
    # three times, and stopped at step 419 having learned nothing. A search wanders that far; a rate that kills
    # throws the weights further in as many steps (``Sentinel._travel``: this autoencoder at rate 1, run as a script
    # under the launcher, 44.7 at step 99).
    args = [str(FIXTURES / "loops" / "recall.py"), "--steps", "300"]
    plain = run(args, tmp_path, job_env(tmp_path / "unwatched"))
    watched = run(["-m", "stabilizer_sentinel.launch", *args], tmp_path, job_env(tmp_path, {"recovery": "in_job"}))
    assert watched.returncode == 0, watched.stderr[-2000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert (document.get("rollbacks", []), document["findings"], document["summary"]["learned"]) == ([], [], True)
    assert watched.stdout == plain.stdout and float(plain.stdout.split("heldout=")[1]) > 0.3  # chance 0.125


@pytest.mark.slow  # trains a small GPT for 250 steps under the launcher
def test_a_gpt_at_ten_thousand_times_its_rate_learns_in_its_one_job(tmp_path):
    """Its probes' five steps can call a rate the edge's notch that learns nothing for the rest of the run
    (on two threads here: a hundredth of the failing rate, where it sits at the labels' prior); the job then
    goes back to the start at a third of it (``_stalled``). On one thread the probes' second round finds a
    lower rate at once. Either way the one job learns."""
    script = Path(stabilizer.bench.__file__).with_name("gpt_loop.py")
    done = run(["-m", "stabilizer_sentinel.launch", str(script), "--width", "128", "--depth", "2", "--heads", "4",
                "--context", "64", "--vocab", "4096", "--batch", "16", "--steps", "250", "--lr", "3", "--clip",
                "0", "--log-every", "50"], tmp_path, job_env(tmp_path, {"recovery": "in_job"}, OMP_NUM_THREADS="2"),
               timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rollbacks = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())["rollbacks"]
    assert rollbacks[0]["probed"] and rollbacks[0]["restored_step"] == 0
    for before, stalled in itertools.pairwise(rollbacks):
        assert stalled["probed"] == [] and "learns nothing" in stalled["message"] and stalled["restored_step"] == 0
        assert stalled["factor"] == pytest.approx(before["factor"] / 3)
    losses = json.loads(done.stdout.splitlines()[-1])["losses"]
    assert losses["249"] < 3.0, (losses, rollbacks)  # the labels' prior is 8.0 (ln 4,096 is 8.3)


def test_a_run_that_went_on_from_its_first_copy_and_learned_nothing_in_its_patience_goes_back_there():
    """``_stalled``, window by window: the learning check's patience since the rollback with no window below
    where the run began (or the chance level, where lower) by 5 % of it."""
    from types import SimpleNamespace

    from stabilizer_sentinel.detection.learning_check import LearningCheck
    from stabilizer_sentinel.recovery.recovery import Recovery

    class Known:
        def __init__(self, value: float) -> None:
            self.value = value

        def level(self) -> float:
            return self.value

    def follow(losses: list[float], *, restored_step: int = 0, chance: float | None = 8.08,
               resumed: bool = False) -> tuple[Recovery, int]:
        model = torch.nn.Linear(2, 1)
        rewind = Rewind(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir="unused")
        rewind.companion = object()
        for next_step, level in [(0, 8.5), (5, 8.4), (10, 7.0)]:
            rewind.keep(Snapshot(next_step, {}, {}, level=level))
        learning = LearningCheck()
        for step in range(learning.window):  # the lineage's first window, closed in this process
            learning.observe(step, 8.5, None, 0.1)
        if resumed:
            learning.load_state_dict(learning.state_dict())  # as a relaunch resumes it
        learning.chance = Known(chance) if chance is not None else None
        guard = SimpleNamespace(rewind=rewind, sentinel=SimpleNamespace(learning=learning), world_size=1,
                                step_number=20)
        recovery = Recovery(guard)
        recovery._since = recovery._watch_since(next(s for s in rewind.kept() if s.next_step == restored_step))
        for step, loss in enumerate(losses):
            recovery.observed(loss)
            if recovery._back is not None:
                return recovery, step
        return recovery, -1

    prior = [8.5 - 0.4 * (1 - math.exp(-step / 20)) + 0.05 * math.sin(step) for step in range(150)]
    recovery, step = follow(prior)  # at the labels' prior: 8.08 is no fall from it
    assert recovery._back.next_step == 0 and step == 99  # the patience (100 steps) spent, at its last window
    assert recovery._since["stalled"] == pytest.approx(8.08) and recovery._since["lowest"] > 8.08 * 0.95
    assert follow(prior, chance=None)[1] == 99  # 8.5 at its first step: 8.1 is 5 % below it by a hair
    learning = [8.5 * math.exp(-step / 80) for step in range(150)]
    assert follow(learning)[1] == -1  # below the prior by more than 5 % within its patience: it learns
    assert follow(prior, restored_step=10)[1] == -1  # a rollback to a later copy: no such judgement
    assert follow(prior, resumed=True)[1] == -1  # nor in a run a relaunch resumed: its first copy had learned


@pytest.mark.slow
def test_a_loss_with_no_noise_at_its_floor_is_no_rise(tmp_path):
    """The quickstart's regression (full batch: the same loss each step) at 1.6, for 120 steps under the
    launcher: one rollback, then its loss sits at its floor, 0.01027, its windows apart by rounding alone. With
    no noise every such difference passed for a rise: it went back 44 steps at step 79, then stopped on
    VanishingGradient at step 100 as a run that did not learn, and was relaunched. A rise counts past the
    learning check's least fall too."""
    from tests.unit.sentinel.support import job_env, run, summary

    quickstart = Path(__file__).resolve().parents[4] / "examples" / "quickstart"
    env = job_env(tmp_path, {"recovery": "in_job"}, SM_CHANNEL_POINTS=str(quickstart / "data" / "points"))
    result = run(["-m", "stabilizer_sentinel.launch", str(quickstart / "src" / "fit.py"), "--lr", "1.6", "--steps",
                  "120"], tmp_path, env)
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads((tmp_path / "checkpoints" / "findings.json").read_text())
    assert [r["rule"] for r in document["rollbacks"]] == ["Diverging"], result.stderr[-2000:]
    assert summary(tmp_path)["learned"] is True and summary(tmp_path)["last_loss"] < 0.0103


def test_an_optimizer_no_rollback_held_keeps_its_own_rates():
    # A sweep's next model, trained while the first is still held, steps as another optimizer until it is taken
    # for the run's: the factor a rollback of the first chose was measured for the optimizers that rollback held.
    from stabilizer_sentinel.recovery.recovery import RateFactor

    class Factor(RateFactor):
        def __init__(self) -> None:
            self.factor, self._saved = 0.1, []

    held, later = (torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0) for _ in range(2))
    factor = Factor()
    factor.covered = frozenset({id(held)})
    rates = []
    for optimizer in (held, later):
        assert factor.scale_other(optimizer)
        rates.append(optimizer.param_groups[0]["lr"])
        factor.unscale_other(optimizer)
        assert optimizer.param_groups[0]["lr"] == 1.0  # the script's own, back after the step
    assert rates == [0.1, 1.0]
