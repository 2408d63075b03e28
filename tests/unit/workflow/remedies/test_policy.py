"""Remediation policies: the original sample's ladder, and the default per-rule ladders."""

from __future__ import annotations

import itertools

import pytest

from stabilizer_workflow.execution.state import Finding, Watched, WorkflowState, recipe_key
from stabilizer_workflow.remedies import ladders, policy
from stabilizer_workflow.remedies.ladders import EXPLOSION_RATE_FLOOR
from tests.unit.workflow.conftest import launched, simulate


def written(*steps: int) -> dict[int, str]:
    """Checkpoints as the training job names them (zero-padded steps) and the monitor lists them."""
    return {step: f"checkpoint-{step:08d}.pt" for step in steps}


def _finding(rule="ExplodingTensor", step=2, phase="warmup") -> Finding:
    return Finding(rule=rule, step=step, phase=phase, message="fired")


def restoring(state: WorkflowState) -> WorkflowState:
    """The current attempt's summary says its script loads the checkpoint it is handed (the
    reference train.py does)."""
    s = state.model_copy(deep=True)
    s.attempts[-1].watched = Watched(integration="library", restores=True)
    return s


def _with_spec(state: WorkflowState, **changes) -> WorkflowState:
    spec = {**state.run_spec, **changes}
    s = state.model_copy(deep=True)
    s.run_spec = spec
    s.attempts[-1].run_spec = spec
    return s


def test_original_policy_ends_where_the_aws_sample_did(settings):
    """From warm-up 0.1 on a problem that explodes until batch norm: 7 jobs, like the original."""
    state = simulate(settings, {"policy": "original"})
    assert len(state.attempts) == 7
    assert state.outcome == "succeeded"
    assert state.history.num_warmup_adjustments == 5
    assert state.history.num_batch_layer_adjustments == 1
    assert state.history.num_learning_rate_adjustments == 0
    assert state.history.num_retraining == 6
    final = state.attempts[-1].run_spec
    assert final["warmup_learning_rate"] == pytest.approx(0.003125)
    assert final["add_batch_norm"] == 1
    assert final["learning_rate"] == pytest.approx(0.1)
    assert [a.run_spec["warmup_learning_rate"] for a in state.attempts] == pytest.approx(
        [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125, 0.003125]
    )


def test_default_policy_fixes_the_reference_explosion_in_two_jobs(settings):
    state = simulate(settings, {})
    assert len(state.attempts) == 2
    assert state.outcome == "succeeded"
    assert state.attempts[0].decision.remedy == "add_batch_norm"
    final = state.attempts[-1].run_spec
    # Batch norm alone: the learning rates stay where the recipe wanted them.
    assert (final["add_batch_norm"], final["warmup_learning_rate"], final["learning_rate"]) == (1, 0.1, 0.1)
    assert state.history.num_batch_layer_adjustments == 1
    assert state.history.num_warmup_adjustments == 0


def test_original_ladder_order_and_end(settings):
    state = launched(settings, {"policy": "original"})
    state = _with_spec(state, warmup_learning_rate=0.003125, add_batch_norm=1, learning_rate=0.0011)
    plan = policy.plan(state, _finding(), written())
    assert plan.decision.action == "end"
    assert plan.decision.outcome == "gave_up"
    state = _with_spec(state, learning_rate=0.002)
    plan = policy.plan(state, _finding(), written())
    assert plan.run_spec["learning_rate"] == pytest.approx(0.0018)
    assert plan.counters == ("num_learning_rate_adjustments",)


def test_original_ignores_which_rule_fired(settings):
    state = launched(settings, {"policy": "original"})
    plan = policy.plan(state, _finding(rule="VanishingGradient", phase="main"), written())
    assert plan.decision.remedy == "halve_warmup_lr"


def test_default_lowers_warmup_lr_only_for_an_explosion_during_warmup(settings):
    state = _with_spec(launched(settings), add_batch_norm=1)
    in_warmup = policy.plan(state, _finding(phase="warmup"), written())
    assert in_warmup.decision.remedy == "lower_warmup_lr"
    assert in_warmup.run_spec["warmup_learning_rate"] == pytest.approx(0.025)
    # The warm-up ran at the main rate (0.1), so the main phase would meet the failing rate again.
    assert in_warmup.run_spec["learning_rate"] == pytest.approx(0.025)
    assert "no lower than the warm-up rate that failed" in in_warmup.decision.reason
    # A main rate below the failing warm-up rate is left alone: the warm-up was too steep for the start.
    steep = _with_spec(launched(settings), add_batch_norm=1, warmup_learning_rate=0.2, learning_rate=0.1)
    lowered = policy.plan(steep, _finding(phase="warmup"), written()).run_spec
    assert (lowered["warmup_learning_rate"], lowered["learning_rate"]) == (pytest.approx(0.05), 0.1)
    after_warmup = policy.plan(state, _finding(step=500, phase="main"), written())
    assert after_warmup.decision.remedy == "lower_lr"
    # No stable rate known (the finding carries none): a quarter; the warm-up rate, now above the
    # main rate, comes down with it.
    assert after_warmup.run_spec["learning_rate"] == pytest.approx(0.025)
    assert after_warmup.run_spec["warmup_learning_rate"] == pytest.approx(0.025)


def test_default_clips_gradients_once_learning_rates_are_at_their_floor(settings):
    floor = 0.1 * EXPLOSION_RATE_FLOOR  # of the job's 0.1
    state = _with_spec(launched(settings), add_batch_norm=1, warmup_learning_rate=floor * 2)
    # A quarter of twice the floor is below it: the floor itself, once.
    assert policy.plan(state, _finding(phase="warmup"), written()).run_spec["warmup_learning_rate"] == floor
    state = _with_spec(state, warmup_learning_rate=floor)
    plan = policy.plan(state, _finding(phase="warmup"), written())
    assert plan.decision.remedy == "clip_gradients"
    assert plan.run_spec["grad_clip"] == 1.0
    clipped = _with_spec(state, grad_clip=1.0)
    assert policy.plan(clipped, _finding(phase="warmup"), written()).run_spec["grad_clip"] == 0.5


def test_default_never_repeats_a_recipe_already_tried(settings):
    state = launched(settings)
    # Pretend the batch-norm recipe was already tried in an earlier attempt.
    earlier = state.attempts[0].model_copy(
        update={"run_spec": {**state.run_spec, "add_batch_norm": 1}}
    )
    s = state.model_copy(deep=True)
    s.attempts = [earlier, state.attempts[0].model_copy(update={"number": 2})]
    plan = policy.plan(s, _finding(phase="warmup"), written())
    assert plan.decision.remedy == "lower_warmup_lr"
    assert not s.tried(plan.run_spec)


def test_default_gives_up_when_every_remedy_is_used(settings):
    state = _with_spec(
        launched(settings), add_batch_norm=1, warmup_learning_rate=0.1 * EXPLOSION_RATE_FLOOR, grad_clip=0.15,
        batch_size=512,
    )
    plan = policy.plan(state, _finding(phase="warmup"), written())
    assert plan.decision.action == "end"
    assert plan.decision.outcome == "gave_up"
    assert "used up" in plan.decision.reason


def test_resume_from_last_healthy_checkpoint_when_the_network_is_unchanged(settings):
    state = restoring(_with_spec(launched(settings), add_batch_norm=1))
    plan = policy.plan(state, _finding(step=475, phase="main"), written(50, 100, 450, 500))
    assert plan.decision.remedy == "lower_lr"
    assert plan.decision.resume_from == f"{state.attempts[-1].checkpoint_s3_uri}/checkpoint-00000450.pt"
    assert "resumes from checkpoint-00000450.pt" in plan.decision.reason


def test_a_new_architecture_starts_from_scratch(settings):
    state = launched(settings)
    plan = policy.plan(state, _finding(step=475, phase="main"), written(50, 100, 450))
    assert plan.decision.remedy == "add_batch_norm"
    assert plan.decision.resume_from is None
    assert "starts fresh (the network changes" in plan.decision.reason


def test_without_a_step_no_checkpoint_is_trusted(settings):
    state = _with_spec(launched(settings), add_batch_norm=1)
    debugger = Finding(rule="ExplodingTensor", source="debugger", message="IssuesFound")
    plan = policy.plan(state, debugger, written(50, 100))
    # Phase unknown: the warm-up remedy does not apply, the main LR does.
    assert plan.decision.remedy == "lower_lr"
    assert plan.decision.resume_from is None


def test_plateau_after_warmup_ends_early_keeping_the_best_checkpoint(settings):
    state = launched(settings)
    plan = policy.plan(state, _finding(rule="LossNotDecreasing", step=900, phase="main"), written(800, 850, 900))
    assert plan.decision.action == "end"
    assert plan.decision.outcome == "stopped_early"
    assert plan.decision.resume_from.endswith("/checkpoint-00000850.pt")
    assert "stopped early" in plan.decision.reason


def test_loss_that_never_decreased_gets_a_remedy_not_an_early_stop(settings):
    state = launched(settings)
    plan = policy.plan(state, _finding(rule="LossNotDecreasing", step=20, phase="warmup"), written())
    assert plan.decision.action == "relaunch"
    assert plan.decision.remedy == "add_batch_norm"


def test_overfit_ends_early(settings):
    state = launched(settings)
    plan = policy.plan(state, _finding(rule="Overfit", step=1200, phase="main"), written(1000, 1150))
    assert (plan.decision.action, plan.decision.outcome) == ("end", "stopped_early")


def test_vanishing_gradient_ladder(settings):
    state = _with_spec(launched(settings), add_batch_norm=1, activation="relu")
    plan = policy.plan(state, _finding(rule="VanishingGradient", step=300, phase="main"), written(250))
    assert plan.decision.remedy == "use_elu"
    assert plan.decision.resume_from is None  # activation changes the network
    elu = _with_spec(state, activation="elu")
    plan = policy.plan(elu, _finding(rule="VanishingGradient", step=300, phase="main"), written(250))
    assert plan.decision.remedy == "raise_lr"
    assert plan.run_spec["learning_rate"] == pytest.approx(0.2)


def test_a_rule_without_a_ladder_ends_the_execution(settings):
    plan = policy.plan(launched(settings), _finding(rule="ClassImbalance"), written())
    assert plan.decision.action == "end"
    assert "no remedy is declared for ClassImbalance" in plan.decision.reason


@pytest.mark.parametrize("rule", sorted(ladders.TABLE))
def test_every_relaunch_decision_has_a_one_line_reason(settings, rule):
    plan = policy.plan(launched(settings), _finding(rule=rule, step=300, phase="main"), written(250))
    assert plan.decision.reason
    assert "\n" not in plan.decision.reason


def test_an_explosion_nothing_fixes_ends_within_the_ladders_bounds(settings):
    state = simulate(settings, {}, explodes=lambda spec: True)
    assert state.outcome == "diverged"
    specs = [attempt.run_spec for attempt in state.attempts]
    floor = 0.1 * EXPLOSION_RATE_FLOOR  # of the job's own warm-up rate
    assert all(spec["warmup_learning_rate"] >= floor for spec in specs)
    assert all(spec["grad_clip"] == 0 or spec["grad_clip"] >= 0.1 for spec in specs)
    assert len({recipe_key(spec) for spec in specs}) == len(specs)  # no recipe twice
    # BN, warm-up 0.1 -> 0.025 -> ... a quarter each time -> the floor (1/1,000 of the job's own),
    # clip 1.0 -> 0.5 -> 0.25 -> 0.125, where max_num_retraining (10) ends it before a larger batch.
    assert [spec["warmup_learning_rate"] for spec in specs[:7]] == pytest.approx(
        [0.1, 0.1, 0.025, 0.00625, 0.0015625, 0.000390625, floor]
    )
    assert [spec["grad_clip"] for spec in specs[7:11]] == [1.0, 0.5, 0.25, 0.125]
    assert len(specs) == 11
    assert "max_num_retraining" in state.reason and "raise_batch_size" in state.reason


def test_the_original_policy_on_the_same_hopeless_run_stops_at_max_num_retraining(settings):
    state = simulate(settings, {"policy": "original"}, explodes=lambda spec: True)
    assert state.outcome == "diverged"
    assert state.history.num_retraining == 10
    assert len(state.attempts) == 11
    assert "max_num_retraining" in state.reason


# -- remedies sized and placed by the evidence ------------------------------------------------------


def _exploded(rate: float, *, step: int = 12, stable: float | None = 0.1, onset: int | None = 8) -> Finding:
    """The sentinel's finding for an explosion after warm-up, with its reading of the run-up."""
    return Finding(
        rule="ExplodingTensor", step=step, phase="main", learning_rate=rate, stable_learning_rate=stable,
        onset_step=onset, message="fired",
    )


def _history(settings, *attempts: tuple[dict, Finding], resumed_from: str | None = None) -> WorkflowState:
    """A state whose attempts ran these recipes (changes to the reference's) and ended in these findings."""
    base = launched(settings)
    s = base.model_copy(deep=True)
    s.attempts = []
    for number, (changes, finding) in enumerate(attempts, start=1):
        spec = {**base.run_spec, **changes}
        s.attempts.append(
            base.attempts[0].model_copy(
                update={"number": number, "run_spec": spec, "finding": finding,
                        "watched": Watched(integration="library", restores=True)}
            )
        )
    s.attempts[-1].resumed_from = resumed_from
    s.run_spec = s.attempts[-1].run_spec
    return s


def test_a_rate_that_explodes_after_a_stable_warmup_is_bisected_and_resumed_before_the_switch(settings):
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 3.0}, _exploded(3.0)))
    plan = policy.plan(state, state.current.finding, written(5, 10))
    assert plan.decision.remedy == "lower_lr"
    # A tenth of the way (in log space) from the stable 0.1 (the warm-up's) to the failing 3.0.
    assert plan.run_spec["learning_rate"] == pytest.approx(0.1 * 30**0.1)
    assert plan.run_spec["warmup_learning_rate"] == 0.1
    # The copy at step 10 is two steps into the failing rate; the one at 5 is from before the switch (8).
    assert plan.decision.resume_from.endswith("/checkpoint-00000005.pt")
    assert "a tenth of the way from the last stable rate 0.1 to the failing 3" in plan.decision.reason


def test_the_bisection_narrows_with_each_failure_and_settles_on_the_stable_rate(settings):
    bn = {"add_batch_norm": 1}
    tried = 0.1 * 30**0.1
    state = _history(settings, ({**bn, "learning_rate": 3.0}, _exploded(3.0)),
                     ({**bn, "learning_rate": tried}, _exploded(tried)))
    plan = policy.plan(state, state.current.finding, written(5, 10))
    # 0.14 against 0.1: within 2x, so the stable rate itself.
    assert plan.run_spec["learning_rate"] == pytest.approx(0.1)
    far = _history(settings, ({**bn, "learning_rate": 30.0}, _exploded(30.0)), ({**bn, "learning_rate": 1.0},
                   _exploded(1.0)))
    assert policy.plan(far, far.current.finding, written(5)).run_spec["learning_rate"] == pytest.approx(0.1 * 10**0.1)


def test_rates_that_exploded_in_another_network_are_not_evidence(settings):
    # Without batch norm the network failed at 0.1; with it, only its own failure at 3.0 counts,
    # and with no stable rate reported (a finding without the sentinel's run-up) the step is a quarter.
    state = _history(settings, ({}, _exploded(0.1, stable=None, onset=None)),
                     ({"add_batch_norm": 1, "learning_rate": 3.0}, _exploded(3.0, stable=None, onset=None)))
    plan = policy.plan(state, state.current.finding, written())
    assert plan.run_spec["learning_rate"] == pytest.approx(0.75)


def test_a_rate_that_never_took_a_healthy_step_comes_down_an_order_of_magnitude(settings):
    # The sentinel's run-up put the onset in the first steps and found no rate stable: wrecked from
    # its start, a rate far too high (the public scripts at 100 to 10,000 times theirs). Quartering
    # would use up the relaunches on the way down; a tenth of it.
    bn = {"add_batch_norm": 1}
    wrecked = _history(settings, ({**bn, "learning_rate": 3.0}, _exploded(3.0, step=31, stable=None, onset=4)))
    plan = policy.plan(wrecked, wrecked.current.finding, written())
    assert plan.run_spec["learning_rate"] == pytest.approx(0.3), plan.decision
    assert "never took five healthy steps: a tenth of it" in plan.decision.reason, plan.decision.reason
    # Healthy steps at the failing rate before it failed (the run-up's stable rate is that rate), or an
    # onset past the first steps with no stable rate (a schedule that changes its rate every step): a
    # quarter, as before.
    for finding in (_exploded(3.0, step=31, stable=3.0, onset=20), _exploded(3.0, step=31, stable=None, onset=5)):
        state = _history(settings, ({**bn, "learning_rate": 3.0}, finding))
        assert policy.plan(state, finding, written()).run_spec["learning_rate"] == pytest.approx(0.75)


def test_a_warmup_rate_above_the_main_rate_comes_down_to_it(settings):
    finding = Finding(rule="ExplodingTensor", step=2, phase="warmup", learning_rate=3.0, message="fired")
    state = _history(settings, ({"add_batch_norm": 1, "warmup_learning_rate": 3.0}, finding))
    plan = policy.plan(state, finding, written())
    assert plan.decision.remedy == "lower_warmup_lr"
    assert (plan.run_spec["warmup_learning_rate"], plan.run_spec["learning_rate"]) == (0.1, 0.1)
    assert plan.decision.resume_from is None


def test_a_relaunch_that_explodes_right_after_its_checkpoint_starts_fresh(settings):
    uri = "s3://bucket/executions/e/attempt-1/checkpoints/checkpoint-00000010.pt"
    finding = _exploded(1.5, step=12, onset=None)
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 1.5}, finding), resumed_from=uri)
    assert policy.plan(state, finding, written()).decision.resume_from is None
    later = _exploded(1.5, step=40, onset=None)
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 1.5}, later), resumed_from=uri)
    assert policy.plan(state, later, written()).decision.resume_from == uri


def test_a_relaunch_whose_run_up_began_before_its_checkpoint_starts_fresh(settings):
    # Resumed at step 5 from a state whose loss was already twice the start: the sentinel places the
    # onset at 4, before the run's first step, so that checkpoint carries the run-up.
    uri = "s3://bucket/executions/e/attempt-1/checkpoints/checkpoint-00000005.pt"
    finding = _exploded(0.05, step=23, onset=4)
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 0.05}, finding), resumed_from=uri)
    assert policy.plan(state, finding, written(10, 15, 20)).decision.resume_from is None
    healthy = _exploded(0.05, step=23, onset=18)
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 0.05}, healthy), resumed_from=uri)
    assert policy.plan(state, healthy, written(10, 15, 20)).decision.resume_from.endswith("/checkpoint-00000015.pt")


def test_a_diverging_loss_is_answered_as_an_explosion(settings):
    # The sentinel's Diverging (a finite loss ten times its start) at 3.0 after a stable warm-up at 0.1.
    diverging = _exploded(3.0, step=10).model_copy(update={"rule": "Diverging"})
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 3.0}, diverging))
    plan = policy.plan(state, diverging, written(5))
    assert plan.decision.remedy == "lower_lr"
    assert plan.run_spec["learning_rate"] == pytest.approx(0.1 * 30**0.1)  # 3.0 counts as the failing rate
    assert plan.decision.resume_from.endswith("/checkpoint-00000005.pt")


# -- a rising loss is a divergence, whatever fired -------------------------------------------------


@pytest.mark.parametrize("last_loss", [41.7, "nan"])
def test_a_diverging_nll_run_that_fired_vanishing_gradient_gets_a_lower_learning_rate_not_a_doubled_one(
    settings, last_loss
):
    # An NLL classifier whose loss climbed from 2.3 while its softmax saturated and its gradients
    # went flat: VanishingGradient fired, and the run used to be relaunched with twice the rate.
    state = _with_spec(launched(settings), add_batch_norm=1)
    state.attempts[-1].watched = Watched(integration="library", restores=True, first_loss=2.3, last_loss=last_loss)
    plan = policy.plan(state, _finding(rule="VanishingGradient", step=300, phase="main"), written(250))
    assert plan.decision.remedy == "lower_lr"
    assert plan.run_spec["learning_rate"] < state.run_spec["learning_rate"]
    assert plan.decision.reason.startswith("Diverging at step 300 (main)")


def test_vanishing_gradient_with_a_flat_loss_still_gets_its_own_ladder(settings):
    state = _with_spec(launched(settings), add_batch_norm=1)
    state.attempts[-1].watched = Watched(integration="library", restores=True, first_loss=2.3, last_loss=2.31)
    plan = policy.plan(state, _finding(rule="VanishingGradient", step=300, phase="main"), written(250))
    assert plan.decision.remedy == "raise_lr"


def test_once_a_rate_exploded_tiny_gradients_are_not_answered_by_raising_the_rate_again(settings):
    # Attempt 1 exploded at 0.4 and was relaunched at 0.1; at 0.1 the gradients went flat (Adam's
    # dead units after a too-large step look like this). Going back up retraces the explosion.
    flat = _finding(rule="VanishingGradient", step=40, phase="main")
    state = _history(settings, ({"add_batch_norm": 1, "learning_rate": 0.4}, _exploded(0.4, stable=None)),
                     ({"add_batch_norm": 1, "learning_rate": 0.1}, flat))
    state.attempts[-1].watched = Watched(integration="library", restores=True, first_loss=2.3, last_loss=2.29)
    plan = policy.plan(state, flat, written(30))
    assert plan.decision.remedy != "raise_lr"
    assert plan.run_spec["learning_rate"] <= 0.1



def test_a_rate_still_too_high_after_an_explosion_is_lowered_to_its_floor_before_the_ladder_gives_up(settings):
    # A GAN at 600 times its rate: exploded, then at a lowered rate its loss never learned. A quarter of
    # that would be under the floor (EXPLOSION_RATE_FLOOR of the job's own): the floor is the last try, as
    # for a sized rate, not a give-up a step short of it; at the floor, nothing lower is tried.
    bn = {"add_batch_norm": 1}
    own = launched(settings).run_spec["learning_rate"]
    floor = own * EXPLOSION_RATE_FLOOR
    flat = _finding(rule="NotLearning", step=39, phase="main")
    state = _history(settings, ({**bn, "learning_rate": own}, _exploded(own, stable=None)),
                     ({**bn, "learning_rate": floor * 2.5}, flat))
    plan = policy.plan(state, flat, written(30))
    assert plan.decision.remedy == "lower_lr" and plan.run_spec["learning_rate"] == pytest.approx(floor)
    at_floor = _history(settings, ({**bn, "learning_rate": own}, _exploded(own, stable=None)),
                        ({**bn, "learning_rate": floor}, flat))
    assert policy.plan(at_floor, flat, written(30)).decision.outcome in ("did_not_learn", "gave_up")


def test_a_rate_sized_back_to_the_value_it_has_is_no_relaunch_though_the_floats_differ(settings):
    # The corpus's one-cycle run at max_lr 20, its values divided by 4 (exact in binary): attempt 1
    # diverged at a rate of 3.27 and was relaunched at a quarter (1.2499999999999998); attempt 2's loss
    # climbed while VanishingGradient fired at 0.8169..11, one unit in the last place under a quarter of
    # 3.27. Sized from attempt 1's rate alone, the next value is 1.25: the same recipe up to rounding,
    # and a relaunch with it would only repeat attempt 2.
    bn = {"add_batch_norm": 1}
    flat = Finding(rule="VanishingGradient", step=100, phase="main", learning_rate=0.816910411466511, message="fired")
    state = _history(settings, ({**bn, "learning_rate": 5.0}, _exploded(3.2676416458660444, stable=None)),
                     ({**bn, "learning_rate": 1.2499999999999998}, flat))
    state.attempts[-1].watched = Watched(integration="library", restores=True, first_loss=2.27, last_loss=2.56)
    plan = policy.plan(state, flat, written(50))
    assert "learning_rate" not in (plan.decision.changes or {}), plan.decision.reason


def test_a_rule_that_matched_no_tensor_ends_unverified_naming_the_rule_and_the_tensor(settings):
    message = ("ClassImbalance: labels_regex 'CrossEntropyLoss_0_input_0' matched no tensor; "
               "closest saved: CrossEntropyLoss_input_0")
    finding = Finding(rule="NoTensorMatched", step=40, phase="main", message=message)
    plan = policy.plan(launched(settings), finding, written(20, 40))
    assert plan.decision.action == "end"
    assert plan.decision.outcome == "unverified"  # a configured rule never judged the run
    assert message in plan.decision.reason


def test_a_main_rate_brought_down_with_the_warm_up_stops_at_its_own_floor(settings):
    # A warm-up a tenth of the main rate, exploding whatever the rate: each lowering of the warm-up takes the
    # main rate down with it, but never below the ladder's floor of the main rate's own (0.1 x 1/1,000).
    state = simulate(settings, {"run_spec": {"warmup_learning_rate": 0.01}}, explodes=lambda spec: True)
    mains = [attempt.run_spec["learning_rate"] for attempt in state.attempts]
    assert min(mains) == pytest.approx(0.1 * EXPLOSION_RATE_FLOOR)
    assert min(attempt.run_spec["warmup_learning_rate"] for attempt in state.attempts) < min(mains)
    assert all(later <= earlier for earlier, later in itertools.pairwise(mains))
