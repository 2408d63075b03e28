"""Notifications: one per decision, readable subjects, evidence and the recipe diff in the body."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.notifications import SUBJECT_MAX, clean_subject
from stabilizer_workflow.remedies.recipe_text import recipe_diff
from tests.unit.workflow.conftest import RULE_STOP, T0, launched, observation, sentinel_findings, watched_findings


def _relaunch_note(settings):
    state = launched(settings)
    obs = observation(state, "Failed", failure_reason=RULE_STOP, findings=sentinel_findings())
    return monitor.check(state, obs, T0 + timedelta(minutes=5)).effects.notification


def test_relaunching_message_says_what_fired_where_the_evidence_and_the_diff(settings):
    note = _relaunch_note(settings)
    assert note.event_type == "relaunching"
    assert note.subject == "ExplodingTensor at step 2: relaunching attempt 2 with add_batch_norm 0->1"
    assert "rule: ExplodingTensor (sentinel)" in note.body
    assert "step: 2, epoch 0, phase warmup" in note.body
    assert "tensor: gradients/layer1.0.conv1.weight = nan" in note.body
    assert 'grad_norm_history: [[0,3.1],[1,41.7],[2,"nan"]]' in note.body
    assert "- add_batch_norm: 0\n+ add_batch_norm: 1" in note.body
    assert "Why: ExplodingTensor at step 2 (warmup): add_batch_norm 0 -> 1" in note.body
    details = json.loads(note.body.split("Details (JSON):\n", 1)[1])
    assert details["decision"]["changes"] == {"add_batch_norm": [0, 1]}


def test_message_attributes_let_subscriptions_filter(settings):
    note = _relaunch_note(settings)
    kwargs = note.publish_kwargs("arn:aws:sns:us-east-1:123456789012:t")
    attributes = kwargs["MessageAttributes"]
    assert attributes["event_type"] == {"DataType": "String", "StringValue": "relaunching"}
    assert attributes["execution"] == {"DataType": "String", "StringValue": "run-1"}
    assert attributes["attempt"] == {"DataType": "Number", "StringValue": "1"}
    assert attributes["rule"]["StringValue"] == "ExplodingTensor"


def test_launched_message(settings):
    plan = launching.launch(launching.prepare({}, {"id": "x", "name": "demo"}, settings), settings, T0)
    note = plan.notification
    assert note.event_type == "launched"
    assert note.subject == "Attempt 1 launched: warm-up LR 0.1, LR 0.1, no BN"
    assert plan.attempt.job_name in note.body


def test_completed_message_lists_every_attempt(settings):
    state = launched(settings)
    state = monitor.check(
        state, observation(state, "Failed", failure_reason=RULE_STOP, findings=sentinel_findings()), T0
    ).state
    state = launching.launch(state, settings, T0).state
    note = monitor.check(state, observation(state, "Completed", findings=watched_findings()), T0).effects.notification
    assert note.event_type == "completed"
    assert note.subject.startswith("Training completed after 2 jobs")
    assert "1. stabilizer-" in note.body and "ExplodingTensor at step 2" in note.body
    assert "2. stabilizer-" in note.body and "BN]" in note.body
    assert note.attributes["outcome"] == "succeeded"


@pytest.mark.parametrize(
    "text",
    ["x" * 300, "ExplodingTensor -> naïve café\nsecond line", "  spaced   out  ",
     "\x1b[31mExplodingTensor\x1b[0m at\x01step\x7f 7"],
)
def test_subjects_are_short_ascii_single_lines(text):
    """botocore's model, SNS Publish Subject: "UTF-8 text with no line breaks or control characters, and
    less than 100 characters long"."""
    subject = clean_subject(text)
    assert len(subject) <= SUBJECT_MAX
    assert subject.isascii() and subject.isprintable()
    assert "\n" not in subject and "  " not in subject


def test_evidence_of_any_size_from_the_job_keeps_the_message_small(settings):
    """findings.json is the job's to write: its evidence is cut (the last points of a history, the first
    entries, each line), so the message stays far under SNS's 262,144 bytes whatever it holds."""
    findings = sentinel_findings()
    findings.findings[0].evidence = {f"history_{n}": ["y" * 20_000] * 40 for n in range(40)}
    findings.findings[0].evidence["note"] = "é" * 300_000
    state = launched(settings)
    note = monitor.check(state, observation(state, "Failed", failure_reason=RULE_STOP, findings=findings),
                         T0).effects.notification
    assert len(note.body.encode()) < 64 * 1024
    assert '  history_0: ["yyyy' in note.body and "(25 more in the job's findings.json)" in note.body


def test_every_event_type_has_a_subject_under_the_sns_limit(settings):
    state = launched(settings, {"limits": {"max_monitor_transitions": 1}})
    notes = [
        launching.launch(
            launching.prepare({}, {"id": "i", "name": "n" * 80}, settings), settings, T0
        ).notification,
        monitor.check(
            state, observation(state, "InProgress", rules=[("ExplodingTensor", "IssuesFound")]), T0
        ).effects.notification,
        _relaunch_note(settings),
        monitor.check(state, observation(state, "Completed", findings=watched_findings()), T0).effects.notification,
        monitor.check(state, observation(state, "Completed"), T0).effects.notification,
        monitor.check(
            state, observation(state, "Completed", findings=watched_findings(steps_observed=0)), T0
        ).effects.notification,
        monitor.check(
            state, observation(state, "Failed", failure_reason=RULE_STOP, findings=sentinel_findings()), T0
        ).effects.notification,
        monitor.check(
            state, observation(state, "Completed", findings=watched_findings(learned=False)), T0
        ).effects.notification,
        monitor.check(state, observation(state, "InProgress"), T0).effects.notification,
        monitor.check(
            state, observation(state, "Failed", failure_reason="AlgorithmError: " + "e" * 400), T0
        ).effects.notification,
    ]
    assert {note.event_type for note in notes} == {
        "launched",
        "issue_found",
        "relaunching",
        "completed",
        "unwatched",
        "unverified",
        "diverged",
        "did_not_learn",
        "gave_up",
        "failed",
    }
    for note in notes:
        assert 0 < len(note.subject) <= SUBJECT_MAX and note.subject.isascii()
        assert len(note.body.encode()) < 256 * 1024


def test_recipe_diff_of_an_unchanged_retry():
    assert recipe_diff({}) == "  (unchanged)"
