"""Verdicts through the real definition, run by moto's Step Functions interpreter.

The first test scripts the monitor's answers: every outcome that is not a success ends in
TrainingNotRecovered with the outcome in the cause, and `stopped_early` ends in its own Succeed
state. The others put the project's real decisions behind the Lambda edge: `prepare`, `launch`
and `check` are the workflow's own pure functions, and only what each training job left behind
(DescribeTrainingJob and findings.json with its summary) is made up, so the verdict that reaches
the definition's Choice is the one the monitor earns from that evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stabilizer_workflow.evidence.observation import Observation, observe
from stabilizer_workflow.evidence.sentinel_files import FindingsDocument
from stabilizer_workflow.execution.state import WorkflowState, dump_state, load_state
from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.settings import TrainSettings
from tests.asl.harness import computed, ok
from tests.asl.test_paths import LAUNCHED, PREPARED

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
SETTINGS = TrainSettings.from_env(
    {
        "BUCKET": "stabilizer-bucket",
        "TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:stabilizer",
        "SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/stabilizer-sagemaker",
        "TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-cpu-py311",
        "SOURCE_S3_URI": "s3://stabilizer-bucket/source/sourcedir.tar.gz",
        "TRAIN_DATA_S3_URI": "s3://stabilizer-bucket/data/train",
        "TEST_DATA_S3_URI": "s3://stabilizer-bucket/data/test",
        "JOB_NAME_PREFIX": "stabilizer",
        "DEFAULT_INSTANCE_TYPE": "ml.m5.xlarge",
        "DEBUGGER_RULES_ENABLED": "false",
        "LIBRARY_S3_URI": "s3://stabilizer-bucket/library/",
        "DATA_BUCKETS": "user-bucket",  # the job below lives in a bucket granted at deploy time
        "AWS_REGION": "us-east-1",
    }
)
# A user's script with one knob: its learning rate.
USER_JOB = {
    "source": "s3://user-bucket/jobs/nll/sourcedir.tar.gz",
    "entry_point": "fit.py",
    "hyperparameters": {"lr": 0.4, "epochs": 3},
    "knobs": {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-5, "max": 1.0}},
}


def summary(**changes: Any) -> dict[str, Any]:
    """findings.json's summary of a healthy watched run (docs/contracts.md, section 2)."""
    return {
        "integration": "launcher", "ended": "completed", "exception": None, "steps_taken": 36,
        "steps_observed": 36, "steps_skipped": 0, "first_step": 0, "last_step": 35, "first_loss": 2.3,
        "last_loss": 0.41, "best_loss": 0.41, "learned": True, "started_from": None, "restores": True,
        "evaluations": [], "log_loss": {"last": 0.41, "nonfinite_step": None, "lines": 4},
        **changes,
    }


def job_end(status: str, *, summary_: dict | None = None, findings: list[dict] | None = None,
            failure: str | None = None, checkpoints: tuple[int, ...] = ()) -> Callable[[WorkflowState], Observation]:
    """What one training job left behind when it ended, as the monitor's handler would gather it."""

    def seen(state: WorkflowState) -> Observation:
        attempt = state.current
        assert attempt is not None
        response = {
            "TrainingJobName": attempt.job_name, "TrainingJobStatus": status, "SecondaryStatus": status,
            "TrainingStartTime": T0, "TrainingEndTime": T0 + timedelta(seconds=120), "TrainingTimeInSeconds": 120,
        }
        if failure:
            response["FailureReason"] = failure
        document = None
        if summary_ is not None or findings:
            document = FindingsDocument.model_validate(
                {"version": 2, "job_action": "stop", "findings": findings or [], "summary": summary_}
            )
        prefix = attempt.checkpoint_s3_uri.split("/", 3)[3]
        keys = [f"{prefix}/checkpoint-{step:08d}.pt" for step in checkpoints]
        return observe(response, findings=document, checkpoint_keys=keys)

    return seen


class RealDecisions:
    """The workflow's own prepare, launch and check behind the Lambda edge; job `n` ends as `ends[n-1]`."""

    def __init__(self, *ends: Callable[[WorkflowState], Observation]) -> None:
        self.ends = ends

    def prepare(self, event: dict) -> dict:
        return dump_state(launching.prepare(event["input"], event["execution"], SETTINGS))

    def launch(self, event: dict) -> dict:
        return dump_state(launching.launch(load_state(event["state"]), SETTINGS, T0).state)

    def check(self, event: dict) -> dict:
        state = load_state(event["state"])
        assert state.current is not None
        return dump_state(monitor.check(state, self.ends[state.current.number - 1](state), T0).state)

    def run(self, workflow, execution_input: dict):
        n = len(self.ends)
        return workflow.run(
            execution_input,
            prepare=[computed(self.prepare)],
            launch=[computed(self.launch)] * n,
            check=[computed(self.check)] * n,
        )


def _not_recovered(result, outcome: str) -> dict:
    assert result.status == "FAILED"
    assert result.states[-2:] == ["DecideNextStep", "TrainingNotRecovered"]
    assert result.error == "TrainingNotRecovered"
    assert result.cause.endswith(f"(outcome {outcome})")
    return result


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        ("did_not_learn", "NotLearning at step 29 (main): no remedy is declared for NotLearning"),
        ("unwatched", "attempt 1 completed unwatched: the script never called watch() and the launcher never attached"),
        ("unverified", "attempt 1 completed but the sentinel checked no step of 36 taken"),
        ("diverged", "Diverging at step 12 (main): every remedy for Diverging is used up or already tried"),
    ],
)
def test_a_run_without_a_verdict_of_success_fails_not_recovered(workflow, outcome, reason):
    ended = {**LAUNCHED, "next_action": "end", "outcome": outcome, "reason": reason}
    result = workflow.run({}, prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(ended)])
    _not_recovered(result, outcome)
    assert result.cause == f"{reason} (outcome {outcome})"


def test_a_run_stopped_early_is_a_success_in_its_own_state(workflow):
    reason = "LossNotDecreasing at step 90: stopped early; keeps checkpoint-00000080.pt"
    ended = {**LAUNCHED, "next_action": "end", "outcome": "stopped_early", "reason": reason}
    result = workflow.run({}, prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(ended)])
    assert result.status == "SUCCEEDED"
    assert result.states[-2:] == ["DecideNextStep", "StoppedEarlyBestCheckpointKept"]
    assert result.output == {"state": ended}


# --- the real decisions behind the Lambda edge --------------------------------------------------


def test_a_job_that_left_no_summary_ends_unwatched(workflow):
    result = RealDecisions(job_end("Completed")).run(workflow, {})
    _not_recovered(result, "unwatched")
    assert "set job.integration to launcher" in result.cause


def test_a_job_watched_over_no_step_ends_unverified(workflow):
    result = RealDecisions(job_end("Completed", summary_=summary(steps_observed=0))).run(workflow, {})
    _not_recovered(result, "unverified")
    assert "the sentinel checked no step of 36 taken" in result.cause


def test_a_loss_that_keeps_diverging_with_no_relaunch_left_ends_diverged(workflow):
    nan_in_the_log = summary(log_loss={"last": "nan", "nonfinite_step": 20, "lines": 3}, learned=None)
    result = RealDecisions(job_end("Completed", summary_=nan_in_the_log), job_end("Completed", summary_=nan_in_the_log))
    result = result.run(workflow, {"job": USER_JOB, "limits": {"max_num_retraining": 1}})
    _not_recovered(result, "diverged")
    assert result.states.count("LaunchTrainingJob") == 2
    assert "max_num_retraining" in result.cause


def test_a_crash_after_the_loss_diverged_is_relaunched_with_a_lower_rate_and_recovers(workflow):
    crashed = summary(
        ended="exception", exception="OverflowError: cannot convert float infinity to integer", steps_taken=12,
        steps_observed=12, last_step=11, first_loss=7.0, last_loss=628.0, best_loss=7.0, learned=None,
    )
    decisions = RealDecisions(
        job_end("Failed", summary_=crashed, failure="AlgorithmError: OverflowError", checkpoints=(5, 10)),
        job_end("Completed", summary_=summary(started_from="checkpoint-00000010.pt")),
    )
    result = decisions.run(workflow, {"job": USER_JOB})

    assert result.status == "SUCCEEDED"
    assert result.states[-2:] == ["DecideNextStep", "TrainingSucceeded"]
    state = result.output["state"]
    first, second = state["attempts"]
    assert (first["finding"]["rule"], first["decision"]["remedy"]) == ("Diverging", "lower_lr")
    assert "the loss rose from 7 to 628" in first["finding"]["message"]
    assert second["run_spec"]["lr"] < 0.4
    # The launcher restores, so the relaunch loads the checkpoint from before the crash.
    assert second["resumed_from"].endswith("/checkpoint-00000010.pt")
    assert state["outcome"] == "succeeded"


def test_a_plateau_after_the_run_learned_stops_early_keeping_the_best_validated_checkpoint(workflow):
    plateau = [{"rule": "LossNotDecreasing", "step": 35, "message": "the loss did not fall by 0.1 % over 10 steps"}]
    learned = summary(ended="rule_stop", evaluations=[[9, 0.9], [19, 0.5], [29, 0.7]])
    decisions = RealDecisions(
        job_end("Failed", summary_=learned, findings=plateau, failure="AlgorithmError: RuleStop: LossNotDecreasing",
                checkpoints=(10, 20, 30)),
    )
    result = decisions.run(workflow, {"job": USER_JOB, "monitoring": {"rules": [{"name": "LossNotDecreasing"}]}})

    assert result.status == "SUCCEEDED"
    assert result.states[-2:] == ["DecideNextStep", "StoppedEarlyBestCheckpointKept"]
    state = result.output["state"]
    assert state["outcome"] == "stopped_early"
    assert state["attempts"][0]["decision"]["resume_from"].endswith("/checkpoint-00000020.pt")
