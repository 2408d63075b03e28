"""History events per step, counted in the real definition's history, against the figures the
Lambdas use to refuse inputs that would outgrow Step Functions' 25,000-event quota
(lambdas/stabilizer_workflow/execution/service_limits.py). A change to the definition that adds events per check
shows up here before it shows up as a failed execution."""

from __future__ import annotations

from stabilizer_workflow.execution import service_limits
from tests.asl.harness import ok, raises
from tests.asl.test_paths import COMPLETED, LAUNCHED, PREPARED, WATCHING


def _events(workflow, checks: int, launches: int = 1, parking_fails: bool = False) -> int:
    relaunch = {**WATCHING, "next_action": "launch_new"}
    check_replies = []
    for launch in range(launches):
        check_replies += [ok(WATCHING)] * (checks - 1)
        check_replies.append(ok(relaunch if launch < launches - 1 else COMPLETED))
    parked = {}
    if parking_fails:
        # One second, the least the workflow accepts (state.wait_seconds >= 1). At 0 the interpreter's
        # task timeout fires while the watch function's invocation still runs, and the two race on
        # its evaluation stack: a history event then carries the payload as its timeoutInSeconds.
        fast = {**LAUNCHED, "wait_seconds": 1}
        parked = {"parked": [raises("AwsRequestRejected", "PutObject: AccessDenied")] * (checks * launches)}
        launch_replies = [ok(fast)] * launches
        check_replies = [ok({**r.payload, "wait_seconds": 1}) for r in check_replies]
    else:
        launch_replies = [ok(LAUNCHED)] * launches
    outcome = workflow.run({}, prepare=[ok(PREPARED)], launch=launch_replies, check=check_replies, **parked)
    assert outcome.status == "SUCCEEDED"
    return len(outcome.events)


def test_events_per_check_launch_and_run_fit_the_figures_the_input_is_checked_with(workflow):
    one, four = _events(workflow, 1), _events(workflow, 4)
    per_check = (four - one) / 3
    two_launches = _events(workflow, 1, launches=2)
    per_launch = two_launches - one - per_check
    start_and_end = one - per_check - per_launch
    assert per_check <= service_limits.EVENTS_PER_CHECK
    assert per_launch <= service_limits.EVENTS_PER_LAUNCH
    assert start_and_end <= service_limits.EVENTS_START_AND_END
    # The figures are not loose either: a check really costs most of what is reserved for it.
    assert per_check >= service_limits.EVENTS_PER_CHECK - 3


def test_a_check_through_the_fallback_wait_fits_the_figure_too(workflow):
    one, three = _events(workflow, 1, parking_fails=True), _events(workflow, 3, parking_fails=True)
    assert (three - one) / 2 <= service_limits.EVENTS_PER_CHECK
