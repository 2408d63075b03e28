"""Every path through the real definition, run by moto's Step Functions interpreter.

Lambda answers are scripted at the Invoke edge (see harness.py); the definition, its Retry and
Catch matching, Choice, Wait and Fail are the interpreter's. Each test asserts the state sequence
from the execution history and what each Lambda received.
"""

from __future__ import annotations

import json

from tests.asl.harness import DEFINITION, ok, raises, sleeps


def state(job: str | None = None, **fields) -> dict:
    """A state payload with the paths the definition reads (docs/contracts.md, section 4).

    `wait_seconds` is 30: the scripted watch function wakes the execution (the job ended) long
    before that, so paths run in milliseconds and a path that waited the full time would show.
    """
    payload = {
        "version": 1,
        "next_action": "launch_new",
        "wait_seconds": 30,
        "outcome": None,
        "reason": None,
        "history": {"latest_job_name": job},
        "attempts": [],
    }
    payload.update(fields)
    return payload


PREPARED = state()
LAUNCHED = state("stabilizer-exec-1-1", next_action="monitor", attempts=[{"job_name": "stabilizer-exec-1-1"}])
WATCHING = {**LAUNCHED, "attempts": [{"job_name": "stabilizer-exec-1-1", "status": "InProgress"}]}
COMPLETED = {**LAUNCHED, "next_action": "end", "outcome": "succeeded", "reason": "attempt 1 completed"}


def _task_failures(outcome, state_name: str) -> list[dict]:
    """TaskFailed events of one state, in order (each retry shows as another failure)."""
    current, failures = None, []
    for event in outcome.events:
        if "stateEnteredEventDetails" in event:
            current = event["stateEnteredEventDetails"]["name"]
        if event["type"] == "TaskFailed" and current == state_name:
            failures.append(event["taskFailedEventDetails"])
    return failures


def test_invalid_input_fails_without_launch(workflow):
    outcome = workflow.run(
        {"wait_seconds": "soon"},
        prepare=[raises("InvalidInput", "wait_seconds: expected an integer >= 0, got 'soon'")],
    )

    assert outcome.status == "FAILED"
    assert outcome.states == ["ValidateInput", "RejectInput"]
    assert outcome.error == "InvalidInput"
    assert "wait_seconds" in json.loads(outcome.cause)["errorMessage"]
    assert outcome.actions() == ["prepare"]
    assert outcome.notifications == []


def test_prepare_receives_input_and_execution(workflow):
    outcome = workflow.run(
        {"learning_rate": 0.05},
        prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(COMPLETED)],
    )

    prepare = outcome.events_of("prepare")[0]
    assert prepare["input"] == {"learning_rate": 0.05}
    assert prepare["execution"]["name"] == "exec-1"
    assert prepare["execution"]["id"].endswith(":exec-1")
    assert prepare["execution"]["start_time"]


def test_launch_monitor_succeeds(workflow):
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[ok(LAUNCHED)],
        check=[ok(WATCHING), ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "AwaitJobChange", "CheckJobAndRules", "DecideNextStep",
        "AwaitJobChange", "CheckJobAndRules", "DecideNextStep", "TrainingSucceeded",
    ]
    # Each Lambda gets the state the previous one returned; the output is the last state.
    assert outcome.events_of("launch")[0]["state"] == PREPARED
    assert [event["state"] for event in outcome.events_of("check")] == [LAUNCHED, WATCHING]
    assert outcome.output == {"state": COMPLETED}


def test_exploding_then_relaunch(workflow):
    exploded = {**LAUNCHED, "next_action": "launch_new",
                "attempts": [{"job_name": "stabilizer-exec-1-1", "finding": {"rule": "ExplodingTensor"}}]}
    relaunched = {**exploded, "next_action": "monitor", "history": {"latest_job_name": "stabilizer-exec-1-2"}}
    recovered = {**relaunched, "next_action": "end", "outcome": "succeeded"}

    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[ok(LAUNCHED), ok(relaunched)],
        check=[ok(exploded), ok(recovered)],
    )

    assert outcome.status == "SUCCEEDED"
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "AwaitJobChange", "CheckJobAndRules", "DecideNextStep",
        "LaunchTrainingJob", "AwaitJobChange", "CheckJobAndRules", "DecideNextStep", "TrainingSucceeded",
    ]
    assert outcome.events_of("launch")[1]["state"] == exploded
    assert outcome.output == {"state": recovered}


def test_throttled_twice_then_launches(workflow):
    throttled = "SageMaker CreateTrainingJob: ThrottlingException (Rate exceeded)"
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[raises("TransientAwsError", throttled), raises("TransientAwsError", throttled), ok(LAUNCHED)],
        check=[ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    assert outcome.actions() == ["prepare", "launch", "launch", "launch", "await", "check"]
    assert [f["error"] for f in _task_failures(outcome, "LaunchTrainingJob")] == ["TransientAwsError"] * 2
    # Back-off with full jitter: each wait is at most 2 s, then 4 s (2 s x 2.0).
    assert len(outcome.retry_sleeps) == 2
    assert 0 <= outcome.retry_sleeps[0] <= 2
    assert 0 <= outcome.retry_sleeps[1] <= 4
    assert outcome.states.count("LaunchTrainingJob") == 1


def test_capacity_error_retries_longer(workflow):
    no_capacity = "ResourceLimitExceeded: account-level service limit 'ml.m5.xlarge for training job usage'"
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[raises("CapacityUnavailable", no_capacity), raises("CapacityUnavailable", no_capacity),
                ok(LAUNCHED)],
        check=[ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    assert [f["error"] for f in _task_failures(outcome, "LaunchTrainingJob")] == ["CapacityUnavailable"] * 2
    # 60 s, then 120 s, no jitter: longer than any transient back-off (capped at 30 s).
    assert outcome.retry_sleeps == [60, 120]


def test_capacity_never_available_stops_notifies_and_fails(workflow):
    no_capacity = "ResourceLimitExceeded: no ml.m5.xlarge capacity"
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[raises("CapacityUnavailable", no_capacity)] * 6,
        stop_launch=[ok({"stopped": []})],
        abort=[ok(PREPARED)],
    )

    assert outcome.status == "FAILED"
    assert outcome.error == "CapacityUnavailable"
    assert outcome.actions() == ["prepare"] + ["launch"] * 6 + ["stop_launch", "abort"]
    assert outcome.retry_sleeps == [60, 120, 240, 480, 600]  # capped by MaxDelaySeconds
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "StopJobOfFailedLaunch", "StopJobAndNotify", "FailWithOriginalError",
    ]


def test_a_used_up_quota_fails_at_once_naming_it(workflow):
    quota = ("CreateTrainingJob stabilizer-0a1b2c3d-1: ResourceLimitExceeded: The account-level service limit "
             "'ml.p3.2xlarge for training job usage' is 0 Instances. the SageMaker quota "
             "'ml.p3.2xlarge for training job usage' is used up: request an increase in Service Quotas")
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[raises("ServiceQuotaExceeded", quota)],
        stop_launch=[ok({"stopped": []})],
        abort=[ok(PREPARED)],
    )

    assert outcome.status == "FAILED"
    assert outcome.error == "ServiceQuotaExceeded"
    assert outcome.retry_sleeps == []  # no 25 minutes of back-off for a quota that will not move
    assert "ml.p3.2xlarge for training job usage" in json.loads(outcome.cause)["errorMessage"]


def test_a_launch_that_fails_after_creating_its_job_stops_that_job(workflow):
    # The notification after CreateTrainingJob was refused: the job exists, the state does not know it.
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[raises("AwsRequestRejected", "Publish launched: AuthorizationError")],
        stop_launch=[ok({"stopped": ["stabilizer-exec-1-1"], "job_name": "stabilizer-exec-1-1"})],
        abort=[ok(PREPARED)],
    )

    assert outcome.status == "FAILED" and outcome.error == "AwsRequestRejected"
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "StopJobOfFailedLaunch", "StopJobAndNotify", "FailWithOriginalError",
    ]
    [stop] = outcome.events_of("stop_launch")
    assert stop["state"] == PREPARED  # the state the launch started from: the watch function derives the name
    assert outcome.events_of("abort")[0]["error"]["Error"] == "AwsRequestRejected"


def test_a_failure_to_stop_the_launchs_job_still_aborts_with_the_original_error(workflow):
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[raises("AwsRequestRejected", "CreateTrainingJob: ValidationException")],
        stop_launch=[raises("AccessDenied", "StopTrainingJob: AccessDeniedException")],
        abort=[ok(PREPARED)],
    )

    assert outcome.states[-3:] == ["StopJobOfFailedLaunch", "StopJobAndNotify", "FailWithOriginalError"]
    assert outcome.error == "AwsRequestRejected"


def test_unexpected_error_stops_job_notifies_and_fails(workflow):
    denied = "SageMaker DescribeTrainingJob: AccessDeniedException"
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[ok(LAUNCHED)],
        check=[raises("AwsRequestRejected", denied)],
        abort=[ok({**LAUNCHED, "next_action": "end", "outcome": "failed"})],
    )

    assert outcome.status == "FAILED"
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "AwaitJobChange", "CheckJobAndRules",
        "StopJobAndNotify", "FailWithOriginalError",
    ]
    # The abort gets the state (with the job to stop) and the original error, and the execution
    # fails with that error and cause, not with anything from the clean-up.
    abort = outcome.events_of("abort")[0]
    assert abort["state"] == LAUNCHED
    assert abort["state"]["history"]["latest_job_name"] == "stabilizer-exec-1-1"
    assert abort["error"]["Error"] == "AwsRequestRejected"
    assert outcome.error == "AwsRequestRejected"
    assert outcome.cause == abort["error"]["Cause"]
    assert json.loads(outcome.cause)["errorMessage"] == denied
    # The monitor notifies; the state machine's own fallback publish is not used.
    assert outcome.notifications == []


def test_failed_abort_falls_back_to_topic_and_keeps_original_error(workflow):
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[ok(LAUNCHED)],
        check=[raises("StateCorrupted", "attempts.0.job_name: field required")],
        abort=[raises("AwsRequestRejected", "SNS Publish: AuthorizationError")],
    )

    assert outcome.status == "FAILED"
    assert outcome.states[-3:] == ["StopJobAndNotify", "NotifyFailure", "FailWithOriginalError"]
    assert outcome.error == "StateCorrupted"
    [notification] = outcome.notifications
    assert notification["event"] == "execution_failed"
    assert notification["execution"].endswith(":exec-1")
    assert notification["data"]["error"]["Error"] == "StateCorrupted"
    # The job that may still be running is named in the message.
    assert notification["data"]["state"]["history"]["latest_job_name"] == "stabilizer-exec-1-1"
    # The abort's own error is in the history (its TaskFailed), not in the message or the data.
    assert set(notification["data"]) == {"state", "error"}
    assert _task_failures(outcome, "StopJobAndNotify")[-1]["error"] == "AwsRequestRejected"


def test_the_failure_notification_of_the_largest_state_with_the_largest_error_reaches_the_topic(workflow):
    """The state is held to STATE_BUDGET_BYTES at input; with the largest error Step Functions records
    beside it (a cause of 32,768 characters, here every one escaped again in JSON), the fallback
    notification still fits SNS's 262,144 bytes, which moto's SNS enforces as SNS does (Publish:
    "Invalid parameter: Message too long"), so it is published, not lost."""
    from stabilizer_workflow.execution.execution_bounds import ERROR_CAUSE_MAX, STATE_BUDGET_BYTES

    def sized(payload: dict) -> dict:
        padded = {**payload, "pad": ""}  # the definition reads only its own paths of the state
        padded["pad"] = "p" * (STATE_BUDGET_BYTES - len(json.dumps(padded)))
        assert len(json.dumps(padded)) == STATE_BUDGET_BYTES
        return padded

    # The Lambda's error body is {"errorType", "errorMessage", "stackTrace"}: quotes in the message are
    # escaped in the cause, and escaped again where the cause sits in the data.
    message = '"' * ((ERROR_CAUSE_MAX - 200) // 2)
    outcome = workflow.run(
        {},
        prepare=[ok(sized(PREPARED))],
        launch=[ok(sized(LAUNCHED))],
        check=[raises("StateCorrupted", message)],
        abort=[raises("AwsRequestRejected", message)],
    )
    assert outcome.states[-3:] == ["StopJobAndNotify", "NotifyFailure", "FailWithOriginalError"]
    assert len(outcome.cause) <= ERROR_CAUSE_MAX
    [notification] = outcome.notifications
    assert len(json.dumps(notification).encode()) <= 262_144
    assert notification["data"]["error"]["Error"] == "StateCorrupted"
    assert notification["data"]["state"]["history"]["latest_job_name"] == "stabilizer-exec-1-1"


def test_unexpected_error_before_any_state_notifies_and_fails(workflow):
    outcome = workflow.run(
        {},
        prepare=[raises("AwsRequestRejected", "S3 HeadObject data/train/x.npy: AccessDenied")],
    )

    assert outcome.status == "FAILED"
    assert outcome.states == ["ValidateInput", "NotifyFailureBeforeLaunch", "FailWithOriginalError"]
    assert outcome.error == "AwsRequestRejected"
    assert outcome.actions() == ["prepare"]
    [notification] = outcome.notifications
    assert notification["data"] == {"error": {"Error": "AwsRequestRejected", "Cause": outcome.cause}}


def test_policy_gives_up_fails_not_recovered(workflow):
    reason = "ExplodingTensor fired in 7 attempts; the policy has no remedy left"
    gave_up = {**LAUNCHED, "next_action": "end", "outcome": "gave_up", "reason": reason}
    outcome = workflow.run({}, prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(gave_up)])

    assert outcome.status == "FAILED"
    assert outcome.states[-2:] == ["DecideNextStep", "TrainingNotRecovered"]
    assert outcome.error == "TrainingNotRecovered"
    assert outcome.cause == f"{reason} (outcome gave_up)"
    assert outcome.actions() == ["prepare", "launch", "await", "check"]


def test_unknown_next_action_is_a_corrupted_state(workflow):
    outcome = workflow.run(
        {},
        prepare=[ok(PREPARED)],
        launch=[ok(LAUNCHED)],
        check=[ok({**LAUNCHED, "next_action": "explode"})],
        abort=[ok(LAUNCHED)],
    )

    assert outcome.status == "FAILED"
    assert outcome.states[-4:] == [
        "DecideNextStep", "NextActionNotUnderstood", "StopJobAndNotify", "FailWithOriginalError",
    ]
    assert outcome.error == "StateCorrupted"
    assert "explode" in outcome.cause
    assert outcome.events_of("abort")[0]["error"]["Error"] == "StateCorrupted"


def _awaits(outcome) -> list[tuple[float, str]]:
    """(seconds parked, how it ended) for each AwaitJobChange, from the history."""
    found, entered = [], None
    for event in outcome.events:
        details = event.get("stateEnteredEventDetails")
        if details and details["name"] == "AwaitJobChange":
            entered = event["timestamp"]
        if entered is not None and event["type"] in ("TaskSucceeded", "TaskTimedOut", "TaskFailed"):
            found.append(((event["timestamp"] - entered).total_seconds(), event["type"]))
            entered = None
    return found


def test_the_jobs_end_moves_the_execution_not_the_next_check(workflow):
    outcome = workflow.run(
        {}, prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(WATCHING), ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    # wait_seconds is 30: each wake came from the watch function's SendTaskSuccess, at once.
    assert [how for _, how in _awaits(outcome)] == ["TaskSucceeded", "TaskSucceeded"]
    assert all(seconds < 5 for seconds, _ in _awaits(outcome))
    parked = outcome.events_of("await")
    assert [event["state"] for event in parked] == [LAUNCHED, WATCHING]
    assert all(event["token"] for event in parked)


def test_no_job_event_checks_after_wait_seconds(workflow):
    one_second = {**LAUNCHED, "wait_seconds": 1}
    outcome = workflow.run(
        {}, prepare=[ok(PREPARED)], launch=[ok(one_second)], parked=[sleeps()], check=[ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    [(seconds, how)] = _awaits(outcome)
    assert how == "TaskTimedOut" and seconds >= 0.9
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "AwaitJobChange", "CheckJobAndRules", "DecideNextStep",
        "TrainingSucceeded",
    ]


def test_parking_fails_falls_back_to_a_plain_wait(workflow):
    one_second = {**LAUNCHED, "wait_seconds": 1}
    outcome = workflow.run(
        {}, prepare=[ok(PREPARED)], launch=[ok(one_second)],
        parked=[raises("AwsRequestRejected", "S3 PutObject wake-token.json: AccessDenied")],
        check=[ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    assert outcome.states == [
        "ValidateInput", "LaunchTrainingJob", "AwaitJobChange", "WaitForProgress", "CheckJobAndRules",
        "DecideNextStep", "TrainingSucceeded",
    ]
    entered = next(e for e in outcome.events if e["type"] == "WaitStateEntered")
    exited = next(e for e in outcome.events if e["type"] == "WaitStateExited")
    assert (exited["timestamp"] - entered["timestamp"]).total_seconds() >= 0.9


def test_lambda_timeout_is_retried_not_left_unwatched(workflow):
    # A Lambda timeout or out-of-memory reaches Step Functions as Lambda.Unknown: a launch that
    # timed out after CreateTrainingJob is retried (the job name makes the retry find its job).
    timed_out = "Task timed out after 120.00 seconds"
    outcome = workflow.run(
        {}, prepare=[ok(PREPARED)],
        launch=[raises("Lambda.Unknown", timed_out), ok(LAUNCHED)],
        check=[raises("Lambda.Unknown", timed_out), ok(COMPLETED)],
    )

    assert outcome.status == "SUCCEEDED"
    assert outcome.actions() == ["prepare", "launch", "launch", "await", "check", "check"]
    assert "StopJobAndNotify" not in outcome.states


def test_a_lambda_timeout_named_sandbox_timedout_is_retried_at_every_lambda_step(workflow):
    """Lambda reports a function that ran past its timeout with the error type "Sandbox.Timedout"
    ("Task timed out after 120.00 seconds"), which Step Functions gives as the error name; every
    Lambda task retries it like Lambda.Unknown."""
    timed_out = "RequestId: 1 Error: Task timed out after 120.00 seconds"
    outcome = workflow.run(
        {}, prepare=[raises("Sandbox.Timedout", timed_out), ok(PREPARED)],
        launch=[raises("Sandbox.Timedout", timed_out), ok(LAUNCHED)],
        check=[raises("Sandbox.Timedout", timed_out), ok(COMPLETED)],
    )
    assert outcome.status == "SUCCEEDED"
    assert outcome.actions() == ["prepare", "prepare", "launch", "launch", "await", "check", "check"]
    definition = json.loads(DEFINITION.read_text())["States"]
    lambda_tasks = [name for name, body in definition.items() if ":lambda:invoke" in body.get("Resource", "")]
    assert len(lambda_tasks) == 6
    for name in lambda_tasks:
        assert any("Sandbox.Timedout" in retry["ErrorEquals"] for retry in definition[name]["Retry"]), name


def test_an_end_without_reason_still_fails_as_not_recovered(workflow):
    failed = {**LAUNCHED, "next_action": "end", "outcome": "failed", "reason": None}
    outcome = workflow.run({}, prepare=[ok(PREPARED)], launch=[ok(LAUNCHED)], check=[ok(failed)])

    assert outcome.status == "FAILED"
    assert outcome.error == "TrainingNotRecovered"
    assert outcome.cause.endswith("(outcome failed)")
