"""No false success through the real definition: the outcomes that are not `succeeded` (a run that
stopped early on a plateau or overfitting, a run that never learned) end in TrainingNotRecovered,
with the outcome in the cause, as `gave_up` does."""

from __future__ import annotations

import pytest

from tests.asl.harness import ok
from tests.asl.test_paths import LAUNCHED, PREPARED


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        ("did_not_learn", "NotLearning at step 29 (main): no remedy is declared for NotLearning"),
        ("stopped_early", "LossNotDecreasing at step 90 (main): stopped early; best checkpoint checkpoint-00000080.pt"),
    ],
)
def test_a_run_without_a_trustworthy_success_fails_not_recovered(workflow, outcome, reason):
    ended = {**LAUNCHED, "next_action": "end", "outcome": outcome, "reason": reason}
    result = workflow.run({}, prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(ended)])

    assert result.status == "FAILED"
    assert result.states[-2:] == ["DecideNextStep", "TrainingNotRecovered"]
    assert result.error == "TrainingNotRecovered"
    assert result.cause == f"{reason} (outcome {outcome})"
