"""No false success: an execution ends `succeeded` only on an attempt that completed, stayed finite
and learned. Whatever a policy decides, a run that never learned or was stopped early says so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from conftest import T0, launched, observation, sentinel_findings
from workflow import monitor

LATER = T0 + timedelta(minutes=5)
CHECKPOINTS = [f"executions/run-1/attempt-1/checkpoints/checkpoint-{s:08d}.pt" for s in (10, 20)]


@pytest.mark.parametrize("status", ["Completed", "Failed"])
def test_a_run_that_never_learned_ends_did_not_learn(settings, status):
    state = launched(settings)
    findings = sentinel_findings(rule="NotLearning", step=29, phase="main")
    failure = {"failure_reason": "AlgorithmError: RuleStop: NotLearning at step 29"} if status == "Failed" else {}
    result = monitor.check(state, observation(state, status, findings=findings, **failure), LATER)
    assert (result.state.next_action, result.state.outcome) == ("end", "did_not_learn")
    assert "NotLearning at step 29" in result.state.reason
    note = result.effects.notification
    assert note.event_type == "did_not_learn"
    assert note.attributes["outcome"] == "did_not_learn"
    assert note.subject.startswith("Did not learn after 1 job")


def test_a_run_that_never_learned_under_the_original_ladder_is_relaunched_not_called_a_success(settings):
    state = launched(settings, {"policy": "original"})
    findings = sentinel_findings(rule="NotLearning", step=29, phase="main")
    result = monitor.check(state, observation(state, "Completed", findings=findings), LATER)
    assert result.state.next_action == "launch_new"
    assert result.state.outcome is None


def test_a_plateau_the_policy_stops_early_is_not_a_success(settings):
    state = launched(settings)
    findings = sentinel_findings(rule="LossNotDecreasing", step=25, phase="main")
    obs = observation(state, "Failed", findings=findings, checkpoint_keys=CHECKPOINTS,
                      failure_reason="AlgorithmError: RuleStop: LossNotDecreasing at step 25")
    result = monitor.check(state, obs, LATER)
    assert (result.state.next_action, result.state.outcome) == ("end", "stopped_early")
    assert result.state.attempts[-1].decision.resume_from.endswith("/checkpoint-00000020.pt")
    assert result.effects.notification.event_type == "stopped_early"


def test_a_completed_run_with_no_finding_is_the_only_success(settings):
    state = launched(settings)
    result = monitor.check(state, observation(state, "Completed"), LATER)
    assert result.state.outcome == "succeeded"
    assert result.effects.notification.event_type == "completed"


def test_no_relaunch_left_for_a_run_that_never_learned_still_says_it_did_not_learn(settings):
    state = launched(settings, {"policy": "original", "limits": {"max_num_retraining": 0}})
    findings = sentinel_findings(rule="NotLearning", step=29, phase="main")
    result = monitor.check(state, observation(state, "Completed", findings=findings), LATER)
    assert result.state.outcome == "did_not_learn"
    assert "max_num_retraining" in result.state.reason
