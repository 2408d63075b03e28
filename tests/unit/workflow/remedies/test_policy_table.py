"""The `default` policy's remedies read as one table: finding x phase -> remedies, in order.

docs/remedies.md is generated from the table; a table changed without regenerating it fails here.
"""

from __future__ import annotations

from stabilizer_workflow.remedies import ladders, policy
from stabilizer_workflow.remedies.ladders import DOCS, PHASES, TABLE, markdown, remedies


def test_the_docs_are_the_table():
    assert DOCS.read_text() == markdown(), "run python -m stabilizer_workflow.remedies.ladders"


def test_what_follows_a_diverging_in_the_main_phase_is_one_lookup():
    names = [rung.name for rung in remedies("Diverging", "main")]
    assert names == ["add_batch_norm", "lower_lr", "clip_gradients", "tighten_grad_clip", "raise_batch_size"]
    assert [rung.name for rung in remedies("ExplodingTensor", "warmup")][:3] == [
        "add_batch_norm", "lower_warmup_lr", "lengthen_warmup"]


def test_every_row_answers_every_phase_and_a_finding_without_a_row_has_none():
    for finding, row in TABLE.items():
        assert set(row) == set(PHASES), finding
        assert all(row[phase] for phase in PHASES), finding
    assert remedies("ClassImbalance", "main") is None


def test_every_remedy_turns_a_knob_role_with_a_history_counter_or_stops():
    for row in TABLE.values():
        for rungs in row.values():
            for rung in rungs:
                assert rung.op == "stop_early" or rung.role in ladders.ROLE_COUNTERS, rung
                assert rung.sizing and rung.bound and rung.why


def test_the_policy_applies_the_tables_first_remedy_that_fits(settings):
    from test_policy import _finding, written

    from tests.unit.workflow.conftest import launched

    plan = policy.plan(launched(settings), _finding(rule="Diverging", step=300, phase="main"), written(250))
    assert plan.decision.action == "relaunch" and plan.decision.remedy == remedies("Diverging", "main")[0].name
