"""A straggler (a rank the job's watchdog found persistently slower than the others, in
stragglers.json) is told with its rank and host, once per attempt, and the attempt keeps it."""

from __future__ import annotations

from datetime import timedelta

from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.evidence.sentinel_files import parse_stragglers
from stabilizer_workflow.monitoring import monitor
from tests.unit.workflow.conftest import T0, describe, launched, sentinel_findings

# What the watchdog writes (stabilizer_sentinel.detection.watchdog, Watchdog._write_stragglers).
STRAGGLERS = (b'{"version": 1, "stragglers": [{"rule": "Straggler", "rank": 3, "host": "algo-2", "step": 40, '
              b'"factor": 3.1, "busy_seconds": 0.31, "message": "rank 3 on algo-2 is 3.1x slower than the median '
              b'of the other ranks (busy 0.31 s a step)"}]}')


def test_a_straggler_is_told_once_with_its_rank_and_host_and_the_job_runs_on(settings):
    state = launched(settings)
    seen = observe(describe(state, "InProgress"), stragglers=parse_stragglers(STRAGGLERS))
    first = monitor.check(state, seen, T0 + timedelta(minutes=5))
    note = first.effects.notification
    assert first.effects.stop_job is None and first.state.next_action == "monitor"
    assert note.event_type == "straggler"
    assert note.subject == "Straggler in attempt 1: rank 3 on algo-2"
    assert "rank 3 on algo-2 is 3.1x slower than the other ranks (reported at step 40)" in note.body
    assert note.attributes["rank"] == "3" and note.attributes["host"] == "algo-2"
    [kept] = first.state.attempts[-1].stragglers
    assert (kept.rank, kept.host, kept.step, kept.factor) == (3, "algo-2", 40, 3.1)
    again = monitor.check(first.state, seen, T0 + timedelta(minutes=10))
    assert again.effects.notification is None  # once per attempt
    assert len(again.state.attempts[-1].stragglers) == 1


def test_a_straggler_seen_with_a_finding_rides_on_the_findings_message(settings):
    state = launched(settings)
    seen = observe(describe(state, "InProgress"), findings=sentinel_findings(),
                   stragglers=parse_stragglers(STRAGGLERS))
    result = monitor.check(state, seen, T0 + timedelta(minutes=5))
    note = result.effects.notification
    assert note.event_type == "issue_found" and result.effects.stop_job  # the finding's decision stands
    assert "Stragglers (they slow the job; they do not stop it):" in note.body
    assert note.body.index("rank 3 on algo-2") < note.body.index("Details (JSON):")
    assert note.attributes["straggler_host"] == "algo-2"


def test_an_unreadable_stragglers_file_reports_none():
    assert parse_stragglers(b"{not json") == []
    assert parse_stragglers(b'{"stragglers": [{"host": "algo-1"}]}') == []
