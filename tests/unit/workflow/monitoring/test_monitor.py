"""The monitor's decision for every training-job status and rule-evaluation status that matters."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stabilizer_workflow.errors import StateCorrupted
from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.monitoring.check_results import Effects
from tests.unit.workflow.conftest import (
    RULE_STOP,
    T0,
    describe,
    launched,
    observation,
    sentinel_findings,
    watched_findings,
)

LATER = T0 + timedelta(minutes=5)
COUNTERS = (
    "num_warmup_adjustments",
    "num_batch_layer_adjustments",
    "num_learning_rate_adjustments",
    "num_grad_clip_adjustments",
    "num_activation_adjustments",
    "num_retraining",
    "num_infrastructure_retries",
    "num_monitor_transitions",
)


def _moved(before, after) -> dict[str, int]:
    return {
        name: getattr(after.history, name) - getattr(before.history, name)
        for name in COUNTERS
        if getattr(after.history, name) != getattr(before.history, name)
    }


# --- InProgress ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule_status", [None, "InProgress", "NoIssuesFound", "Error", "Stopping", "Stopped"])
def test_in_progress_without_issues_keeps_monitoring(settings, rule_status):
    state = launched(settings)
    rules = [("ExplodingTensor", rule_status)] if rule_status else None
    result = monitor.check(state, observation(state, "InProgress", rules=rules), LATER)
    assert result.state.next_action == "monitor"
    assert result.effects.stop_job is None
    assert result.effects.notification is None
    assert result.state.job_status == "InProgress"
    assert _moved(state, result.state) == {"num_monitor_transitions": 1}


def test_in_progress_with_debugger_issues_found_stops_the_job_and_says_so(settings):
    state = launched(settings)
    rules = [("VanishingGradient", "NoIssuesFound"), ("ExplodingTensor", "IssuesFound")]
    result = monitor.check(state, observation(state, "InProgress", rules=rules), LATER)
    assert result.effects.stop_job == state.history.latest_job_name
    assert result.effects.notification.event_type == "issue_found"
    # Every rule is read, not only the first.
    assert result.state.attempts[-1].finding.rule == "ExplodingTensor"
    assert result.state.next_action == "monitor"
    # The recipe is decided once the job has stopped, so no remedy counter moves yet.
    assert _moved(state, result.state) == {"num_monitor_transitions": 1}
    assert result.state.rule_status == "VanishingGradient:NoIssuesFound, ExplodingTensor:IssuesFound"


def test_a_finding_in_notify_mode_is_announced_once_and_the_job_runs_on(settings):
    state = launched(settings)
    obs = observation(state, "InProgress", findings=sentinel_findings(job_action="notify"))
    first = monitor.check(state, obs, LATER)
    assert first.effects.stop_job is None
    assert first.state.next_action == "monitor"
    assert first.effects.notification.event_type == "issue_found"
    assert "the job runs on" in first.effects.notification.subject
    still = observation(first.state, "InProgress", findings=sentinel_findings(job_action="notify"))
    again = monitor.check(first.state, still, LATER)
    assert (again.effects.stop_job, again.effects.notification) == (None, None)


def test_a_rule_whose_debugger_actions_are_email_only_notifies_and_the_job_runs_on(settings):
    state = launched(settings)
    findings = sentinel_findings(rule="ClassImbalance")  # the job's sentinel_action is stop
    findings.findings[0].action, findings.findings[0].notify = "notify", ["email:mlteam@example.com"]
    result = monitor.check(state, observation(state, "InProgress", findings=findings), LATER)
    assert result.effects.stop_job is None and result.state.next_action == "monitor"
    note = result.effects.notification
    assert "the job runs on" in note.subject and note.attributes["notify"] == "email:mlteam@example.com"
    assert "Debugger actions of ClassImbalance: notify email:mlteam@example.com." in note.body
    assert "Email/SMS, not StopTraining" in note.body


def test_a_second_look_at_a_job_still_running_stops_again_without_a_second_message(settings):
    state = launched(settings)
    rules = [("ExplodingTensor", "IssuesFound")]
    first = monitor.check(state, observation(state, "InProgress", rules=rules), LATER).state
    second = monitor.check(first, observation(first, "InProgress", rules=rules), LATER)
    assert second.effects.stop_job == state.history.latest_job_name
    assert second.effects.notification is None


# --- Stopping / Stopped after an issue --------------------------------------------------------


def test_stopping_waits(settings):
    state = launched(settings)
    result = monitor.check(state, observation(state, "Stopping"), LATER)
    assert result.state.next_action == "monitor"
    assert result.effects == Effects()


def test_stopped_after_an_issue_relaunches_with_the_next_recipe(settings):
    state = launched(settings)
    rules = [("ExplodingTensor", "IssuesFound")]
    state = monitor.check(state, observation(state, "InProgress", rules=rules), LATER).state
    # Debugger now reports the rule as Stopped: the remembered finding still counts.
    result = monitor.check(
        state, observation(state, "Stopped", rules=[("ExplodingTensor", "Stopped")]), LATER
    )
    assert result.state.next_action == "launch_new"
    assert result.state.run_spec["add_batch_norm"] == 1
    assert result.effects.notification.event_type == "relaunching"
    assert result.effects.stop_job is None
    assert _moved(state, result.state) == {
        "num_monitor_transitions": 1,
        "num_retraining": 1,
        "num_batch_layer_adjustments": 1,
    }


def test_stopped_without_any_finding_was_stopped_outside_the_workflow(settings):
    state = launched(settings)
    result = monitor.check(state, observation(state, "Stopped"), LATER)
    assert (result.state.next_action, result.state.outcome) == ("end", "failed")
    assert "stopped outside the workflow" in result.state.reason
    assert result.effects.notification.event_type == "failed"


def test_stopped_by_max_runtime_gives_up(settings):
    state = launched(settings)
    result = monitor.check(state, observation(state, "Stopped", secondary="MaxRuntimeExceeded"), LATER)
    assert result.state.outcome == "gave_up"
    assert "MaxRuntimeInSeconds" in result.state.reason


# --- Failed ------------------------------------------------------------------------------------


def test_failed_with_rule_stop_and_findings_is_a_rule_stop_not_a_crash(settings):
    state = launched(settings)
    obs = observation(state, "Failed", failure_reason=RULE_STOP, findings=sentinel_findings())
    result = monitor.check(state, obs, LATER)
    assert result.state.next_action == "launch_new"
    finding = result.state.attempts[-1].finding
    assert (finding.rule, finding.step, finding.phase, finding.source) == (
        "ExplodingTensor",
        2,
        "warmup",
        "sentinel",
    )
    note = result.effects.notification
    assert note.event_type == "relaunching"
    assert "grad_norm_history" in note.body  # the evidence travels in the message, not the state
    assert "grad_norm_history" not in result.state.model_dump_json()


def test_failed_with_rule_stop_but_no_findings_file_recovers_the_rule_from_the_reason(settings):
    state = launched(settings)
    result = monitor.check(state, observation(state, "Failed", failure_reason=RULE_STOP), LATER)
    finding = result.state.attempts[-1].finding
    assert (finding.rule, finding.step, finding.source) == ("ExplodingTensor", 2, "failure_reason")
    assert result.state.next_action == "launch_new"


def test_failed_by_the_training_code_is_a_failure(settings):
    state = launched(settings)
    obs = observation(state, "Failed", failure_reason="AlgorithmError: ExecuteUserScriptError: KeyError 'x'")
    result = monitor.check(state, obs, LATER)
    assert (result.state.next_action, result.state.outcome) == ("end", "failed")
    assert "KeyError" in result.state.reason
    assert result.effects.notification.event_type == "failed"


def test_the_toolkits_reason_for_a_failed_script_is_told_on_one_line(settings):
    state = launched(settings)
    toolkit = ('AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "ValueError: the data is bad"\n'
               'Command "/opt/conda/bin/python3.11 fit.py --lr 1.6"')
    result = monitor.check(state, observation(state, "Failed", failure_reason=toolkit), LATER)
    assert result.state.reason == (
        'training job failed: AlgorithmError: ExecuteUserScriptError: ExitCode 1 ErrorMessage "ValueError: the data '
        'is bad" Command "/opt/conda/bin/python3.11 fit.py --lr 1.6"'
    )


def test_failed_by_sagemaker_retries_the_same_recipe_from_the_newest_checkpoint(settings):
    state = launched(settings)
    obs = observation(
        state,
        "Failed",
        failure_reason="InternalServerError: We encountered an internal error.",
        findings=watched_findings(ended="exception", learned=None),
        checkpoint_keys=[
            "executions/run-1/attempt-1/checkpoints/checkpoint-00000050.pt",
            "executions/run-1/attempt-1/checkpoints/checkpoint-00000100.pt",
        ],
    )
    result = monitor.check(state, obs, LATER)
    assert result.state.next_action == "launch_new"
    assert result.state.run_spec == state.run_spec
    assert result.state.resume_from.endswith("attempt-1/checkpoints/checkpoint-00000100.pt")
    assert "resumes from checkpoint-00000100.pt" in result.state.attempts[-1].decision.reason
    assert _moved(state, result.state) == {
        "num_monitor_transitions": 1,
        "num_retraining": 1,
        "num_infrastructure_retries": 1,
    }


def test_a_retry_after_sagemaker_failed_a_job_that_left_no_summary_says_it_starts_fresh(settings):
    state = launched(settings)
    keys = ["executions/run-1/attempt-1/checkpoints/checkpoint-00000050.pt"]
    obs = observation(state, "Failed", failure_reason="CapacityError: no capacity", checkpoint_keys=keys)
    result = monitor.check(state, obs, LATER)
    assert result.state.next_action == "launch_new"
    assert result.state.resume_from is None
    assert result.state.attempts[-1].decision.reason.endswith(
        "starts fresh (no summary of the last attempt says its script loads a checkpoint)"
    )


def test_infrastructure_retries_are_bounded(settings):
    state = launched(settings, {"limits": {"max_infrastructure_retries": 0}})
    obs = observation(
        state, "Failed", failure_reason="CapacityError: Unable to provision requested ML compute"
    )
    result = monitor.check(state, obs, LATER)
    assert result.state.outcome == "failed"
    assert "max_infrastructure_retries" in result.state.reason


def test_unreadable_findings_file_is_reported_not_ignored(settings):
    state = launched(settings)
    obs = observe(
        describe(state, "Failed", failure_reason=RULE_STOP), findings_unreadable="findings.json is not JSON"
    )
    result = monitor.check(state, obs, LATER)
    assert result.state.outcome == "gave_up"
    assert "findings.json is not JSON" in result.effects.notification.body


# --- Completed ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rules", [None, [("ExplodingTensor", "NoIssuesFound"), ("VanishingGradient", "NoIssuesFound")]]
)
def test_completed_with_no_issue_succeeds(settings, rules):
    state = launched(settings)
    result = monitor.check(state, observation(state, "Completed", rules=rules, findings=watched_findings()), LATER)
    assert (result.state.next_action, result.state.outcome) == ("end", "succeeded")
    assert result.effects.notification.event_type == "completed"
    assert result.state.attempts[-1].seconds == 120


def test_completed_with_issues_found_is_not_a_success(settings):
    state = launched(settings)
    rules = [("VanishingGradient", "NoIssuesFound"), ("ExplodingTensor", "IssuesFound")]
    result = monitor.check(state, observation(state, "Completed", rules=rules, findings=watched_findings()), LATER)
    assert result.state.outcome is None
    assert result.state.next_action == "launch_new"
    assert result.effects.notification.event_type == "relaunching"


def test_completed_with_sentinel_findings_is_not_a_success(settings):
    state = launched(settings)
    obs = observation(state, "Completed", findings=sentinel_findings(job_action="notify"))
    result = monitor.check(state, obs, LATER)
    assert result.state.outcome != "succeeded"
    assert result.state.next_action == "launch_new"


def _vanishing_notice(**summary_changes) -> FindingsDocument:
    """The sentinel told VanishingGradient at step 30 without stopping (docs/rules.md: a run whose loss learned)."""
    notice = {"rule": "VanishingGradient", "step": 30, "epoch": None, "phase": None, "learning_rate": 0.01,
              "tensor": "gradients/layer0.weight", "value": 8e-08, "action": "notify",
              "message": "mean |gradients/layer0.weight| = 8e-08 is below 1e-07 at step 30; the loss learned"}
    return watched_findings(findings=[notice], **summary_changes)


def test_a_vanishing_gradient_told_in_a_run_that_learned_is_no_failure_of_it(settings):
    state = launched(settings)
    running = monitor.check(state, observation(state, "InProgress", findings=_vanishing_notice()), LATER)
    assert running.state.next_action == "monitor" and running.effects.stop_job is None
    assert "the job runs on" in running.effects.notification.subject
    done = monitor.check(running.state, observation(running.state, "Completed", findings=_vanishing_notice()), LATER)
    assert (done.state.next_action, done.state.outcome) == ("end", "succeeded")
    assert "learned; told: VanishingGradient at step 30" in done.state.reason
    assert done.state.attempts[-1].finding is None
    # The same notice in a run that never learned is acted on, as every finding of a completed job is.
    flat = monitor.check(state, observation(state, "Completed", findings=_vanishing_notice(learned=False)), LATER)
    assert flat.state.outcome != "succeeded" and flat.state.next_action == "launch_new"


def _range_test_notice(**summary_changes) -> FindingsDocument:
    """The sentinel told Diverging at step 44, a rate range test's blow-up the script meant (its ``told``), and
    judged the run afresh after the test (``judged_afresh``)."""
    told = "a rate range test: the script raises its rate at every step until the loss blows up, by design"
    notice = {"rule": "Diverging", "step": 44, "learning_rate": 3.2, "value": 1.0e4, "action": "notify", "told": told,
              "message": "the loss 1.009e+04 jumped above 3278; the script raises its rate 1.42 times at each step"}
    return watched_findings(findings=[notice], judged_afresh=[[48, "a rate range test ended"]], **summary_changes)


def test_a_finding_the_script_meant_is_no_failure_of_the_run_its_evidence_decides(settings):
    # Stop 71: an LR finder's script, healthy, was relaunched six times for its range test's blow-up and ended
    # `diverged`; the sentinel had told the finding and acted on nothing.
    state = launched(settings)
    running = monitor.check(state, observation(state, "InProgress", findings=_range_test_notice()), LATER)
    assert running.state.next_action == "monitor" and running.effects.stop_job is None
    done = monitor.check(running.state, observation(running.state, "Completed", findings=_range_test_notice()), LATER)
    assert (done.state.next_action, done.state.outcome) == ("end", "succeeded")
    assert "learned; told: Diverging at step 44 (a rate range test: " in done.state.reason
    assert done.state.attempts[-1].finding is None
    # The training after the test is judged: one that never learned is acted on, as any run that did not learn.
    flat = monitor.check(state, observation(state, "Completed", findings=_range_test_notice(learned=False)), LATER)
    assert flat.state.outcome != "succeeded" and flat.state.next_action == "launch_new"
    assert flat.state.attempts[-1].finding.rule == "NotLearning"
    # A run that ended inside the test, past its blow-up, was not judged: never called a success.
    cut = _range_test_notice(learned=None, unjudged="the run ended inside a rate range test, past its blow-up")
    ended = monitor.check(state, observation(state, "Completed", findings=cut), LATER)
    assert ended.state.outcome == "unverified" and "inside a rate range test" in ended.state.reason
    # The same Diverging without ``told`` is the run's, as every finding of a completed job is.
    plain = _range_test_notice()
    plain.findings[0].told = None
    acted = monitor.check(state, observation(state, "Completed", findings=plain), LATER)
    assert acted.state.next_action == "launch_new"


def test_completed_while_a_rule_is_still_evaluating_waits_for_its_verdict(settings):
    state = launched(settings)
    rules = [("ExplodingTensor", "NoIssuesFound"), ("VanishingGradient", "InProgress")]
    result = monitor.check(state, observation(state, "Completed", rules=rules, findings=watched_findings()), LATER)
    assert result.state.next_action == "monitor"
    assert result.state.outcome is None


@pytest.mark.parametrize("rule_status", ["Error", "Stopping", "Stopped"])
def test_completed_with_a_rule_that_gave_no_verdict_succeeds_but_says_so(settings, rule_status):
    state = launched(settings)
    rules = [("ExplodingTensor", rule_status), ("VanishingGradient", "NoIssuesFound")]
    result = monitor.check(state, observation(state, "Completed", rules=rules, findings=watched_findings()), LATER)
    assert result.state.outcome == "succeeded"
    assert f"no verdict for ExplodingTensor ({rule_status})" in result.state.reason
    assert f"ExplodingTensor:{rule_status}" in result.state.rule_status


def test_an_ended_attempt_stops_lingering_rule_evaluation_jobs(settings):
    state = launched(settings)
    rules = [
        ("ExplodingTensor", "IssuesFound"),
        ("VanishingGradient", "InProgress"),
        ("Overfit", "NoIssuesFound"),
    ]
    result = monitor.check(state, observation(state, "Failed", failure_reason=RULE_STOP, rules=rules), LATER)
    name = state.history.latest_job_name
    assert result.effects.stop_processing_jobs == (f"{name}-vanishinggradient",)


# --- Limits ------------------------------------------------------------------------------------


def test_monitor_transition_cap_ends_the_execution_and_stops_the_job(settings):
    state = launched(settings, {"limits": {"max_monitor_transitions": 2}})
    first = monitor.check(state, observation(state, "InProgress"), LATER)
    assert first.state.next_action == "monitor"
    second = monitor.check(first.state, observation(state, "InProgress"), LATER)
    assert (second.state.next_action, second.state.outcome) == ("end", "gave_up")
    assert second.effects.stop_job == state.history.latest_job_name
    assert second.effects.notification.event_type == "gave_up"
    assert "max_monitor_transitions" in second.state.reason


def test_training_budget_cap_ends_a_running_job(settings):
    state = launched(settings, {"limits": {"max_total_training_seconds": 600}})
    obs = observation(state, "InProgress", start=T0)
    result = monitor.check(state, obs, T0 + timedelta(seconds=601))
    assert result.state.outcome == "gave_up"
    assert result.effects.stop_job == state.history.latest_job_name
    assert "training budget" in result.state.reason


def test_retraining_cap_blocks_a_relaunch(settings):
    state = launched(settings, {"limits": {"max_num_retraining": 0}})
    obs = observation(state, "Failed", failure_reason=RULE_STOP, findings=sentinel_findings())
    result = monitor.check(state, obs, LATER)
    # An explosion with no relaunch left: the loss diverged and stays so.
    assert (result.state.next_action, result.state.outcome) == ("end", "diverged")
    assert "max_num_retraining" in result.state.reason
    assert result.effects.notification.event_type == "diverged"
    assert _moved(state, result.state) == {"num_monitor_transitions": 1}


def test_check_refuses_a_state_for_another_job(settings):
    state = launched(settings)
    obs = observation(state, "InProgress").model_copy(update={"job_name": "someone-else"})
    with pytest.raises(StateCorrupted, match="latest_job_name"):
        monitor.check(state, obs, LATER)


def test_check_does_not_mutate_its_input(settings):
    state = launched(settings)
    before = state.model_dump_json()
    monitor.check(
        state, observation(state, "Failed", failure_reason=RULE_STOP, findings=sentinel_findings()), LATER
    )
    assert state.model_dump_json() == before


# --- Abort -------------------------------------------------------------------------------------


def test_abort_stops_a_running_job_and_reports_the_caught_error(settings):
    state = launched(settings)
    error = {"Error": "TransientAwsError", "Cause": "DescribeTrainingJob: ThrottlingException: Rate exceeded"}
    result = monitor.abort(state, error, observation(state, "InProgress"), LATER)
    assert (result.state.next_action, result.state.outcome) == ("end", "failed")
    assert result.state.reason.startswith("TransientAwsError: DescribeTrainingJob")
    assert result.effects.stop_job == state.history.latest_job_name
    assert result.effects.notification.event_type == "failed"


def test_abort_of_a_job_already_over_does_not_stop_it(settings):
    state = launched(settings)
    result = monitor.abort(state, {"Error": "States.Timeout"}, observation(state, "Completed"), LATER)
    assert result.effects.stop_job is None


def test_abort_without_an_observation_stops_blind(settings):
    state = launched(settings)
    result = monitor.abort(state, None, None, LATER)
    assert result.effects.stop_job == state.history.latest_job_name


def test_findings_document_accepts_the_contract_example():
    doc = sentinel_findings()
    assert isinstance(doc, FindingsDocument)
    assert doc.findings[0].value == "nan"


# --- Debugger's profiler rules ---------------------------------------------------------------


def test_debugger_profiler_rules_report_apart_and_are_read_and_stopped_like_the_others(settings):
    """Debugger reports its profiler rules (ProfilerRuleConfigurations) in DescribeTrainingJob's
    ProfilerRuleEvaluationStatuses, not in DebugRuleEvaluationStatuses (SageMaker API Reference,
    DescribeTrainingJob and ProfilerRuleEvaluationStatus; botocore's model below). Each runs as a
    processing job (RuleEvaluationJobArn); StopTrainingJob's documentation says nothing of them, so an
    ended attempt stops the ones still running with StopProcessingJob, as for the debug rules."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    output = model.operation_model("DescribeTrainingJob").output_shape.members
    profiler, debug = output["ProfilerRuleEvaluationStatuses"].member, output["DebugRuleEvaluationStatuses"].member
    assert set(profiler.members) == set(debug.members) >= {"RuleConfigurationName", "RuleEvaluationJobArn",
                                                           "RuleEvaluationStatus", "StatusDetails"}
    assert profiler.members["RuleEvaluationStatus"].enum == debug.members["RuleEvaluationStatus"].enum
    state = launched(settings)
    # A verdict of a profiler rule is a finding like any other.
    fired = monitor.check(state, observation(state, "InProgress", profiler_rules=[("StepOutlier", "IssuesFound")]),
                          LATER)
    assert fired.state.attempts[-1].finding.rule == "StepOutlier"
    assert fired.state.attempts[-1].finding.source == "debugger"
    assert fired.effects.stop_job == state.history.latest_job_name
    assert "StepOutlier:IssuesFound" in fired.state.rule_status
    # A completed job waits for a profiler rule still evaluating ...
    pending = observation(state, "Completed", profiler_rules=[("StepOutlier", "InProgress")],
                          findings=watched_findings())
    assert monitor.check(state, pending, LATER).state.next_action == "monitor"
    # ... and an ended attempt stops the profiler rule jobs still running, as the debug ones.
    description = describe(state, "Failed", failure_reason=RULE_STOP, rules=[("NLPSequenceRatio", "InProgress")],
                           profiler_rules=[("StepOutlier", "InProgress"), ("BatchSize", "NoIssuesFound")])
    ended = monitor.check(state, observe(description), LATER)
    name = state.history.latest_job_name
    assert set(ended.effects.stop_processing_jobs) == {f"{name}-nlpsequenceratio", f"{name}-stepoutlier"}


def _debugger_rule_with(actions: str):
    return {"run_spec": {"rules": [{"name": "NLPSequenceRatio",
                                    "parameters": {"token_values": "0", "action_json": actions}}]}}


def test_a_debugger_verdict_follows_the_rules_own_actions(debugger_settings):
    """Debugger's actions are carried out by the monitor, not by Debugger's rule job: StopTraining (or
    no action) stops the job; Email/SMS alone notify and the job runs on, naming the endpoints."""
    email = '[{"name": "email", "endpoint": "mlteam@example.com"}]'
    state = launched(debugger_settings, _debugger_rule_with(email))
    issues = observation(state, "InProgress", rules=[("NLPSequenceRatio", "IssuesFound")])
    result = monitor.check(state, issues, LATER)
    assert result.effects.stop_job is None and result.state.next_action == "monitor"
    note = result.effects.notification
    assert note.attributes["notify"] == "email:mlteam@example.com" and "the job runs on" in note.subject
    stop = launched(debugger_settings, _debugger_rule_with('[{"name": "stoptraining"}]'))
    stopped = monitor.check(stop, observation(stop, "InProgress", rules=[("NLPSequenceRatio", "IssuesFound")]), LATER)
    assert stopped.effects.stop_job == stop.history.latest_job_name
