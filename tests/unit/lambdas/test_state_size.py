"""The state payload stays under Step Functions' 256 KB quota, whatever SageMaker and the job say:
text from outside is cut as it enters the state, and an input whose state could still outgrow the
quota is refused at ValidateInput, naming the field."""

from __future__ import annotations

import json

import pytest
from conftest import T0, new_state

from stabilizer_workflow import execution_bounds
from stabilizer_workflow.errors import InvalidInput
from stabilizer_workflow.state import Attempt, Decision, Finding, WorkflowState, dump_state, load_state

QUOTA = 256 * 1024
HUGE = "Traceback (most recent call last): é€𝄞 " * 20_000  # multi-byte text, far over any bound


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
    # The most relaunches the reference job's input may ask for, with every retry, every
    # outside field at its longest and the longest names and URIs.
    fits = None
    for relaunches in range(100, -1, -1):
        limits = {"max_num_retraining": relaunches, "max_infrastructure_retries": 10}
        try:
            state = new_state(settings, {"limits": limits})
        except InvalidInput:
            continue
        fits = relaunches
        break
    assert fits is not None and fits >= 10
    largest = execution_bounds.largest_state(state)
    assert len(largest.attempts) == fits + 10 + 1
    assert _bytes(largest) <= execution_bounds.STATE_BUDGET_BYTES < QUOTA


def test_an_input_whose_state_could_outgrow_the_quota_is_refused_naming_the_field(settings):
    with pytest.raises(InvalidInput, match=r"limits\.max_num_retraining: 100 relaunches .* at most \d+ relaunches fit"):
        new_state(settings, {"limits": {"max_num_retraining": 100, "max_infrastructure_retries": 10}})
