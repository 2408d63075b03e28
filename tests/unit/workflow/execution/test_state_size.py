"""The state payload stays under Step Functions' 256 KB quota, whatever SageMaker and the job say:
text from outside is cut as it enters the state, and an input whose state could still outgrow the
quota is refused at ValidateInput, naming the field."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest

from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument
from stabilizer_workflow.execution import execution_bounds
from stabilizer_workflow.execution.state import (
    MAX_PROBED,
    MAX_ROLLBACKS,
    Attempt,
    Decision,
    Finding,
    WorkflowState,
    dump_state,
    load_state,
)
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import T0, new_state

QUOTA = 256 * 1024
HUGE = "Traceback (most recent call last): é€𝄞 " * 20_000  # multi-byte text, far over any bound
HUGE_INT = 10**4000  # Python reads JSON integers of any length (up to 4,300 digits from text)


def _bytes(state: WorkflowState) -> int:
    return len(json.dumps(dump_state(state), ensure_ascii=False).encode())


def test_a_huge_failure_reason_finding_and_reason_are_cut_as_they_enter_the_state(settings):
    state = new_state(settings)
    finding = Finding(rule=HUGE, tensor=HUGE, value=HUGE, message=HUGE)
    attempt = Attempt(number=1, job_name="stabilizer-0a1b2c3d-1", run_spec=dict(state.run_spec),
                      checkpoint_s3_uri="s3://b/executions/e/attempt-1/checkpoints", started_at=T0,
                      secondary_status=HUGE, failure_reason=HUGE, finding=finding,
                      decision=Decision(action="end", outcome="failed", remedy=HUGE, reason=HUGE))
    ended = state.model_copy(update={"attempts": [attempt], "reason": HUGE, "rule_status": HUGE})
    reloaded = load_state(json.loads(json.dumps(dump_state(WorkflowState.model_validate(ended.model_dump())))))
    assert _bytes(reloaded) < 16 * 1024
    kept = reloaded.attempts[0]
    assert kept.failure_reason.startswith("Traceback (most recent call last)") and kept.failure_reason.endswith("...")
    for text in (kept.failure_reason, kept.finding.message, kept.finding.tensor, kept.decision.reason, reloaded.reason):
        text.encode().decode()  # cut on a character boundary, still valid UTF-8


def test_the_largest_state_an_accepted_input_allows_stays_under_256_kb(settings):
    # The most relaunches the reference job's input may ask for, with the default retries, every
    # outside field at its longest and the longest names and URIs: at least the default limits.
    fits = None
    for relaunches in range(100, -1, -1):
        limits = {"max_num_retraining": relaunches, "max_infrastructure_retries": 2}
        try:
            state = new_state(settings, {"limits": limits})
        except InvalidInput:
            continue
        fits = relaunches
        break
    assert fits is not None and fits >= 10
    largest = execution_bounds.largest_state(state)
    assert len(largest.attempts) == fits + 2 + 1
    assert _bytes(largest) <= execution_bounds.STATE_BUDGET_BYTES < QUOTA


def test_an_input_whose_state_could_outgrow_the_quota_is_refused_naming_the_field(settings):
    with pytest.raises(InvalidInput, match=r"limits\.max_num_retraining: 100 relaunches .* at most \d+ relaunches fit"):
        new_state(settings, {"limits": {"max_num_retraining": 100, "max_infrastructure_retries": 10}})


def _worst_rollbacks(count: int) -> list:
    """findings.json's rollbacks at their longest: every text far over its bound, every rate as long as a
    float's text, more probes than one records, bad batches with more fingerprints than one keeps."""
    from stabilizer_workflow.evidence.sentinel_files import SentinelRollback

    wide = -2.2250738585072014e-308
    return [SentinelRollback.model_validate({
        "rule": HUGE, "step": -HUGE_INT, "message": HUGE, "restored_step": -HUGE_INT, "steps_lost": HUGE_INT,
        "probe_steps": HUGE_INT, "learning_rate_before": wide, "learning_rate_after": wide, "factor": math.inf,
        "probed": [{"factor": wide, "learning_rate": wide, "steps": HUGE_INT, "score": wide, "failed": HUGE}] * 40,
        "outcome": "bad_batch", "seconds": math.inf, "resumed_at_step": HUGE_INT,
        "batch": {"epoch": HUGE_INT, "index": HUGE_INT, "batches": HUGE_INT,
                  "fingerprints": [f"{i:016x}" for i in range(40)], "nonfinite": True}}) for _ in range(count)]


def _worst_recorded_attempt(settings):
    """The attempt the monitor itself records when everything from outside is at its longest: a
    failure reason, statuses, a finding with five endpoints, a summary (`watched`), more stragglers
    and in-job rollbacks than an attempt keeps, every text far over its bound."""
    from stabilizer_workflow.evidence.observation import observe
    from stabilizer_workflow.evidence.sentinel_files import StragglerReport, Summary
    from stabilizer_workflow.monitoring import monitor
    from tests.unit.workflow.conftest import describe, launched, sentinel_findings

    state = launched(settings)
    findings = sentinel_findings(step=-HUGE_INT)
    item = findings.findings[0]
    item.tensor, item.value, item.message = HUGE, HUGE, HUGE
    item.epoch, item.onset_step, item.learning_rate, item.stable_learning_rate = HUGE_INT, -HUGE_INT, math.inf, math.nan
    item.notify = [f"email:{i}{HUGE}" for i in range(8)]
    findings.summary = Summary(integration=HUGE, ended=HUGE, exception=HUGE, steps_taken=HUGE_INT,
                               steps_observed=-HUGE_INT, steps_skipped=HUGE_INT, first_loss=math.inf, last_loss=HUGE,
                               best_loss=-math.inf, learned=False, started_from=HUGE, restores=True,
                               evaluations=[(-HUGE_INT, -2.2250738585072014e-308)])
    findings.rollbacks = _worst_rollbacks(40)
    stragglers = [StragglerReport(rank=HUGE_INT - i, host=f"{i}{HUGE}", step=-HUGE_INT, factor=math.inf)
                  for i in range(40)]
    description = describe(state, "Failed", failure_reason=HUGE, secondary=HUGE)
    keys = [f"executions/x/checkpoints/checkpoint-{'9' * digits}.pt" for digits in (8, 19, 20, 255)]
    result = monitor.check(state, observe(description, findings=findings, stragglers=stragglers,
                                          checkpoint_keys=keys), T0)
    json.dumps(dump_state(result.state), allow_nan=False)  # JSON, as Step Functions reads it: no Infinity, no NaN
    return result.state.attempts[-1]


def test_the_largest_state_counts_every_field_an_attempt_records(settings):
    """The guard's worst case is built, not estimated: no attempt the monitor records from the
    longest outside text is larger than an attempt of `largest_state`."""
    recorded = _worst_recorded_attempt(settings)
    assert recorded.watched is not None and len(recorded.stragglers) == 16 and len(recorded.finding.notify) == 5
    assert len(recorded.rollbacks) == MAX_ROLLBACKS and len(recorded.rollbacks[0].probed) == MAX_PROBED
    largest = execution_bounds.largest_state(new_state(settings))
    *earlier, last = largest.attempts
    assert len(last.rollbacks) == MAX_ROLLBACKS and not any(a.rollbacks for a in earlier)

    def size(model) -> int:
        return len(json.dumps(model.model_dump(mode="json"), ensure_ascii=False).encode())

    # An attempt as recorded, with the execution's rollbacks; and as it is once a later one let them go.
    assert size(recorded) <= size(last)
    let_go = recorded.model_copy(update={"rollbacks": [], "rollbacks_let_go": len(recorded.rollbacks)})
    assert size(let_go) <= min(size(a) for a in earlier)
    assert all(size(r) <= size(last.rollbacks[0]) for r in recorded.rollbacks)


def test_an_execution_keeps_its_newest_rollbacks_and_what_later_jobs_need_of_every_one(settings):
    """Jobs that each roll back as often as one job can: the state records the newest ``MAX_ROLLBACKS``
    (every one of the current attempt), counts the ones let go on their attempts, and keeps every bad batch,
    the corrupt record and the explosion for the next job and the policy; its size stays within the bound
    ValidateInput checked."""
    from stabilizer_workflow.evidence.observation import observe
    from stabilizer_workflow.launch import attempts as launching
    from stabilizer_workflow.monitoring import monitor
    from stabilizer_workflow.remedies import in_job
    from tests.unit.workflow.conftest import describe, launched

    state = launched(settings)
    fingerprints = []
    for job in range(3):
        rollbacks = _worst_rollbacks(MAX_ROLLBACKS + 2)
        for n, rollback in enumerate(rollbacks):
            rollback.step, rollback.rule = n, "ExplodingTensor"
            rollback.batch.fingerprints = [f"{job:08x}{n:08x}"]
            rollback.batch.nonfinite = job == 0 and n == 0
            rollback.outcome = "bad_batch" if n < 4 else "recovered"
        fingerprints += [f"{job:08x}{n:08x}" for n in range(4)]
        running = monitor.check(state, observe(describe(state, "InProgress"),
                                               findings=FindingsDocument(version=2, rollbacks=rollbacks)), T0)
        state = running.state
        assert [r.step for r in state.current.rollbacks] == list(range(MAX_ROLLBACKS))
        assert sum(len(a.rollbacks) for a in state.attempts) == MAX_ROLLBACKS
        assert [a.rollbacks_let_go for a in state.attempts] == [MAX_ROLLBACKS] * job + [0]
        assert in_job.batches_to_skip(state) == fingerprints and in_job.corrupt_records_found(state)
        assert state.in_job.exploded
        assert _bytes(state) <= execution_bounds.STATE_BUDGET_BYTES
        state = launching.launch(state.model_copy(update={"next_action": "launch_new"}), settings,
                                 T0 + timedelta(minutes=job + 1)).state


def test_the_failure_notification_of_the_largest_accepted_state_fits_sns(settings):
    """NotifyFailure publishes {"event", "execution", "data": {"state", "error"}}: the state and the
    caught error (Step Functions: an error name of at most 256 characters and a cause of at most
    32,768, botocore's model SensitiveError and SensitiveCause). SNS takes at most 262,144 bytes
    (botocore's model, Publish Message), as Step Functions passes at most 256 KiB between states."""
    import botocore.session

    session = botocore.session.get_session()
    stepfunctions = session.get_service_model("stepfunctions")
    assert stepfunctions.shape_for("SensitiveError").metadata["max"] == execution_bounds.ERROR_NAME_MAX
    assert stepfunctions.shape_for("SensitiveCause").metadata["max"] == execution_bounds.ERROR_CAUSE_MAX
    assert "262,144 bytes" in session.get_service_model("sns").operation_model("Publish").input_shape.members[
        "Message"].documentation
    fits = next(n for n in range(100, -1, -1) if _accepted(settings, n))
    state = new_state(settings, {"limits": {"max_num_retraining": fits, "max_infrastructure_retries": 10}})
    largest = execution_bounds.largest_state(state)
    # The worst error: each character of its cause escaped in JSON ('"' -> '\\"').
    error = {"Error": "E" * execution_bounds.ERROR_NAME_MAX, "Cause": '"' * execution_bounds.ERROR_CAUSE_MAX}
    arn = f"arn:aws-iso-b:states:us-isob-east-1:123456789012:execution:{'s' * 80}:{'e' * 80}"
    message = {"event": "execution_failed", "execution": arn, "data": {"state": dump_state(largest), "error": error}}
    assert len(json.dumps(message, ensure_ascii=False).encode()) <= 262_144
    # And one more relaunch is refused: the bound is as high as it can be, not lower.
    assert not _accepted(settings, fits + 1)


def _accepted(settings, relaunches: int) -> bool:
    try:
        new_state(settings, {"limits": {"max_num_retraining": relaunches, "max_infrastructure_retries": 10}})
    except InvalidInput:
        return False
    return True


def test_the_largest_state_holds_every_knob_at_the_longest_value_a_remedy_can_set():
    """A remedy sets a knob to any float in its bounds (up to 24 characters as JSON), or to any of a choice
    knob's values: every attempt's recipe, and the decision's changes, are counted at those."""
    from tests.unit.workflow.conftest import ENV
    from tests.unit.workflow.execution.test_job import job

    own = TrainSettings.from_env({**ENV, "LIBRARY_S3_URI": "s3://stabilizer-bucket/library/",
                                  "DATA_BUCKETS": "user-bucket"})
    act = "g" * 254  # 256 characters as JSON, the most a choice value may take
    raw = {"job": job(hyperparameters={"act": "relu", "lr": 1.6, "depth": 4}, knobs={
        "activation": {"hyperparameter": "act", "type": "choice", "values": [act, "relu"]},
        "learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 10},
        "batch_size": {"hyperparameter": "depth", "type": "int", "min": 1, "max": 100000}})}
    largest = execution_bounds.largest_state(new_state(own, raw))
    for attempt in largest.attempts:
        assert attempt.run_spec == {"act": act, "lr": -2.2250738585072014e-308, "depth": 100000}
        assert attempt.decision.changes["act"] == [act, act]
