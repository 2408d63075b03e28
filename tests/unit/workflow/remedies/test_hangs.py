"""A hang is transient: the same recipe again from the newest checkpoint, a bounded number of times,
and the notification tells it from an instability; a job's hang bounds reach the job's watchdog."""

from __future__ import annotations

from datetime import timedelta

from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.execution import hang_settings
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.remedies import hangs
from tests.unit.workflow.conftest import T0, describe, launched, observation, sentinel_findings

LATER = T0 + timedelta(minutes=5)
HUNG = "AlgorithmError: RuleStop: Hang at step 8: no optimizer step for 41.0 s on rank 0 (algo-1)"
CHECKPOINTS = ["checkpoint-00000005.pt", "checkpoint-00000010.pt"]


def hung(state, step: int = 12):
    keys = [f"{state.current.checkpoint_s3_uri.split('/', 3)[3]}/{name}" for name in CHECKPOINTS]
    findings = sentinel_findings(rule="Hang", step=step, phase="main")
    return monitor.check(state, observation(state, "Failed", failure_reason=HUNG, findings=findings,
                                            checkpoint_keys=keys), LATER)


def test_a_hang_relaunches_the_same_recipe_from_the_newest_checkpoint_and_says_it_is_not_an_instability(settings):
    state = launched(settings)
    result = hung(state)
    decision = result.state.attempts[-1].decision
    assert result.state.next_action == "launch_new"
    assert decision.action == "relaunch" and decision.remedy == "retry" and decision.changes == {}
    assert result.state.run_spec == state.run_spec  # the recipe is not the fault
    assert decision.resume_from == f"{state.current.checkpoint_s3_uri}/checkpoint-00000010.pt"
    assert decision.reason.startswith("Hang at step 12 (main): a hang, not an instability; same recipe again, "
                                      "resumes from checkpoint-00000010.pt; hang relaunch 1 of 2")
    note = result.effects.notification
    assert note.subject.startswith("Hang at step 12: relaunching attempt 2 with same recipe")
    assert "a hang, not an instability" in note.body


def test_a_job_that_keeps_hanging_ends_after_the_bounded_relaunches(settings):
    from stabilizer_workflow.launch import attempts as launching

    state = launched(settings)
    for number in range(1, 3):
        state = hung(state).state
        assert state.next_action == "launch_new", number
        state = launching.launch(state, settings, LATER).state
    result = hung(state)
    assert result.state.next_action == "end"
    assert result.state.outcome == "gave_up"
    assert result.state.reason.endswith("it hung again after 2 relaunches (at most 2)")


def test_an_instability_is_left_to_the_policy(settings):
    state = launched(settings)
    assert hangs.plan(state, sentinel_findings().findings[0].to_finding(), {}) is None


def test_a_jobs_hang_bounds_travel_as_the_watchdogs_environment():
    settings = hang_settings.HangSettings(floor_seconds=30, factor=5, relaunches=1)
    assert hang_settings.environment(settings) == {
        "STABILIZER_HANG_FLOOR_SECONDS": "30", "STABILIZER_HANG_FACTOR": "5", "STABILIZER_STRAGGLER_FACTOR": "2"}
    assert hang_settings.environment(None) == {}


def test_a_hang_known_only_by_its_failure_reason_is_relaunched_as_a_hang(settings):
    state = launched(settings)
    seen = observation(state, "Failed", failure_reason=HUNG)  # no findings.json reached S3
    result = monitor.check(state, seen, LATER)
    decision = result.state.attempts[-1].decision
    assert decision.action == "relaunch" and decision.remedy == "retry"
    assert decision.reason.startswith("Hang at step 8: a hang, not an instability; same recipe again")


def test_a_job_whose_progress_went_stale_in_s3_is_stopped_as_a_hang_and_relaunched(settings):
    state = launched(settings)
    last = T0 + timedelta(minutes=1)  # progress.json last changed then; the bound is max(2 x 600 s, 300 s)
    fresh = monitor.check(state, observe(describe(state, "InProgress"), progress_at=last),
                          last + timedelta(seconds=1100))
    assert fresh.effects.stop_job is None and fresh.state.attempts[-1].finding is None
    stale = monitor.check(fresh.state, observe(describe(state, "InProgress"), progress_at=last),
                          last + timedelta(seconds=1300))
    assert stale.effects.stop_job == state.history.latest_job_name
    finding = stale.state.attempts[-1].finding
    assert finding.rule == "Hang" and finding.message.startswith("the job reported no new step for 1300 s")
    assert stale.effects.notification.event_type == "issue_found"
    ended = monitor.check(stale.state, observe(describe(state, "Stopped")), last + timedelta(seconds=1400))
    decision = ended.state.attempts[-1].decision
    assert decision.action == "relaunch" and "a hang, not an instability" in decision.reason


def test_a_job_that_never_reported_progress_is_not_judged_by_the_monitor(settings):
    state = launched(settings)
    result = monitor.check(state, observe(describe(state, "InProgress")), T0 + timedelta(minutes=50))
    assert result.effects.stop_job is None


def launched_with(settings, **hang):
    """The reference job (its loss metric is train:loss) with these hang settings."""
    state = launched(settings)
    state.job = state.job.model_copy(update={"hang": hang_settings.HangSettings(**hang)})
    return state


def test_a_job_whose_metric_stream_went_silent_is_stopped_as_a_hang_by_the_monitor(settings):
    state = launched_with(settings, monitor_seconds=200)
    last = T0 + timedelta(minutes=2)  # the end of the newest minute holding a loss line
    fresh = monitor.check(state, observe(describe(state, "InProgress"), metric_at=last), last + timedelta(seconds=190))
    assert fresh.effects.stop_job is None
    stale = monitor.check(fresh.state, observe(describe(state, "InProgress"), metric_at=last),
                          last + timedelta(seconds=210))
    assert stale.effects.stop_job == state.history.latest_job_name
    finding = stale.state.attempts[-1].finding
    assert finding.rule == "Hang"
    assert f"no {state.job.loss_metric} line in its metric stream for 210 s" in finding.message
    assert "the monitor's bound is 200 s" in finding.message


def test_a_job_whose_loss_lines_still_come_is_not_hung_though_its_progress_file_is_stale(settings):
    state = launched_with(settings, monitor_seconds=400)
    now = T0 + timedelta(hours=1)
    seen = observe(describe(state, "InProgress"), progress_at=now - timedelta(minutes=30),
                   metric_at=now - timedelta(seconds=30))
    assert monitor.check(state, seen, now).effects.stop_job is None  # the newer sign of life wins
    both_stale = observe(describe(state, "InProgress"), progress_at=now - timedelta(minutes=30),
                         metric_at=now - timedelta(minutes=10))
    stopped = monitor.check(state, both_stale, now)
    assert stopped.effects.stop_job == state.history.latest_job_name
    assert "and progress.json unchanged in S3 for 1800 s" in stopped.state.attempts[-1].finding.message


def test_the_monitor_never_calls_a_silence_shorter_than_three_periods_of_the_stream_a_hang(settings):
    state = launched_with(settings, monitor_seconds=5)
    last = T0 + timedelta(minutes=2)
    on_aws = observe(describe(state, "InProgress"), metric_at=last, metric_period_seconds=60)
    assert monitor.check(state, on_aws, last + timedelta(seconds=170)).effects.stop_job is None
    assert monitor.check(state, on_aws, last + timedelta(seconds=190)).effects.stop_job is not None
    to_the_second = observe(describe(state, "InProgress"), metric_at=last, metric_period_seconds=1)
    assert monitor.check(state, to_the_second, last + timedelta(seconds=6)).effects.stop_job is not None


def test_a_monitor_bound_of_zero_turns_the_monitors_check_off(settings):
    state = launched_with(settings, monitor_seconds=0)
    seen = observe(describe(state, "InProgress"), metric_at=T0, progress_at=T0)
    assert monitor.check(state, seen, T0 + timedelta(minutes=50)).effects.stop_job is None  # 1200 s is the default


def test_the_metric_stream_is_read_from_cloudwatch_as_sagemaker_publishes_it():
    from datetime import UTC, datetime

    import boto3
    from botocore.stub import ANY, Stubber

    from stabilizer_workflow.aws.cloudwatch import MetricStreams

    client = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    started = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    now = started + timedelta(minutes=30)
    query = {"Id": "progress", "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": "/aws/sagemaker/TrainingJobs", "MetricName": "train:loss",
                   "Dimensions": [{"Name": "TrainingJobName", "Value": "stabilizer-abc-1"}]},
        "Period": 60, "Stat": "SampleCount"}}
    with Stubber(client) as stub:
        stub.add_response("get_metric_data", {"MetricDataResults": [{
            "Id": "progress", "Label": "train:loss", "StatusCode": "Complete",
            "Timestamps": [started + timedelta(minutes=12), started + timedelta(minutes=11)],
            "Values": [4.0, 6.0]}]},
            {"MetricDataQueries": [query], "StartTime": ANY, "EndTime": ANY, "ScanBy": "TimestampDescending"})
        stub.add_response("get_metric_data", {"MetricDataResults": [{
            "Id": "progress", "StatusCode": "Complete", "Timestamps": [], "Values": []}]})
        streams = MetricStreams(client)
        # The end of the newest minute with a loss line: the last line was logged no later than that.
        assert streams.newest("stabilizer-abc-1", "train:loss", started, now) == started + timedelta(minutes=13)
        assert streams.newest("stabilizer-abc-1", "train:loss", started, now) is None


HELD_UP = ("no optimizer step for 41.0 s on rank 0 (algo-1), bound 40.0 s = max(floor 40 s, 10 x median step 0.1 s); "
           "held up by rank 3 on algo-2 at step 8 (before its forward pass)")


def on_hosts(settings, count: int, least: int | None):
    state = launched(settings)
    state.job = state.job.model_copy(update={"instance_count": count, "min_instance_count": least})
    return state


def hang_naming_a_host(state):
    findings = sentinel_findings(rule="Hang", step=8, phase="main")
    findings.findings[0].message = HELD_UP  # the watchdog's words
    return monitor.check(state, observation(state, "Failed", failure_reason=HUNG, findings=findings), LATER)


def test_a_hang_held_up_by_a_host_relaunches_without_it_when_the_user_allows_fewer_hosts(settings):
    result = hang_naming_a_host(on_hosts(settings, 3, 2))
    decision = result.state.attempts[-1].decision
    assert decision.action == "relaunch" and decision.instance_count == 2
    assert "on 2 hosts instead of 3 (without algo-2, which held it up; job.min_instance_count 2)" in decision.reason
    assert result.state.job.instance_count == 2  # the next CreateTrainingJob asks for two instances
    note = result.effects.notification
    assert note.subject.startswith("Hang at step 8: relaunching attempt 2 on 2 hosts with same recipe")
    assert "Hosts: 2" in note.body


def test_a_relaunch_after_a_hang_keeps_the_number_of_hosts_unless_the_user_allows_fewer(settings):
    kept = hang_naming_a_host(on_hosts(settings, 2, None))
    assert kept.state.attempts[-1].decision.instance_count is None and kept.state.job.instance_count == 2
    assert "host" not in kept.effects.notification.subject
    too_few = hang_naming_a_host(on_hosts(settings, 2, 2))
    assert too_few.state.job.instance_count == 2
    floor = hang_naming_a_host(on_hosts(settings, 3, 3))
    assert floor.state.job.instance_count == 3


def test_a_hang_that_names_no_host_relaunches_on_the_same_hosts(settings):
    state = on_hosts(settings, 2, 1)
    result = monitor.check(state, observation(state, "Failed", failure_reason=HUNG,
                                              findings=sentinel_findings(rule="Hang", step=8)), LATER)
    assert result.state.attempts[-1].decision.instance_count is None and result.state.job.instance_count == 2


def test_a_smallest_host_count_above_the_jobs_is_refused_naming_the_field():
    import pytest
    from pydantic import ValidationError

    from stabilizer_workflow.execution.job import Job

    with pytest.raises(ValidationError, match="min_instance_count: 3 is more than instance_count 2"):
        Job(source="s3://b/s.tar.gz", entry_point="t.py", instance_count=2, min_instance_count=3)


def test_a_job_uploading_its_model_is_not_judged_silent(settings):
    """DescribeTrainingJob's SecondaryStatus (SageMaker API Reference, DescribeTrainingJob): while
    TrainingJobStatus is InProgress, "Training - Training is in progress" and "Uploading - Training is
    complete and the model artifacts are being uploaded to the S3 location". A job that uploads a
    large model logs no loss line and writes no progress.json, and is not hung: silence counts only
    while it trains."""
    import botocore.session

    shape = botocore.session.get_session().get_service_model("sagemaker").operation_model(
        "DescribeTrainingJob").output_shape.members["SecondaryStatus"]
    assert {"Training", "Uploading", "Downloading", "Starting"} <= set(shape.enum)
    assert "Uploading - Training is complete" in " ".join(shape.documentation.replace("<code>", "").replace(
        "</code>", "").replace("<p>", "").replace("</p>", "").split())
    state = launched_with(settings, monitor_seconds=200)
    last = T0 + timedelta(minutes=2)
    silent = last + timedelta(seconds=3600)  # far past the bound on both channels
    for secondary in ("Uploading", "Downloading", "Starting"):
        quiet = observe(describe(state, "InProgress", secondary=secondary), metric_at=last, progress_at=last)
        result = monitor.check(state, quiet, silent)
        assert result.effects.stop_job is None, secondary
        assert result.state.attempts[-1].finding is None and result.state.next_action == "monitor"
    training = observe(describe(state, "InProgress", secondary="Training"), metric_at=last, progress_at=last)
    assert monitor.check(state, training, silent).effects.stop_job == state.history.latest_job_name
