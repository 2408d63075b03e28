"""Run records and the report: log parsing, notification bodies, explosion points, the files."""

from __future__ import annotations

import json
import math
from pathlib import Path

from stabilizer.reports.records import AttemptRecord, EvalPoint, MetricPoint, Notification, RunRecord, parse_log_line
from stabilizer.reports.report import outcome, table_text, timing, write_report
from stabilizer.reports.report import rows as report_rows


def test_log_lines_are_read_as_the_metric_definitions_read_them():
    point = parse_log_line("step=12 epoch=1 loss=2.3012 lr=0.1 grad_norm=4.52\n")
    assert point == MetricPoint(step=12, loss=2.3012, grad_norm=4.52, lr=0.1, epoch=1)
    nan = parse_log_line("step=3 epoch=0 loss=nan lr=0.1 grad_norm=inf")
    assert isinstance(nan, MetricPoint) and math.isnan(nan.loss) and nan.grad_norm == math.inf
    assert parse_log_line("eval epoch=3 test_loss=0.61 test_accuracy=0.8111") == EvalPoint(3, 0.61, 0.8111)
    assert parse_log_line("resumed from checkpoint-00000050.pt at step 50") is None


def test_notification_body_is_the_json_after_the_details_marker():
    note = Notification("Relaunching", 'What fired:\n  rule: X\nDetails (JSON):\n{"event_type": "relaunching"}', 1.0)
    assert note.body == {"event_type": "relaunching"}
    assert Notification("s", '{"a": 1}', 0).body == {"a": 1}
    assert Notification("s", "plain text", 0).body is None


def test_series_complete_sparse_log_lines_with_the_findings_evidence():
    attempt = AttemptRecord(number=1, job_name="j", metrics=[MetricPoint(0, 2.3, 3.1)])
    attempt.findings = {
        "findings": [
            {
                "rule": "ExplodingTensor",
                "step": 2,
                "evidence": {"loss_history": [[0, 2.31], [1, 2.95], [2, "nan"]], "grad_norm_history": [[1, 41.7]]},
            }
        ]
    }
    loss = attempt.series("loss")
    assert [step for step, _ in loss] == [0, 1, 2]
    assert loss[0][1] == 2.3  # the logged value wins where both exist
    assert math.isnan(loss[2][1])
    assert attempt.series("grad_norm") == [(0, 3.1), (1, 41.7)]


def sample_record() -> RunRecord:
    exploded = AttemptRecord(number=1, job_name="stabilizer-aaaa0000-1", status="Failed", seconds=10.0)
    exploded.metrics = [MetricPoint(0, 2.3, 3.1), MetricPoint(1, 85.8, 826.5), MetricPoint(2, math.nan, math.nan)]
    recovered = AttemptRecord(number=2, job_name="stabilizer-aaaa0000-2", status="Completed", seconds=20.0)
    recovered.metrics = [MetricPoint(s, 2.3 / (s + 1), 1.0 + s) for s in range(5)]
    state = {
        "policy": "default",
        "reason": "a training job completed",
        "attempts": [
            {
                "job_name": exploded.job_name,
                "run_spec": {"warmup_learning_rate": 0.1, "learning_rate": 0.1, "add_batch_norm": 0, "grad_clip": 0},
                "finding": {"rule": "ExplodingTensor", "step": 2},
                "decision": {"action": "relaunch", "remedy": "add_batch_norm", "reason": "exploded in warm-up"},
            },
            {
                "job_name": recovered.job_name,
                "run_spec": {"warmup_learning_rate": 0.1, "learning_rate": 0.1, "add_batch_norm": 1, "grad_clip": 0},
                "decision": {"action": "end", "reason": "completed"},
            },
        ],
    }
    return RunRecord(
        execution_arn="arn:aws:states:us-east-1:123456789012:execution:m:e",
        name="e",
        input={},
        status="SUCCEEDED",
        state=state,
        states=["ValidateInput", "LaunchTrainingJob", "TrainingSucceeded"],
        notifications=[Notification("Relaunching", "x", 12.0, {"event_type": "relaunching"})],
        attempts=[exploded, recovered],
        wall_seconds=40.0,
    )


def test_attempt_rows_join_the_workflow_record_with_what_was_observed():
    rows = report_rows(sample_record())
    assert [(r.recipe, r.status, r.steps, r.finding) for r in rows] == [
        ("warm-up LR 0.1, LR 0.1, no BN", "Failed", "3", "ExplodingTensor at step 2"),
        ("warm-up LR 0.1, LR 0.1, BN", "Completed", "5", "-"),
    ]
    assert (rows[0].decision, rows[0].reason) == ("add_batch_norm", "exploded in warm-up")
    table = table_text(sample_record()).splitlines()
    assert table[0].split() == ["#", "job", "recipe", "status", "steps", "seconds", "finding"]
    assert table[2].startswith("1  stabilizer-aaaa0000-1  warm-up LR 0.1, LR 0.1, no BN  Failed")
    assert table[3] == "   -> add_batch_norm: exploded in warm-up"
    assert table[4].startswith("2  stabilizer-aaaa0000-2") and table[5] == "   -> end: completed"


def test_timing_and_outcome():
    record = sample_record()
    assert timing(record) == {
        "wall_seconds": 40.0,
        "job_seconds": 30.0,
        "control_plane_seconds": 10.0,
        "control_plane_fraction": 0.25,
    }
    assert outcome(record) == "succeeded"
    record.status, record.error = "FAILED", "TrainingNotRecovered"
    record.state = {**(record.state or {}), "outcome": "gave_up"}
    assert outcome(record) == "gave up"
    record.state["outcome"] = "failed"  # a job crashed: the workflow ended, but did not give up
    assert outcome(record) == "failed"
    record.error = "StateCorrupted"
    assert outcome(record) == "failed"


def test_report_files(tmp_path: Path):
    paths = write_report(sample_record(), tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["outcome"] == "succeeded"
    assert data["attempts"][0]["explosion"] == {"step": 2, "kind": "non-finite"}
    assert data["attempts"][0]["metrics"][2]["loss"] == "nan"  # JSON has no NaN
    markdown = paths["markdown"].read_text()
    assert "| 1 | stabilizer-aaaa0000-1 | warm-up LR 0.1, LR 0.1, no BN | Failed |" in markdown
    assert "![loss](plots/loss.png)" in markdown
    for name in ("loss", "grad_norm"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_attempts_table_says_how_many_bad_batches_the_job_skipped():
    from stabilizer.reports.attempts import _in_job

    recorded = {"rollbacks": [{"rate_after": 0.01, "bad_batch": True, "bad_batches": ["ae34d7886d4ea499"]},
                              {"rate_after": 0.01, "bad_batch": True, "bad_batches": []},  # no fingerprint
                              {"rate_after": 0.001, "bad_batch": False, "bad_batches": []}]}
    assert _in_job(recorded, None) == "3 rollbacks (2 bad batches skipped), on at LR 0.001"
    before = {"rollbacks": [{"rate_after": 0.01, "bad_batches": ["ae34d7886d4ea499"]}]}  # a state before bad_batch
    assert _in_job(before, None) == "1 rollback (1 bad batch skipped), on at LR 0.01"
    # The run ended during the replay after the batch failed again: the relaunch skips it, the job did not.
    ended = {"rollbacks": [{"rate_after": 0.01, "bad_batch": False, "bad_batches": ["ae34d7886d4ea499"]}]}
    assert _in_job(ended, None) == "1 rollback, on at LR 0.01"
    observed = AttemptRecord(number=1, job_name="job-1", findings={"rollbacks": [
        {"learning_rate_after": 0.01, "outcome": "bad_batch", "batch": {"fingerprints": []}},
        {"learning_rate_after": 0.01, "outcome": "transient"}]})
    assert _in_job({}, observed) == "2 rollbacks (1 bad batch skipped), on at LR 0.01"


def test_the_attempts_table_names_the_finding_a_job_rolled_back_from_where_none_ended_it():
    from stabilizer.reports.attempts import _finding

    rolled = [{"rule": "Diverging", "step": 4, "rate_after": 0.53}, {"rule": "ExplodingTensor", "step": 30}]
    assert _finding(None, None, rolled) == "Diverging at step 4 (rolled back)"
    observed = AttemptRecord(number=1, job_name="job-1", findings={"rollbacks": [
        {"rule": "ExplodingTensor", "step": 7, "learning_rate_after": 0.01, "outcome": "recovered"}]})
    assert _finding(None, observed) == "ExplodingTensor at step 7 (rolled back)"  # the job's own list
    # The finding that ended the attempt comes first; nothing fired, nothing is named.
    assert _finding({"rule": "NotLearning", "step": 90}, observed, rolled) == "NotLearning at step 90"
    assert _finding(None, AttemptRecord(number=1, job_name="job-1", findings={})) == "-"
