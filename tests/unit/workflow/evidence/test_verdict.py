"""A verdict earned from evidence: an execution ends `succeeded` only when findings.json's summary
shows every step watched, a finite last loss and learning; every other ending says what is known
(unwatched, unverified, diverged, did_not_learn, stopped_early), and a job that dies is diagnosed
from its losses before it is called a plain failure."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument
from stabilizer_workflow.evidence.verdicts import UNWATCHED
from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import (
    ENV,
    EXECUTION,
    T0,
    describe,
    launched,
    load_event,
    observation,
    sentinel_findings,
    summary,
    watched_findings,
)

LATER = T0 + timedelta(minutes=5)
CHECKPOINTS = [f"executions/run-1/attempt-1/checkpoints/checkpoint-{s:08d}.pt" for s in (10, 20)]


def _ended(state, obs):
    result = monitor.check(state, obs, LATER)
    return result, result.state


# --- success is earned --------------------------------------------------------------------------


def test_a_run_watched_over_every_step_that_learned_succeeds(settings):
    state = launched(settings)
    result, s = _ended(state, observation(state, "Completed", findings=watched_findings()))
    assert (s.next_action, s.outcome) == ("end", "succeeded")
    assert s.reason == "attempt 1 completed (watched by the library): 36 steps checked, loss 2.3 -> 0.41, learned"
    assert s.attempts[-1].watched.steps_observed == 36
    assert result.effects.notification.event_type == "completed"


def test_a_completed_job_that_left_no_summary_ends_unwatched_and_says_how_to_watch_it(settings):
    state = launched(settings)
    result, s = _ended(state, observation(state, "Completed"))
    assert (s.next_action, s.outcome) == ("end", "unwatched")
    assert UNWATCHED in s.reason
    assert "set job.integration to launcher" in s.reason
    assert result.effects.notification.event_type == "unwatched"


def test_a_run_that_learned_by_its_cycles_succeeds_saying_so(settings):
    # Batches in a fixed order: the first window and the last loss are those of different batches.
    cycles = "its losses repeat every 10 steps (batches in a fixed order, each at a level of its own): ..."
    state = launched(settings)
    findings = watched_findings(first_loss=0.4836, last_loss=0.4775, learned_by=cycles)
    _, s = _ended(state, observation(state, "Completed", findings=findings))
    assert (s.next_action, s.outcome) == ("end", "succeeded")
    assert s.reason.endswith(f"36 steps checked, loss 0.4836 -> 0.4775, learned ({cycles})")


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"steps_observed": 0}, "the sentinel checked no step of 36 taken"),
        ({"steps_observed": 20}, "the sentinel checked 20 steps (0 skipped) of 36 taken; the rest ran unchecked"),
        ({"last_loss": None}, "no loss was seen in its 36 steps checked"),
        ({"learned": None}, "too few losses seen to judge whether it learned"),
        ({"learned": None, "unjudged": "its loss is a policy gradient's surrogate"},
         "loss 2.3 -> 0.41; its loss is a policy gradient's surrogate"),
        ({"ended": "interrupted"}, "its summary says it was interrupted (36 steps checked of 36 taken)"),
        # A run that learned, whose watcher's own code failed and stood aside (stabilizer_sentinel/failsafe.py).
        ({"watching_failed": "KeyError: 'x' at stabilizer_sentinel/detection/sentinel.py:180"},
         "the watcher failed after 36 steps checked of 36 taken (KeyError: 'x' at "
         "stabilizer_sentinel/detection/sentinel.py:180) and the rest ran unwatched"),
    ],
)
def test_a_run_watched_too_little_to_judge_is_unverified_and_says_what_is_missing(settings, changes, said):
    state = launched(settings)
    result, s = _ended(state, observation(state, "Completed", findings=watched_findings(**changes)))
    assert (s.next_action, s.outcome) == ("end", "unverified")
    assert said in s.reason
    assert result.effects.notification.event_type == "unverified"


def _judged_by_objective(says: str, improved: bool | None, readings: int, decided: bool = True, **changes: Any):
    """A summary whose objective (train:average_reward) said ``says`` of ``readings`` readings."""
    return watched_findings(objective={"name": "train:average_reward", "readings": readings, "improved": improved,
                                       "says": says, "decided": decided}, **changes)


def test_a_policy_whose_objective_rose_succeeds_by_it_where_its_surrogate_loss_could_not_say(settings):
    # A REINFORCE run: its loss a surrogate the sentinel does not judge, its reward the job's objective.
    rose = "its objective train:average_reward rose 23.07 -> 449.6 (the means of its first and last 6 of 24 readings)"
    for no_loss in ({}, {"last_loss": None, "first_loss": None, "best_loss": None}):  # with none seen, it decides
        state = launched(settings)
        findings = _judged_by_objective(rose, True, 24, learned=True, learned_by=rose,
                                        unjudged="its loss is a policy gradient's surrogate", **no_loss)
        _, s = _ended(state, observation(state, "Completed", findings=findings))
        assert (s.next_action, s.outcome) == ("end", "succeeded")
        assert s.reason == f"attempt 1 completed (watched by the library): 36 steps checked, {rose}: learned"


def test_a_policy_whose_objective_never_rose_is_not_learning_in_its_words(settings):
    flat = "its objective train:average_reward never rose beyond its noise: 20.1 -> 19.7 (...)"
    state = launched(settings)
    findings = _judged_by_objective(flat, False, 40, learned=False, learned_by=flat,
                                    unjudged="its loss is a policy gradient's surrogate")
    _, s = _ended(state, observation(state, "Completed", findings=findings))
    assert s.attempts[-1].finding.rule == "NotLearning"
    assert s.attempts[-1].finding.message == f"the summary says {flat}"


def test_an_objective_that_did_not_decide_leaves_the_verdict_to_the_loss(settings):
    state = launched(settings)
    findings = _judged_by_objective("3 finite readings of its objective ..., too few to judge", None, 3,
                                    decided=False, learned=None, unjudged="its loss is a policy gradient's surrogate")
    _, s = _ended(state, observation(state, "Completed", findings=findings))
    assert s.outcome == "unverified"
    assert s.reason.endswith("its loss is a policy gradient's surrogate; 3 finite readings of its objective ..., "
                             "too few to judge")
    # With no objective named, the reason says how to name one.
    state = launched(settings)
    findings = watched_findings(learned=None, unjudged="its loss is a policy gradient's surrogate")
    _, s = _ended(state, observation(state, "Completed", findings=findings))
    assert s.reason.endswith("; job.objective can name a metric the script prints that says whether it learned")


def test_a_run_whose_loss_and_gradients_were_zero_at_every_step_did_not_learn_and_is_not_relaunched(settings):
    # A leftover ``loss = loss * 0`` (stop 64's verdict hunt): no step had a loss or gradients other than 0, so the
    # sentinel judged none (steps_idle) and saw no loss. No remedy changes a loss multiplied by 0.
    state = launched(settings)
    idle = watched_findings(last_loss=None, first_loss=None, best_loss=None, learned=None, steps_idle=36)
    result, s = _ended(state, observation(state, "Completed", findings=idle))
    assert (s.next_action, s.outcome) == ("end", "did_not_learn")
    assert "its loss and gradients were exactly 0 at every one of its 36 steps checked: nothing trained" in s.reason
    assert result.effects.notification.event_type == "did_not_learn"
    # Idle for a part of the run only (a loss weight warmed up from 0), and no loss seen after: no verdict.
    part = watched_findings(last_loss=None, first_loss=None, best_loss=None, learned=None, steps_idle=20)
    _, s = _ended(launched(settings), observation(launched(settings), "Completed", findings=part))
    assert s.outcome == "unverified" and "no loss was seen" in s.reason


def test_steps_a_loss_scaler_skipped_count_as_watched(settings):
    state = launched(settings)
    _, s = _ended(state, observation(state, "Completed", findings=watched_findings(steps_observed=30, steps_skipped=6)))
    assert s.outcome == "succeeded"
    assert "30 steps checked, 6 skipped" in s.reason


def test_a_run_resumed_from_a_trained_state_succeeds_when_it_did_not_degrade(settings):
    state = launched(settings)
    resumed = watched_findings(learned=None, started_from="checkpoint-00000040.pt", first_loss=0.40, last_loss=0.41)
    _, s = _ended(state, observation(state, "Completed", findings=resumed))
    assert s.outcome == "succeeded"
    assert "started from checkpoint-00000040.pt, loss 0.4 -> 0.41, not degraded" in s.reason


def test_a_run_resumed_from_a_trained_state_that_degraded_did_not_learn(settings):
    state = launched(settings)
    worse = watched_findings(learned=None, started_from="checkpoint-00000040.pt", first_loss=0.40, last_loss=0.9)
    _, s = _ended(state, observation(state, "Completed", findings=worse))
    assert s.outcome == "did_not_learn"
    assert "degraded from checkpoint-00000040.pt" in s.reason


# --- the log lines are a second channel ---------------------------------------------------------


def test_a_nonfinite_loss_in_the_jobs_log_lines_is_an_explosion_even_when_no_hook_saw_it(settings):
    state = launched(settings)
    log = {"last": "nan", "nonfinite_step": 30, "lines": 4}
    _, s = _ended(state, observation(state, "Completed", findings=watched_findings(log_loss=log)))
    assert s.outcome is None and s.next_action == "launch_new"
    finding = s.attempts[0].finding
    assert (finding.rule, finding.source, finding.step) == ("Diverging", "log", 30)
    assert "the job's own loss lines printed a nan loss at step 30" in finding.message


def test_a_nonfinite_final_loss_metric_is_an_explosion_even_for_an_unwatched_job(settings):
    state = launched(settings)
    response = describe(state, "Completed")
    response["FinalMetricDataList"] = [{"MetricName": "train:loss", "Value": float("inf"), "Timestamp": LATER}]
    _, s = _ended(state, observe(response))
    assert s.next_action == "launch_new"
    assert s.attempts[0].finding.rule == "Diverging"
    assert "train:loss in DescribeTrainingJob is inf" in s.attempts[0].finding.message


def test_a_nonfinite_last_loss_in_the_summary_is_never_a_success(settings):
    state = launched(settings, {"limits": {"max_num_retraining": 0}})
    result, s = _ended(state, observation(state, "Completed", findings=watched_findings(last_loss="inf")))
    assert s.outcome == "diverged"
    assert result.effects.notification.event_type == "diverged"


def test_an_explosion_with_no_relaunch_left_ends_diverged(settings):
    state = launched(settings, {"limits": {"max_num_retraining": 0}})
    obs = observation(state, "Failed", findings=sentinel_findings(), failure_reason="AlgorithmError: RuleStop: x")
    _, s = _ended(state, obs)
    assert s.outcome == "diverged"
    assert "max_num_retraining" in s.reason


# --- a job that dies is diagnosed ---------------------------------------------------------------


@pytest.fixture
def user_job_state():
    """A user's script with one knob, the learning rate, launched once."""
    settings = TrainSettings.from_env(
        {**ENV, "LIBRARY_S3_URI": "s3://stabilizer-bucket/library/", "DATA_BUCKETS": "user-bucket"})
    job = {
        "source": "s3://user-bucket/jobs/nll/sourcedir.tar.gz",
        "entry_point": "fit.py",
        "image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-cpu-py311-ubuntu22.04-sagemaker",
        "instance_type": "ml.m5.xlarge",
        "hyperparameters": {"lr": 0.4, "epochs": 3},
        "knobs": {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-5, "max": 1.0}},
    }

    def make(**changes: Any):
        prepared = launching.prepare({"job": {**job, **changes}}, EXECUTION, settings)
        return launching.launch(prepared, settings, T0).state

    return make


def _crashed(**changes: Any) -> FindingsDocument:
    """The summary of a job that died at its 12th step with an overflow, its loss at 628 from 7."""
    crash = {
        "ended": "exception", "exception": "OverflowError: cannot convert float infinity to integer",
        "steps_taken": 12, "steps_observed": 12, "last_step": 11, "first_loss": 7.0, "last_loss": 628.0,
        "best_loss": 7.0, "learned": None,
    }
    return watched_findings(**{**crash, **changes})


def test_a_job_that_crashed_after_its_loss_diverged_is_relaunched_with_a_lower_learning_rate(user_job_state):
    state = user_job_state()
    obs = observation(state, "Failed", failure_reason="AlgorithmError: OverflowError: cannot", findings=_crashed())
    result, s = _ended(state, obs)
    assert s.next_action == "launch_new" and s.outcome is None
    finding = s.attempts[0].finding
    assert (finding.rule, finding.source) == ("Diverging", "summary")
    assert "the loss rose from 7 to 628 (90x) before the job failed (OverflowError" in finding.message
    assert s.attempts[0].decision.remedy == "lower_lr"
    assert s.run_spec["lr"] < 0.4
    assert result.effects.notification.event_type == "relaunching"


def test_a_job_that_crashed_with_a_healthy_loss_is_a_plain_failure_naming_its_exception(user_job_state):
    state = user_job_state()
    healthy = _crashed(last_loss=6.5, exception="RuntimeError: CUDA error: device-side assert triggered")
    obs = observation(state, "Failed", failure_reason="AlgorithmError: RuntimeError", findings=healthy)
    result, s = _ended(state, obs)
    assert s.outcome == "failed"
    assert s.reason == (
        "training job failed: AlgorithmError: RuntimeError; the script ended with RuntimeError: CUDA error: "
        "device-side assert triggered"
    )
    assert result.effects.notification.event_type == "failed"


# --- honest resume ------------------------------------------------------------------------------


def test_a_relaunch_says_it_starts_fresh_when_the_script_does_not_restore(user_job_state):
    state = user_job_state(integration="library")
    crashed = _crashed(restores=False)
    obs = observation(state, "Failed", failure_reason="AlgorithmError: OverflowError", findings=crashed,
                      checkpoint_keys=CHECKPOINTS)
    result, s = _ended(state, obs)
    decision = s.attempts[0].decision
    assert decision.resume_from is None and s.resume_from is None
    assert decision.reason.endswith("starts fresh (the script does not call guard.restore())")
    assert "resumes from" not in result.effects.notification.body


def test_a_relaunch_resumes_when_the_launcher_restores(user_job_state):
    state = user_job_state(integration="launcher")
    crashed = _crashed(restores=True, integration="launcher")
    obs = observation(state, "Failed", failure_reason="AlgorithmError: OverflowError", findings=crashed,
                      checkpoint_keys=CHECKPOINTS)
    _, s = _ended(state, obs)
    assert s.resume_from.endswith("/checkpoint-00000010.pt")
    assert s.attempts[0].decision.reason.endswith("resumes from checkpoint-00000010.pt")


def test_a_relaunch_says_it_starts_fresh_when_the_launcher_watched_a_loop_over_bare_tensors(user_job_state):
    state = user_job_state(integration="launcher")
    crashed = _crashed(restores=False, integration="launcher")
    obs = observation(state, "Failed", failure_reason="AlgorithmError: OverflowError", findings=crashed,
                      checkpoint_keys=CHECKPOINTS)
    _, s = _ended(state, obs)
    assert s.resume_from is None
    assert s.attempts[0].decision.reason.endswith(
        "starts fresh (the launcher watched a loop over bare tensors, which it cannot load a checkpoint into)")


# --- NotLearning, plateaus, stopping early ------------------------------------------------------


@pytest.mark.parametrize("status", ["Completed", "Failed"])
def test_a_run_that_never_learned_gets_ten_times_the_rate_twice_then_ends_did_not_learn(settings, status):
    # NotLearning: a loss that neither fell nor rose beyond its noise (a rise is Diverging): steps too
    # small to move it. The rate is raised tenfold, at most twice, then the execution says it did not learn.
    state = launching.prepare({}, EXECUTION, settings)
    now, result = T0, None
    for _ in range(10):
        if state.next_action == "end":
            break
        state = launching.launch(state, settings, now).state
        now += timedelta(minutes=10)
        findings = sentinel_findings(rule="NotLearning", step=29, phase="main")
        failure = {"failure_reason": "AlgorithmError: RuleStop: NotLearning at step 29"} if status == "Failed" else {}
        result = monitor.check(state, observe(describe(state, status, **failure), findings=findings), now)
        state = result.state
    rates = [attempt.run_spec["learning_rate"] for attempt in state.attempts]
    assert rates == pytest.approx([rates[0], 10 * rates[0], 100 * rates[0]])
    assert [a.decision.remedy for a in state.attempts[:2]] == ["raise_lr", "raise_lr"]
    assert (state.next_action, state.outcome) == ("end", "did_not_learn")
    assert "NotLearning at step 29" in state.reason
    note = result.effects.notification
    assert note.event_type == "did_not_learn"
    assert note.attributes["outcome"] == "did_not_learn"
    assert note.subject.startswith("Did not learn after 3 jobs")


def test_a_run_that_never_learned_under_the_original_ladder_is_relaunched_not_called_a_success(settings):
    state = launched(settings, {"policy": "original"})
    findings = sentinel_findings(rule="NotLearning", step=29, phase="main")
    result = monitor.check(state, observation(state, "Completed", findings=findings), LATER)
    assert result.state.next_action == "launch_new"
    assert result.state.outcome is None


def test_no_relaunch_left_for_a_run_that_never_learned_still_says_it_did_not_learn(settings):
    state = launched(settings, {"policy": "original", "limits": {"max_num_retraining": 0}})
    findings = sentinel_findings(rule="NotLearning", step=29, phase="main")
    result = monitor.check(state, observation(state, "Completed", findings=findings), LATER)
    assert result.state.outcome == "did_not_learn"
    assert "max_num_retraining" in result.state.reason


def test_a_plateau_after_the_run_learned_stops_early_keeping_the_checkpoint_of_the_best_validation(settings):
    state = launched(settings)
    # No phase (a script that does not say): the summary says it learned, and its validation loss
    # was best at step 19, so the checkpoint named 20 (the state after step 19) is kept, not the last.
    findings = sentinel_findings(
        rule="LossNotDecreasing", step=35, phase=None, learned=True, last_loss=0.6, first_loss=2.3,
        evaluations=[[9, 0.9], [19, 0.5], [29, 0.7]],
    )
    keys = [f"executions/run-1/attempt-1/checkpoints/checkpoint-{s:08d}.pt" for s in (10, 20, 30)]
    obs = observation(state, "Failed", findings=findings, checkpoint_keys=keys,
                      failure_reason="AlgorithmError: RuleStop: LossNotDecreasing at step 35")
    result, s = _ended(state, obs)
    assert (s.next_action, s.outcome) == ("end", "stopped_early")
    assert s.attempts[-1].decision.resume_from.endswith("/checkpoint-00000020.pt")
    assert "keeps checkpoint-00000020.pt, at the best validation value 0.5 (step 19)" in s.reason
    assert result.effects.notification.event_type == "stopped_early"
    assert "Best checkpoint kept: s3://" in result.effects.notification.body


def test_a_plateau_that_never_learned_costs_at_most_two_relaunches(settings):
    state = launching.prepare({}, EXECUTION, settings)
    now = T0
    for _ in range(10):
        if state.next_action == "end":
            break
        state = launching.launch(state, settings, now).state
        now += timedelta(minutes=10)
        plateau = sentinel_findings(rule="LossNotDecreasing", step=20, phase=None, learned=False, last_loss=2.3)
        obs = observe(describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: LossNotDecreasing"),
                      findings=plateau)
        state = monitor.check(state, obs, now).state
    assert state.history.num_retraining == 2
    assert len(state.attempts) == 3
    assert state.outcome == "did_not_learn"
    assert "a plateau gets at most 2 relaunches" in state.reason


def test_a_finding_never_ends_succeeded_even_with_a_healthy_summary(settings):
    state = launched(settings)
    findings = sentinel_findings(job_action="notify", **summary())
    _, s = _ended(state, observation(state, "Completed", findings=findings))
    assert s.outcome != "succeeded"
    assert s.next_action == "launch_new"


def test_vanishing_gradient_beside_a_climbing_loss_history_is_relaunched_as_a_divergence(settings):
    state = launched(settings, {"run_spec": {"add_batch_norm": 1}})
    # The finding's own loss history climbs 2.31 -> 2.95 -> nan.
    findings = sentinel_findings(rule="VanishingGradient", step=2, phase="main", last_loss=None, first_loss=None)
    _, s = _ended(state, observation(state, "Failed", findings=findings, failure_reason="AlgorithmError: RuleStop"))
    assert s.attempts[0].finding.rule == "Diverging"
    assert "VanishingGradient fired while the loss rose from 2.31 to nan" in s.attempts[0].finding.message
    assert s.attempts[0].decision.remedy == "lower_lr"
    assert s.run_spec["learning_rate"] < 0.1


def test_vanishing_gradient_after_a_climb_its_last_steps_do_not_show_is_answered_and_recorded_as_a_divergence(
    settings,
):
    # The finding's history (its last steps) is flat at 2.55; the summary shows the loss went from
    # 2.27 to 2.56 (best 1.75). One channel saying it climbed is enough: the attempt is recorded as
    # Diverging, so its rate is evidence of a failing rate and the next one is sized below it.
    state = launched(settings, {"run_spec": {"add_batch_norm": 1}})
    doc = load_event("findings-exploding.json")
    doc["findings"][0].update(rule="VanishingGradient", step=100, phase="main", learning_rate=0.1, value=1e-9)
    doc["findings"][0]["evidence"]["loss_history"] = [[step, 2.55 + 0.01 * (step % 2)] for step in range(90, 101)]
    doc["summary"].update(first_loss=2.27, last_loss=2.56, best_loss=1.75, learned=False, last_step=100,
                          steps_taken=100, steps_observed=101)
    findings = FindingsDocument.model_validate(doc)
    _, s = _ended(state, observation(state, "Failed", findings=findings, failure_reason="AlgorithmError: RuleStop"))
    assert s.attempts[0].finding.rule == "Diverging"
    assert s.attempts[0].decision.remedy == "lower_lr"
    assert s.run_spec["learning_rate"] == pytest.approx(0.025)  # a quarter of the rate it failed at


@pytest.mark.parametrize("later", ["NotLearning", "VanishingGradient"])
def test_a_run_that_does_not_learn_after_an_explosion_gets_a_lower_rate_never_a_higher_one(settings, later):
    # An explosion, then a relaunch that does not learn at its lowered rate (a loss flat at chance, dead
    # units): the rate is still too high for the recipe. Its own row would raise the rate, which an
    # explosion in this execution forbids; its after-explosion row lowers it instead of giving up.
    state = launching.prepare({}, EXECUTION, settings)
    now = T0
    for rule in ("Diverging", later):
        state = launching.launch(state, settings, now).state
        now += timedelta(minutes=10)
        flat = {} if rule == "Diverging" else {"first_loss": 2.3, "last_loss": 2.3, "best_loss": 2.29, "learned": False}
        findings = sentinel_findings(rule=rule, step=29, phase="main", **flat)
        if flat:  # its last steps flat too, not the event file's non-finite climb
            findings.findings[0].evidence["loss_history"] = [[step, 2.3] for step in range(20, 30)]
        state = monitor.check(state, observe(describe(state, "Completed"), findings=findings), now).state
    assert [a.finding.rule for a in state.attempts] == ["Diverging", later]
    assert state.next_action == "launch_new", state.reason
    second, third = state.attempts[-1].run_spec, state.run_spec
    assert state.attempts[-1].decision.remedy == "lower_lr"
    assert third["learning_rate"] == pytest.approx(second["learning_rate"] / 4)
    assert "this execution exploded (an earlier attempt" in state.attempts[-1].decision.reason
