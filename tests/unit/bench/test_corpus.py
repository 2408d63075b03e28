"""The calibration corpus's manifests, and how its benchmark judges an execution (no training here)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from stabilizer.bench import calibration as bench_corpus
from stabilizer.bench import remediation as bench
from stabilizer.bench.corpus import CORPUS_DIR, ManifestError, Run, load, load_kind, select
from stabilizer.client.inputs import check_input, localize_job
from stabilizer_workflow.execution import service_limits

RUNS = load()
REQUIRED_KINDS = {
    "onecycle_classifier", "transformer_cosine", "finetune_checkpoint", "amp_gradscaler", "grad_accumulation", "gan",
    "lbfgs", "manual_sgd", "gaussian_nll", "tiny_noisy_batch", "rnn_lm", "late_divergence", "slow_plateau",
}


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_every_corpus_run_is_an_execution_input_the_workflow_accepts(run: Run):
    for policy in bench_corpus.POLICIES:
        execution_input = run.execution_input(policy)
        check_input(execution_input)  # raises InputProblemError naming the field
        localize_job(execution_input, CORPUS_DIR)  # the source directory and entry point exist
    names = {definition["Name"]: definition["Regex"] for definition in run.job["metric_definitions"]}
    assert run.job["loss_metric"] in names
    for name in run.expect.remedy:
        assert name in run.job["hyperparameters"]


def test_the_corpus_has_thirty_healthy_and_thirty_failing_runs_across_its_kinds():
    kinds = {r.kind for r in RUNS}
    assert kinds >= REQUIRED_KINDS
    for kind in kinds:
        mine = [r for r in RUNS if r.kind == kind]
        assert any(r.healthy for r in mine), kind
        assert any(not r.healthy for r in mine), kind
    assert sum(r.healthy for r in RUNS) >= 30
    assert sum(not r.healthy for r in RUNS) >= 30


def test_a_manifest_says_truly_whether_its_script_calls_watch():
    by_kind = {r.kind: r for r in RUNS}
    calls = {kind: "sentinel.watch(" in (CORPUS_DIR / kind / "train.py").read_text() for kind in by_kind}
    for kind, run in by_kind.items():
        assert (run.watch == "library") == calls[kind], kind
    # About half the scripts use the library's three lines; the others rely on the default integration.
    assert 0.3 <= sum(calls.values()) / len(calls) <= 0.7


def test_a_malformed_manifest_is_refused_naming_the_field(tmp_path: Path):
    kind = tmp_path / "broken"
    kind.mkdir()
    (kind / "train.py").write_text("print('loss=1')\n")
    manifest = {"watch": "none", "step_regex": r"step (\d+)", "job": {"entry_point": "train.py",
                "hyperparameters": {"lr": 0.1}},
                "runs": [{"name": "a", "healthy": False,
                          "expect": {"first_attempt": "exploded", "outcome": "succeeded"}}]}
    (kind / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"runs\[0\]\.expect\.first_attempt: expected one of diverged"):
        load_kind(kind)
    manifest["runs"][0]["expect"] = {"first_attempt": "diverged", "outcome": "succeeded", "remedy": {"rate": "down"}}
    (kind / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"expect\.remedy\.rate: not one of the job's hyperparameters"):
        load_kind(kind)


def test_unknown_kinds_or_runs_are_refused_naming_them():
    with pytest.raises(ValueError, match="--kinds: unknown nope"):
        select(RUNS, kinds=["nope"])
    assert bench.main(["--corpus", "--runs", "no-such-run"]) == 64


# ---------------------------------------------------------------------------- judging one execution
def _run(name: str) -> Run:
    return select(RUNS, names=[name])[0]


def _attempt(n: int, lr: float, *, rule: str | None = None, status: str = "Completed", key: str = "lr") -> dict:
    return {"number": n, "job_name": f"j-{n}", "run_spec": {key: lr, "clip": 0.0}, "status": status,
            "finding": {"rule": rule} if rule else None}


def _log(first: int, last: int) -> str:
    return "".join(f"| step {s:4d} | loss   1.0000 | ppl 2.7\n" for s in range(first, last + 1))


def test_a_healthy_run_that_was_stopped_is_a_false_positive():
    run = _run("rnn-lr0.5-clip1")
    state = {"outcome": "succeeded", "attempts": [_attempt(1, 0.5, rule="Diverging", status="Failed"),
                                                  _attempt(2, 0.25)]}
    result = bench_corpus.measure(run, "default", state, "SUCCEEDED", [_log(0, 20), _log(0, 149)], 10.0)
    assert result.false_positive == "2 attempts (first called diverged)"
    assert (result.steps_computed, result.wasted_steps) == (21 + 150, 21)


def test_a_failing_run_that_ended_succeeded_in_one_attempt_is_a_false_negative():
    run = _run("rnn-lr3.5-noclip")
    state = {"outcome": "succeeded", "attempts": [_attempt(1, 3.5)]}
    result = bench_corpus.measure(run, "default", state, "SUCCEEDED", [_log(0, 149)], 10.0)
    assert result.false_negative == "first attempt called succeeded"
    assert not result.false_positive and not result.misdiagnosis


def test_a_relaunch_that_raises_the_rate_of_a_diverging_run_is_a_misdiagnosis():
    run = _run("rnn-lr3.5-noclip")
    state = {"outcome": "succeeded", "attempts": [_attempt(1, 3.5, rule="Diverging", status="Failed"),
                                                  _attempt(2, 7.0)]}
    result = bench_corpus.measure(run, "original", state, "SUCCEEDED", [_log(0, 6), _log(0, 149)], 10.0)
    assert result.misdiagnosis == "attempt 2: lr 3.5 -> 7.0, expected down"
    assert not result.false_negative and not result.outcome_met


def test_a_diverging_run_fixed_by_a_lower_rate_after_a_relaunch_is_a_true_positive():
    run = _run("rnn-lr3.5-noclip")
    state = {"outcome": "succeeded", "attempts": [_attempt(1, 3.5, rule="ExplodingTensor", status="Failed"),
                                                  _attempt(2, 0.875)]}
    result = bench_corpus.measure(run, "default", state, "SUCCEEDED", [_log(0, 6), _log(5, 149)], 10.0)
    assert bench_corpus.verdict(result) == "ok"
    # Resumed at step 5: 7 steps of the first attempt, 145 of the second, of which 150 are in the final lineage.
    assert (result.steps_computed, result.wasted_steps) == (152, 2)


def test_an_unfixable_run_ending_succeeded_after_relaunches_is_a_false_negative():
    run = _run("noisy-random-labels")
    state = {"outcome": "succeeded", "attempts": [_attempt(1, 0.05, rule="NotLearning", status="Failed"),
                                                  _attempt(2, 0.2)]}
    result = bench_corpus.measure(run, "default", state, "SUCCEEDED", ["", ""], 1.0)
    assert result.false_negative.startswith("ended succeeded after 2 attempts")


def _rolled_back(attempt: dict, step: int = 3, lost: int = 4, probed: int = 15) -> dict:
    return {**attempt, "rollbacks": [{"rule": "ExplodingTensor", "step": step, "restored_step": step + 1 - lost,
                                      "steps_lost": lost, "probe_steps": probed, "factor": 0.1}]}


def test_a_diverging_run_recovered_in_the_job_is_a_true_positive_whose_rolled_back_steps_are_wasted():
    run = _run("rnn-lr3.5-noclip")
    state = {"outcome": "succeeded", "attempts": [_rolled_back(_attempt(1, 3.5))]}
    result = bench_corpus.measure(run, "default", state, "SUCCEEDED", [_log(0, 149)], 10.0)
    assert bench_corpus.verdict(result) == "ok" and result.first_call == "diverged"
    assert (result.attempts, result.rollbacks, result.detection_step) == (1, 1, 3)
    assert (result.steps_computed, result.wasted_steps) == (150, 4 + 15)


def test_a_healthy_run_rolled_back_in_the_job_is_a_false_positive():
    run = _run("rnn-lr0.5-clip1")
    state = {"outcome": "succeeded", "attempts": [_rolled_back(_attempt(1, 0.5))]}
    result = bench_corpus.measure(run, "default", state, "SUCCEEDED", [_log(0, 149)], 10.0)
    assert result.false_positive == "rolled back 1 time(s) in the job (first called diverged)"


def test_a_rollback_of_a_run_whose_rate_is_too_low_is_a_misdiagnosis():
    run = _run("plateau-lr1e-6")
    assert run.expect.remedy == {"lr": "up"}
    state = {"outcome": "did_not_learn", "attempts": [_rolled_back(_attempt(1, 1e-6))]}
    result = bench_corpus.measure(run, "default", state, "FAILED", [""], 1.0)
    assert "to lower rates in the job, expected lr up" in result.misdiagnosis


def test_a_corrupt_record_is_right_only_where_no_remedy_changed_the_rate():
    """Its manifest says `keep`: the same rate trained past the batch in the job (transient) is right;
    a rollback to a lower rate, or a relaunch at one, is a misdiagnosis."""
    run = _run("noisy-corrupt-record")
    assert run.expect.remedy == {"lr": "keep"}
    passed = {**_rolled_back(_attempt(1, 0.05)), "rollbacks": [
        {**_rolled_back(_attempt(1, 0.05))["rollbacks"][0], "factor": 1.0, "transient": True}]}
    kept = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": [passed]}, "SUCCEEDED",
                                [_log(0, 299)], 1.0)
    assert bench_corpus.verdict(kept) == "ok" and kept.misdiagnosis == "" and kept.outcome_met
    lowered = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": [_rolled_back(
        _attempt(1, 0.05))]}, "SUCCEEDED", [_log(0, 299)], 1.0)
    assert "rolled back 1 time(s) to lower rates in the job, expected lr keep" in lowered.misdiagnosis
    relaunched = [_attempt(1, 0.05, rule="ExplodingTensor", status="Failed"), _attempt(2, 0.0125)]
    moved = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": relaunched}, "SUCCEEDED",
                                 [_log(0, 150), _log(0, 299)], 1.0)
    assert "attempt 2: lr 0.05 -> 0.0125, expected keep" in moved.misdiagnosis


def test_the_summary_puts_both_policies_side_by_side_per_kind_and_in_total():
    run = _run("rnn-lr3.5-noclip")
    relaunched = [_attempt(1, 3.5, rule="Diverging", status="Failed"), _attempt(2, 0.8)]
    good = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": relaunched}, "SUCCEEDED",
                                [_log(0, 6), _log(0, 149)], 5)
    missed = bench_corpus.measure(run, "original", {"outcome": "succeeded", "attempts": [_attempt(1, 3.5)]},
                                  "SUCCEEDED", [_log(0, 149)], 5)
    lines = bench_corpus.summary_lines([good, missed])
    total = next(line for line in lines if line.startswith("total"))
    # kind, runs, FP, FN, misdiagnosed, right, attempts, in job, steps, wasted: default | original
    expected = r"total\s+0/1\s+0 \| 0\s+0 \| 1\s+0 \| 0\s+1/1 \| 0/1\s+2 \| 1\s+0 \| 0\s+157 \| 150\s+7 \| 150"
    assert re.search(expected, total), total
    listing = bench_corpus.listing_lines([good, missed])
    assert "original false negatives (1):" in listing
    assert "  rnn-lr3.5-noclip: first attempt called succeeded" in listing


def test_an_execution_that_raises_becomes_a_row_naming_the_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def broken(*args: object) -> None:
        raise RuntimeError("engine broke")

    monkeypatch.setattr(bench_corpus, "execute", broken)
    result = bench_corpus._execute_by_name("gan-lr3", "default", str(tmp_path), str(tmp_path))
    assert (result.outcome, result.attempts, result.outcome_met) == ("error RuntimeError", 0, False)
    assert bench_corpus.verdict(result).startswith("FN: first attempt called none")


def test_the_recovered_quality_is_the_last_loss_over_the_best_healthy_run_of_the_kind_per_policy():
    healthy = bench_corpus.measure(_run("rnn-lr0.5-clip1"), "default",
                                   {"outcome": "succeeded", "attempts": [{**_attempt(1, 0.5),
                                                                          "watched": {"last_loss": 0.5}}]},
                                   "SUCCEEDED", [_log(0, 149)], 1.0)
    attempt = _rolled_back({**_attempt(1, 3.5), "watched": {"last_loss": 0.6}})
    recovered = bench_corpus.measure(_run("rnn-lr3.5-noclip"), "default",
                                     {"outcome": "succeeded", "attempts": [attempt]}, "SUCCEEDED", [_log(0, 149)], 1.0)
    lines = bench_corpus.quality_lines([healthy, recovered])
    assert lines[1] == "  default by last step: 0 of 1 within 10%, median ratio 1.20"
    assert "rnn-lr3.5-noclip (default): last step 0.6 / healthy 0.5 = 1.20 (1 in job, 1 job(s))" in lines[2]
    # With the mean of each run's last window (findings.json's last_window_loss), that comes first.
    healthy.final_window, recovered.final_window = 0.52, 0.55
    lines = bench_corpus.quality_lines([healthy, recovered])
    assert lines[1:3] == ["  default by last window: 1 of 1 within 10%, median ratio 1.06",
                          "  default by last step: 0 of 1 within 10%, median ratio 1.20"]
    assert lines[3] == ("  default by last window against the lowest healthy run of any setting of the kind: "
                        "1 of 1 within 10%, median ratio 1.06")
    assert "last window 0.55 / healthy 0.52 = 1.06; last step 0.6 / healthy 0.5 = 1.20" in lines[4]


def test_the_recovered_quality_is_measured_against_a_healthy_run_of_the_same_setting():
    # late_divergence: a linear model (hidden 0) and a tanh MLP (hidden 32). The MLP ends lower; a
    # linear model recovered from too high a rate is measured against the healthy linear model, not it.
    def ended(name: str, window: float) -> bench_corpus.Result:
        result = bench_corpus.measure(_run(name), "default", {"outcome": "succeeded", "attempts": [
            {**_attempt(1, 0.05), "watched": {"last_loss": window}}]}, "SUCCEEDED", [_log(0, 239)], 1.0)
        result.final_window = window
        return result

    linear, mlp, recovered = ended("late-lr0.05", 0.327), ended("late-lr0.05-mlp", 0.282), ended("late-lr2", 0.3335)
    assert linear.setting == recovered.setting != mlp.setting  # the rate is a knob's; the network is not
    lines = bench_corpus.quality_lines([linear, mlp, recovered])
    assert lines[1] == "  default by last window: 1 of 1 within 10%, median ratio 1.02"
    assert lines[3].endswith("0 of 1 within 10%, median ratio 1.18")  # against the MLP
    assert "last window 0.3335 / healthy 0.327 = 1.02" in lines[4] and "against its kind" not in lines[4]
    # Without a healthy run of its setting, its kind's best is the reference, and the line says so.
    lines = bench_corpus.quality_lines([mlp, recovered])
    assert "last window 0.3335 / healthy 0.282 = 1.18" in lines[4] and "no healthy run of its setting" in lines[4]


def test_issue_26s_target_counts_the_failing_runs_a_lower_rate_fixes_apart():
    # A rate too low (plateau-lr1e-4: its remedy raises it) and a corrupt record (its remedy keeps the rate) are no
    # fault a lower rate fixes; a twin declaring no knob shares its base's fault (a rate too high).
    assert [bench_corpus.lower_rate_fixes(_run(name)) for name in (
        "plateau-lr1e-4", "noisy-corrupt-record", "noisy-lr2", "finetune-lr5-noknobs", "rnn-lr3.5-clip-knob-only")] == [
        False, False, True, True, True]

    def ended(name: str, window: float) -> bench_corpus.Result:
        result = bench_corpus.measure(_run(name), "default", {"outcome": "succeeded", "attempts": [
            {**_attempt(1, 0.05), "watched": {"last_loss": window}}]}, "SUCCEEDED", [_log(0, 239)], 1.0)
        result.final_window = window
        return result

    healthy_plateau, healthy_noisy = ended("plateau-lr3e-3", 0.6), ended("noisy-lr0.05", 0.4)
    lines = bench_corpus.quality_lines([healthy_plateau, healthy_noisy, ended("plateau-lr1e-4", 5.0),
                                        ended("noisy-lr2", 0.42)])
    assert lines[1] == "  default by last window: 1 of 2 within 10%, median ratio 4.69"
    assert lines[2] == ("  default by last window, the runs a lower rate fixes (not those whose remedy raises the rate "
                        "or keeps it): 1 of 1 within 10%, median ratio 1.05")
    # Where every run is one a lower rate fixes, the count is the whole one: no second line.
    lines = bench_corpus.quality_lines([healthy_noisy, ended("noisy-lr2", 0.42)])
    assert "lower rate fixes" not in "\n".join(lines)


def test_the_last_window_loss_is_read_from_the_last_jobs_findings(tmp_path):
    findings = tmp_path / "findings.json"
    findings.write_text(json.dumps({"summary": {"last_loss": 0.6, "last_window_loss": 0.55}}))
    assert bench_corpus._window_loss(findings) == 0.55
    findings.write_text(json.dumps({"summary": {"last_window_loss": "nan"}}))
    assert bench_corpus._window_loss(findings) is None
    assert bench_corpus._window_loss(tmp_path / "absent.json") is None


def test_a_run_no_knob_fixes_is_right_to_end_succeeded_where_the_job_lowered_its_own_rate():
    run = _run("finetune-lr5-noknobs")
    assert "succeeded" in run.expect.outcome_in_job and "succeeded" not in run.expect.outcome
    in_job = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": [
        _rolled_back(_attempt(1, 5.0, key="ft_lr"))]}, "SUCCEEDED", [""], 1.0)
    assert in_job.outcome_met and not in_job.false_negative
    # Without a rollback in the job nothing could lower the rate (no knob to relaunch with).
    unchanged = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": [
        _attempt(1, 5.0, key="ft_lr", rule="Diverging", status="Failed"), _attempt(2, 5.0, key="ft_lr")]},
        "SUCCEEDED", ["", ""], 1.0)
    assert not unchanged.outcome_met and unchanged.false_negative.startswith("ended succeeded after 2 attempts")


def test_the_final_evaluation_is_the_last_loss_the_script_printed_for_its_final_model():
    run = _run("rnn-lr0.5-clip1")
    assert run.final_regex  # every corpus script prints one
    log = _log(0, 149) + "final_eval 0.41\n"
    result = bench_corpus.measure(run, "default", {"outcome": "succeeded", "attempts": [_attempt(1, 0.5)]},
                                  "SUCCEEDED", [_log(0, 20), log], 1.0)
    assert result.final_eval == 0.41
    # Only the last attempt's log counts; a value that is not finite or not printed is none.
    assert bench_corpus.final_evaluation(_log(0, 3), run.final_regex) is None
    assert bench_corpus.final_evaluation("final_eval nan\n", run.final_regex) is None
    assert bench_corpus.final_evaluation("final_eval 2\nfinal_eval 1.5\n", run.final_regex) == 1.5
    assert bench_corpus.final_evaluation("final_eval 1\n", "") is None


@pytest.mark.parametrize("key,bads,refusal", [
    ("final_regex", ("final_eval \\S+", "final_eval (\\S+", 3),
     "final_regex: expected a regular expression with one group"),
    ("length", ("lr", "epochs", 3), "length: expected the name of a whole-number hyperparameter"),
])
def test_a_manifest_final_regex_needs_one_group_and_its_length_a_whole_number_hyperparameter(tmp_path: Path, key,
                                                                                              bads, refusal):
    kind = tmp_path / "kind"
    shutil.copytree(CORPUS_DIR / "rnn_lm", kind)
    manifest = json.loads((kind / "manifest.json").read_text())
    for bad in bads:
        (kind / "manifest.json").write_text(json.dumps({**manifest, key: bad}))
        with pytest.raises(ManifestError, match=refusal):
            load_kind(kind)


def test_healthy_runs_are_run_again_at_the_next_seeds_and_found_by_name():
    runs = select(RUNS, kinds=["rnn_lm"])
    seeded = bench_corpus.with_seeds(runs, 3)
    healthy = [r for r in runs if r.healthy]
    assert len(seeded) == len(runs) + 2 * len(healthy)
    again = bench_corpus.by_name(RUNS, "rnn-lr0.5-clip1@seed2")
    assert (again.name, again.healthy, again.job["hyperparameters"]["seed"]) == ("rnn-lr0.5-clip1@seed2", True, 2)
    assert again.job["hyperparameters"]["lr"] == _run("rnn-lr0.5-clip1").job["hyperparameters"]["lr"]
    assert bench_corpus.setting(again.job) == bench_corpus.setting(_run("rnn-lr0.5-clip1").job)  # a draw
    # Its execution's name (the run's, the policy's and the time) is one SageMaker takes as a tag value.
    assert not service_limits.request_problems({"Tags": [
        {"Key": "stabilizer:execution", "Value": f"{again.name}-default-173300"}]})
    assert bench_corpus.with_seeds(runs, 1) == runs
    with pytest.raises(ValueError, match="--healthy-seeds: expected a whole number >= 1, got 0"):
        bench_corpus.with_seeds(runs, 0)
    # Failing runs at their next seeds too (--failing-seeds), still failing runs with their expectations.
    both = bench_corpus.with_seeds(runs, 3, failing=2)
    failing = [r for r in runs if not r.healthy]
    assert len(both) == len(runs) + 2 * len(healthy) + len(failing)
    again = bench_corpus.by_name(RUNS, "rnn-lr3.5-noclip@seed1")
    assert again in both and not again.healthy and again.expect == _run("rnn-lr3.5-noclip").expect
    with pytest.raises(ValueError, match="--failing-seeds: expected a whole number >= 1, got 0"):
        bench_corpus.with_seeds(runs, 1, failing=0)


def test_every_kind_names_the_hyperparameter_that_sets_its_length_and_runs_stretch_by_it():
    assert all(run.length and isinstance(run.job["hyperparameters"][run.length], int) for run in RUNS)
    runs = select(RUNS, names=["plateau-lr3e-3", "plateau-lr1e-3-seed1", "finetune-lr1"])
    longer = {run.name: run for run in bench_corpus.stretched(runs, 4)}
    assert [longer[name].job["hyperparameters"][key] for name, key in
            (("plateau-lr3e-3", "steps"), ("plateau-lr1e-3-seed1", "steps"), ("finetune-lr1", "ft_steps"))] \
        == [1000, 1200, 480]  # the run's own length where it sets one (300), else its kind's
    assert longer["finetune-lr1"].job["hyperparameters"]["pretrain_steps"] == 60  # the length alone
    # Stretched runs are read against healthy runs of their own length, not of the manifest's.
    assert bench_corpus.setting(longer["plateau-lr3e-3"].job) != bench_corpus.setting(_run("plateau-lr3e-3").job)
    again = bench_corpus.by_name(RUNS, "rnn-lr0.5-clip1@seed2", 3)
    assert (again.job["hyperparameters"]["steps"], again.job["hyperparameters"]["seed"]) == (450, 2)
    assert bench_corpus.stretched(runs, 1) == runs
    with pytest.raises(ValueError, match="--length: expected a whole number >= 1, got 0"):
        bench_corpus.stretched(runs, 0)
    unnamed = [dataclasses.replace(runs[0], length="")]
    with pytest.raises(ValueError, match="--length: the manifest of finetune_checkpoint names no length"):
        bench_corpus.stretched(unnamed, 2)


def test_the_recovered_quality_by_final_evaluation_is_read_against_the_median_of_the_healthy_seeds():
    def ended(name: str, evaluation: float, healthy: bool) -> bench_corpus.Result:
        result = bench_corpus.measure(bench_corpus.by_name(RUNS, name), "default", {"outcome": "succeeded",
                                      "attempts": [{**_attempt(1, 0.5), "watched": {"last_loss": 0.5}}]},
                                      "SUCCEEDED", [_log(0, 149) + f"final_eval {evaluation}\n"], 1.0)
        assert result.healthy is healthy
        return result

    healthy = [ended("rnn-lr0.5-clip1", 0.30, True), ended("rnn-lr0.5-clip1@seed1", 0.36, True),
               ended("rnn-lr0.5-clip1@seed2", 0.33, True)]
    recovered = [ended("rnn-lr3.5-noclip", 0.35, False), ended("rnn-lr6-noclip", 0.40, False)]
    lines = bench_corpus.quality_lines([*healthy, *recovered])
    assert lines[1] == ("  default by final evaluation: 1 of 2 within 10%, median ratio 1.14; 1 of 2 within the "
                        "range of the healthy seeds")
    assert "rnn-lr3.5-noclip (default): final evaluation 0.35 / healthy 0.33 = 1.06 (healthy at 3 seeds 0.3-0.36)" \
        in "\n".join(lines)
    assert "rnn-lr6-noclip (default): final evaluation 0.4 / healthy 0.33 = 1.21 (healthy at 3 seeds 0.3-0.36)" \
        in "\n".join(lines)
    assert not any("each failing run the median" in line for line in lines)  # each failing run at one seed
    # Without the seeds, the one healthy run is the reference and no range is counted.
    lines = bench_corpus.quality_lines([healthy[0], *recovered])
    assert lines[1] == "  default by final evaluation: 0 of 2 within 10%, median ratio 1.25"
    # A failing run at several seeds (--failing-seeds): a line each, then the count by each run's median.
    more = [ended("rnn-lr6-noclip@seed1", 0.34, False), ended("rnn-lr6-noclip@seed2", 0.35, False)]
    lines = bench_corpus.quality_lines([*healthy, *recovered, *more])
    assert lines[1] == ("  default by final evaluation: 3 of 4 within 10%, median ratio 1.06; 3 of 4 within the "
                        "range of the healthy seeds")
    assert lines[2] == ("  default by final evaluation, each failing run the median of its seeds (1-3 that ended "
                        "succeeded): 2 of 2 within 10%, median ratio 1.06")  # 1.06 and 0.35 / 0.33
    assert "rnn-lr6-noclip@seed2 (default): final evaluation 0.35 / healthy 0.33 = 1.06" in "\n".join(lines)


def test_the_quality_counts_come_in_the_order_of_the_measures_whichever_run_comes_first():
    def ended(name: str, evaluation: float | None) -> bench_corpus.Result:
        result = bench_corpus.measure(_run(name), "default", {"outcome": "succeeded", "attempts": [
            {**_attempt(1, 0.5), "watched": {"last_loss": 0.5}}]}, "SUCCEEDED",
            [_log(0, 149) + (f"final_eval {evaluation}\n" if evaluation is not None else "")], 1.0)
        result.final_window = 0.5
        return result

    lines = bench_corpus.quality_lines([ended("rnn-lr0.5-clip1", 0.3), ended("rnn-lr3.5-noclip", None),
                                        ended("rnn-lr6-noclip", 0.33)])
    assert [line.split(":")[0] for line in lines[1:4]] == [
        "  default by final evaluation", "  default by last window", "  default by last step"]
