"""The job's own decisions (job.recovery in_job; stabilizer_workflow.remedies.in_job): each rollback in
findings.json is recorded on the attempt and told once, a recovered run is judged by its summary as any
run is, and a relaunch after one starts from the rates the job last ran."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument
from stabilizer_workflow.execution.execution_input import parse_execution_input
from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.launch.requests import CONFIG_HYPERPARAMETER, hyperparameters
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, T0, describe, launched, summary


def rollback(step: int = 4, *, after: float | None = 0.01, factor: float | None = 0.1, outcome: str = "recovered"):
    """One entry of findings.json's rollbacks as stabilizer_sentinel.recovery.recovery writes it."""
    return {
        "rule": "ExplodingTensor", "step": step, "message": f"gradient norm is non-finite at step {step}",
        "restored_step": 0, "steps_lost": step + 1, "probe_steps": 15,
        "learning_rate_before": 0.1, "learning_rate_after": after, "factor": factor,
        "probed": [{"factor": f, "learning_rate": 0.1 * f, "steps": 5, "score": 1.0, "failed": None}
                   for f in (1 / 3, 1 / 10, 1 / 30, 1 / 100)],
        "outcome": outcome, "seconds": 0.8, "resumed_at_step": step + 21,
        "finding": {"rule": "ExplodingTensor", "step": step},
    }


def own_job_settings() -> TrainSettings:
    """A deployment that takes jobs of one's own (the library's channel, the data bucket)."""
    return TrainSettings.from_env({**ENV, "LIBRARY_S3_URI": "s3://stabilizer-bucket/library/",
                                   "DATA_BUCKETS": "my-bucket"})


def own_job(lr: float) -> dict:
    """A job of one's own with its rate as its one knob."""
    return {"source": "s3://my-bucket/jobs/sourcedir.tar.gz", "entry_point": "fit.py", "hyperparameters": {"lr": lr},
            "knobs": {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 0.0001, "max": 10}}}


def document(rollbacks: list[dict], findings: list[dict] | None = None, **changes) -> FindingsDocument:
    return FindingsDocument.model_validate({"version": 2, "job_action": "stop", "findings": findings or [],
                                            "rollbacks": rollbacks, "summary": summary(**changes)})


def test_a_rollback_is_told_once_and_the_job_trains_on(settings):
    state = launched(settings)
    seen = observe(describe(state, "InProgress"), findings=document([rollback()]))
    first = monitor.check(state, seen, T0 + timedelta(minutes=5))
    note = first.effects.notification
    assert first.effects.stop_job is None and first.state.next_action == "monitor"
    assert note.event_type == "rolled_back" and note.attributes["rule"] == "ExplodingTensor"
    assert note.subject.startswith("Recovered in the job, attempt 1: ExplodingTensor at step 4")
    line = ("ExplodingTensor at step 4: back to step 0 (5 steps lost), on at rate 0.01 from 0.1, "
            "chosen from 4 rates probed in 0.8 s")
    assert line in note.body
    [kept] = first.state.attempts[-1].rollbacks
    assert (kept.step, kept.restored_step, kept.rate_after, kept.factor, len(kept.probed)) == (4, 0, 0.01, 0.1, 4)
    assert first.state.history.num_retraining == 0  # no new job

    again = monitor.check(first.state, seen, T0 + timedelta(minutes=10))
    assert again.effects.notification is None  # once per rollback
    later = observe(describe(state, "InProgress"), findings=document([rollback(), rollback(40, after=0.001,
                                                                                         factor=0.01)]))
    third = monitor.check(again.state, later, T0 + timedelta(minutes=15))
    assert [r.step for r in third.state.attempts[-1].rollbacks] == [4, 40]
    assert "ExplodingTensor at step 40" in third.effects.notification.subject


def test_a_rollback_back_to_the_best_copy_after_a_rise_says_it_probed_nothing(settings):
    # After a rollback the loss rose again for good: back to the best copy since, on at a third (no probe).
    risen = dict(rollback(104, after=0.01 / 3, factor=0.1 / 3), rule="Diverging", restored_step=80, steps_lost=25,
                 learning_rate_before=0.01, probed=[], seconds=0.1,
                 message="the loss rose above the best state since the rollback (0.05, ...)")
    state = launched(settings)
    seen = observe(describe(state, "InProgress"), findings=document([rollback(), risen]))
    told = monitor.check(state, seen, T0 + timedelta(minutes=5))
    line = ("Diverging at step 104: back to step 80 (25 steps lost), on at rate 0.00333 from 0.01: the rate the "
            "last rollback kept, a notch lower, with no probe in 0.1 s")
    assert line in told.effects.notification.body
    assert [len(r.probed) for r in told.state.attempts[-1].rollbacks] == [4, 0]


def test_a_run_recovered_in_the_job_succeeds_on_its_summary_and_says_how(settings):
    state = launched(settings)
    ended = observe(describe(state, "Completed"), findings=document([rollback()]))
    result = monitor.check(state, ended, T0 + timedelta(minutes=5))
    assert result.state.outcome == "succeeded"
    assert "learned; recovered in the job 1 time, last on at rate 0.01 (0.1 x the script's)" in result.state.reason
    assert "Decided inside the job (in-job recovery):" in result.effects.notification.body  # rides on the end's

    unlearned = observe(describe(state, "Completed"), findings=document([rollback()], learned=False, last_loss=2.3))
    assert monitor.check(state, unlearned, T0 + timedelta(minutes=5)).state.outcome != "succeeded"


def test_when_no_lower_rate_trained_the_relaunch_starts_from_the_rates_the_job_last_ran(settings):
    """The reference job's remedy after a mid-run explosion is batch norm, a network change no job makes
    to itself: the relaunch gets it, at the rates in force after the job's own rollback."""
    state = launched(settings)
    lr = state.job.knobs.learning_rate.hyperparameter
    launched_rate = state.run_spec[lr]
    # A first rollback went on at a tenth; a second found nothing lower that trains, and the job stopped.
    finding = {"rule": "ExplodingTensor", "step": 40, "phase": "main", "learning_rate": launched_rate * 0.1,
               "message": "gradient norm is non-finite at step 40", "action": "stop", "onset_step": 39}
    stopped = document([rollback(factor=0.1, after=launched_rate * 0.1),
                        rollback(40, after=None, factor=None, outcome="stopped")], [finding],
                       ended="rule_stop")
    seen = observe(describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: ExplodingTensor at step 40"),
                   findings=stopped)
    result = monitor.check(state, seen, T0 + timedelta(minutes=5))
    assert result.state.next_action == "launch_new", result.state.reason
    assert result.state.attempts[-1].decision.remedy == "add_batch_norm"
    assert result.state.run_spec[lr] == pytest.approx(launched_rate * 0.1)  # what the job last ran, not the launch
    assert "no lower rate trained" in result.state.attempts[-1].rollbacks[-1].reason


def test_the_job_recovers_in_place_only_where_the_policy_would_change_what_it_can_change_itself(settings):
    own = own_job_settings()

    def told(state) -> str:
        return json.loads(hyperparameters(state, settings)[CONFIG_HYPERPARAMETER])["recovery"]

    # The reference job declares batch norm, off: its explosions' first remedy is a network change.
    reference = launched(settings)
    assert told(reference) == "relaunch"
    with_bn = reference.model_copy(update={"run_spec": {**reference.run_spec, "add_batch_norm": 1}})
    assert told(with_bn) == "in_job"  # once batch norm is on, the next remedies are rates and clipping
    assert told(launched(settings, {"policy": "original"})) == "relaunch"

    job = own_job(1.6)
    assert told(launched(own, {"job": job})) == "in_job"
    assert told(launched(own, {"job": {**job, "recovery": "relaunch"}})) == "relaunch"
    assert told(launched(own, {"job": {k: v for k, v in job.items() if k != "knobs"}})) == "in_job"


def test_recovery_is_checked_before_anything_launches():
    with pytest.raises(InvalidInput, match=r"job.recovery: expected 'in_job' or 'relaunch'"):
        parse_execution_input({"job": {"source": "s3://b/k.tar.gz", "entry_point": "train.py", "recovery": "now"}})


def test_a_run_that_does_not_learn_after_the_job_lowered_its_rate_is_lowered_again_not_raised(settings):
    """An explosion answered in the job is an explosion of this execution: a loss that then does not fall
    says the rate is still too high (the after-explosion ladder), not too low."""
    own = own_job_settings()
    job = own_job(5.0)
    state = launched(own, {"job": job})
    finding = {"rule": "NotLearning", "step": 52, "phase": "main", "learning_rate": 0.5, "action": "stop",
               "message": "the loss never learned in 35 steps after warm-up"}
    stopped = document([rollback(3, after=0.5, factor=0.1)], [finding], ended="rule_stop", learned=False,
                       last_loss=34.7, first_loss=23.6)
    seen = observe(describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: NotLearning at step 52"),
                   findings=stopped)
    result = monitor.check(state, seen, T0 + timedelta(minutes=5))
    assert result.state.next_action == "launch_new", result.state.reason
    assert result.state.run_spec["lr"] == pytest.approx(5.0 * 0.1 * 0.25)  # a quarter of the rate in force


def test_an_explosion_a_job_answered_counts_for_the_attempts_after_it_too(settings):
    own = own_job_settings()
    job = own_job(5.0)
    state = launched(own, {"job": job})
    not_learning = {"rule": "NotLearning", "step": 52, "phase": "main", "learning_rate": 0.5, "action": "stop",
                    "message": "the loss never learned"}
    first = observe(describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: NotLearning at step 52"),
                    findings=document([rollback(3, after=0.5, factor=0.1)], [not_learning], ended="rule_stop",
                                      learned=False, last_loss=2.6, first_loss=2.6))
    relaunched = monitor.check(state, first, T0 + timedelta(minutes=5)).state
    assert relaunched.run_spec["lr"] == pytest.approx(0.125)
    second = launching.launch(relaunched, own, T0 + timedelta(minutes=6)).state
    again = observe(describe(second, "Failed", failure_reason="AlgorithmError: RuleStop: NotLearning at step 52"),
                    findings=document([], [{**not_learning, "learning_rate": 0.125}], ended="rule_stop",
                                      learned=False, last_loss=2.6, first_loss=2.6))
    result = monitor.check(second, again, T0 + timedelta(minutes=10))
    assert result.state.run_spec["lr"] < 0.125, result.state.reason  # still down, never back up


def test_a_batch_the_same_rate_trained_past_is_told_and_changes_nothing_the_policy_reads(settings):
    """A sudden explosion the same rate trained past from the restored state (a corrupt batch, a
    one-off): told as such, the recipe in force unchanged, and not an explosion of the rate: a run
    that then does not learn may still have its rate raised."""
    own = own_job_settings()
    state = launched(own, {"job": own_job(0.001)})
    passed = {**rollback(60, after=0.001, factor=1.0, outcome="transient"), "learning_rate_before": 0.001,
              "probed": [{"factor": 1.0, "learning_rate": 0.001, "steps": 5, "score": 0.3, "failed": None}],
              "probe_steps": 0}
    seen = observe(describe(state, "InProgress"), findings=document([passed]))
    told = monitor.check(state, seen, T0 + timedelta(minutes=5))
    line = ("ExplodingTensor at step 60: back to step 0 (61 steps lost); the same rate trained past it: "
            "the batch's or a one-off, on unchanged at rate 0.001")
    assert line in told.effects.notification.body and told.effects.stop_job is None
    [kept] = told.state.attempts[-1].rollbacks
    assert kept.transient and kept.factor == 1.0

    not_learning = {"rule": "NotLearning", "step": 90, "phase": "main", "learning_rate": 0.001, "action": "stop",
                    "message": "the loss never learned"}
    flat = observe(describe(state, "Failed", failure_reason="AlgorithmError: RuleStop: NotLearning at step 90"),
                   findings=document([passed], [not_learning], ended="rule_stop", learned=False, last_loss=2.6,
                                     first_loss=2.6))
    result = monitor.check(told.state, flat, T0 + timedelta(minutes=10))
    assert result.state.next_action == "launch_new" and result.state.run_spec["lr"] > 0.001, result.state.reason


def test_the_end_says_how_many_sudden_explosions_the_same_rate_trained_past(settings):
    state = launched(settings)
    passed = {**rollback(60, after=0.1, factor=1.0, outcome="transient"),
              "probed": [{"factor": 1.0, "learning_rate": 0.1, "steps": 5, "score": 0.3, "failed": None}]}
    ended = observe(describe(state, "Completed"), findings=document([rollback(), passed]))
    result = monitor.check(state, ended, T0 + timedelta(minutes=5))
    assert result.state.outcome == "succeeded"
    assert ("recovered in the job 1 time, last on at rate 0.01 (0.1 x the script's); 1 sudden explosion the same "
            "rate trained past") in result.state.reason


def test_a_bad_batch_is_named_when_told_and_the_relaunch_is_told_to_skip_it(settings):
    """The failing step's own batch failed again from the restored state and the next steps trained:
    told with where it stood, the rate unchanged, and every later job of the execution passes over it
    (the configuration's ``skip_batches``)."""
    state = launched(settings)
    bad = {**rollback(60, after=0.1, factor=1.0, outcome="bad_batch"), "probe_steps": 1,
           "probed": [{"factor": 1.0, "learning_rate": 0.1, "steps": 1, "score": None,
                       "failed": "ExplodingTensor at step 61"},
                      {"factor": 1.0, "learning_rate": 0.1, "steps": 5, "score": 0.3, "failed": None}],
           "batch": {"epoch": 1, "index": 61, "batches": 1, "fingerprints": ["ae34d7886d4ea499"]}}
    seen = observe(describe(state, "InProgress"), findings=document([bad]))
    told = monitor.check(state, seen, T0 + timedelta(minutes=5))
    line = ("ExplodingTensor at step 60: back to step 0 (61 steps lost); that step's batch (batch 61 of pass 1) "
            "failed again and the next steps trained: a bad batch, skipped (a relaunch skips it too), on unchanged "
            "at rate 0.1")
    assert line in told.effects.notification.body and told.effects.stop_job is None
    [kept] = told.state.attempts[-1].rollbacks
    assert kept.transient and kept.factor == 1.0 and kept.bad_batches == ["ae34d7886d4ea499"]
    config = json.loads(hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER])
    assert config["skip_batches"] == ["ae34d7886d4ea499"]

    ended = observe(describe(state, "Completed"), findings=document([bad]))
    assert "1 bad batch skipped" in monitor.check(told.state, ended, T0 + timedelta(minutes=10)).state.reason


def test_a_bad_batch_holding_a_corrupt_record_is_told_as_one_the_job_passes_over_wherever_it_lands(settings):
    state = launched(settings)
    bad = {**rollback(60, after=0.1, factor=1.0, outcome="bad_batch"),
           "batch": {"epoch": 1, "index": 61, "batches": 1, "fingerprints": ["ae34d7886d4ea499"], "nonfinite": True}}
    told = monitor.check(state, observe(describe(state, "InProgress"), findings=document([bad])),
                         T0 + timedelta(minutes=5))
    line = ("ExplodingTensor at step 60: back to step 0 (61 steps lost); that step's batch (batch 61 of pass 1) "
            "failed again and the next steps trained: a corrupt record (non-finite), skipped in any batch; on "
            "unchanged at rate 0.1")  # whole: within the state's bound on a reason (TEXT_MAX_BYTES)
    assert line in told.effects.notification.body
    # A relaunch is told the batch, as before, and to pass over any batch with non-finite values.
    config = json.loads(hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER])
    assert (config["skip_batches"], config["skip_nonfinite_batches"]) == (["ae34d7886d4ea499"], True)
    assert told.state.attempts[-1].rollbacks[0].corrupt_records
    plain = {**bad, "batch": {**bad["batch"], "nonfinite": False}}
    told = monitor.check(launched(settings), observe(describe(state, "InProgress"), findings=document([plain])),
                         T0 + timedelta(minutes=5))
    assert "corrupt record" not in told.effects.notification.body
    assert "skip_nonfinite_batches" not in json.loads(hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER])
    # The loop ended during the replay after the batch failed again: the relaunch is told as well.
    ended = {**bad, "outcome": "ended", "factor": None}
    told = monitor.check(launched(settings), observe(describe(state, "InProgress"), findings=document([ended])),
                         T0 + timedelta(minutes=5))
    config = json.loads(hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER])
    assert config.get("skip_nonfinite_batches") is True


def test_an_execution_without_a_bad_batch_sends_no_skip_list_and_a_malformed_fingerprint_is_not_kept(settings):
    state = launched(settings)
    assert "skip_batches" not in json.loads(hyperparameters(state, settings)[CONFIG_HYPERPARAMETER])
    odd = {**rollback(60, after=0.1, factor=1.0, outcome="bad_batch"),
           "batch": {"epoch": 1, "index": 3, "fingerprints": ["../../etc", "AE34D7886D4EA499"]}}
    told = monitor.check(state, observe(describe(state, "InProgress"), findings=document([odd])),
                         T0 + timedelta(minutes=5))
    assert told.state.attempts[-1].rollbacks[0].bad_batches == []
    assert "skip_batches" not in json.loads(hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER])


def test_a_bad_batch_without_a_fingerprint_is_counted_as_a_bad_batch_not_a_one_off(settings):
    """A batch with no tensor values to read (a custom batch object) has no fingerprint: skipped in the job,
    not passed over by a relaunch, and still a bad batch in the end's reason."""
    state = launched(settings)
    bad = {**rollback(60, after=0.1, factor=1.0, outcome="bad_batch"),
           "batch": {"epoch": 1, "index": 61, "batches": 1, "fingerprints": []}}
    told = monitor.check(state, observe(describe(state, "InProgress"), findings=document([bad])),
                         T0 + timedelta(minutes=5))
    [kept] = told.state.attempts[-1].rollbacks
    assert kept.bad_batch and kept.transient and kept.bad_batches == []
    assert "no fingerprint: not passed over again" in told.effects.notification.body
    ended = observe(describe(state, "Completed"), findings=document([bad]))
    reason = monitor.check(told.state, ended, T0 + timedelta(minutes=10)).state.reason
    assert "1 bad batch skipped" in reason and "the same rate trained past" not in reason


def test_a_run_that_ended_during_the_replay_after_its_batch_failed_again_has_its_relaunch_skip_it(settings):
    """The loop ended while the next batches trained, after the failing step's own failed again: the
    finding stands and the workflow relaunches, telling the job to pass over that batch."""
    state = launched(settings)
    ended = {**rollback(60, after=0.1, factor=1.0, outcome="ended"),
             "batch": {"epoch": 1, "index": 61, "batches": 1, "fingerprints": ["ae34d7886d4ea499"]}}
    told = monitor.check(state, observe(describe(state, "InProgress"), findings=document([ended])),
                         T0 + timedelta(minutes=5))
    [kept] = told.state.attempts[-1].rollbacks
    assert not kept.bad_batch and kept.bad_batches == ["ae34d7886d4ea499"]
    assert ("the finding stands; that step's batch (batch 61 of pass 1) had failed again, and a relaunch skips it"
            in told.effects.notification.body)
    config = json.loads(hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER])
    assert config["skip_batches"] == ["ae34d7886d4ea499"]


def test_where_the_configuration_has_no_room_for_every_bad_batch_the_oldest_give_way(settings, monkeypatch):
    from stabilizer_workflow.execution import service_limits

    state = launched(settings)
    found = ["0123456789abcdef", "fedcba9876543210", "00000000ffffffff"]
    bad = [{**rollback(60 + i, after=0.1, factor=1.0, outcome="bad_batch"),
            "batch": {"epoch": 1, "index": 3 + i, "fingerprints": [f]}} for i, f in enumerate(found)]
    told = monitor.check(state, observe(describe(state, "InProgress"), findings=document(bad)),
                         T0 + timedelta(minutes=5))
    full = hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER]
    assert json.loads(full)["skip_batches"] == found
    monkeypatch.setattr(service_limits, "HYPERPARAMETER_VALUE_MAX", len(full) - 19)  # one fingerprint too many
    trimmed = hyperparameters(told.state, settings)[CONFIG_HYPERPARAMETER]
    assert json.loads(trimmed)["skip_batches"] == found[1:] and len(trimmed) <= len(full) - 19


def test_the_next_job_is_told_the_newest_bad_batches_in_the_order_they_were_found(settings):
    """Five bad batches of four micro-batches each in one job: 20 fingerprints, of which the next job is told
    the newest 16, oldest first (the configuration drops from the front where it has no room)."""
    from stabilizer_workflow.remedies.in_job import batches_to_skip

    state = launched(settings)
    fingerprints = [f"{n:016x}" for n in range(1, 21)]
    bad = [{**rollback(10 * n, after=0.1, factor=1.0, outcome="bad_batch"),
            "batch": {"epoch": 1, "index": n, "batches": 4, "fingerprints": fingerprints[4 * n:4 * n + 4]}}
           for n in range(5)]
    told = monitor.check(state, observe(describe(state, "InProgress"), findings=document(bad)), T0)
    assert batches_to_skip(told.state) == fingerprints[4:]


def test_a_state_kept_before_the_ledger_keeps_what_it_needs_when_its_rollbacks_are_let_go(settings):
    """A state saved by a version without ``in_job`` has its bad batches, corrupt records and explosions
    in the attempts' records alone: letting those go folds them into the ledger first, the fingerprints
    as older than any it holds."""
    from stabilizer_workflow.execution.state import MAX_ROLLBACKS, load_state
    from stabilizer_workflow.remedies.in_job import batches_to_skip, corrupt_records_found

    state = launched(settings)
    corrupt = {**rollback(60, after=0.1, factor=1.0, outcome="bad_batch"),
               "batch": {"epoch": 1, "index": 61, "batches": 1, "fingerprints": ["00000000000000aa"],
                         "nonfinite": True}}
    first = monitor.check(state, observe(describe(state, "InProgress"), findings=document([corrupt, rollback(90)])),
                          T0).state
    saved = first.model_dump(mode="json")
    del saved["in_job"]  # as the version before it wrote it
    old = load_state(saved)
    assert old.in_job.skip_batches == [] and not old.in_job.exploded
    second = launching.launch(old.model_copy(update={"next_action": "launch_new"}), settings, T0).state
    later = [{**rollback(10 + n, after=0.1, factor=1.0, outcome="transient")} for n in range(MAX_ROLLBACKS)]
    after = monitor.check(second, observe(describe(second, "InProgress"), findings=document(later)), T0).state
    assert [a.rollbacks_let_go for a in after.attempts] == [2, 0]
    assert batches_to_skip(after) == ["00000000000000aa"] and corrupt_records_found(after)
    assert after.in_job.exploded
