"""What a person reads while a run goes on: one line per notification (its subject), bodies only
with --verbose, a progress bar per attempt with steps and time left on a terminal, and the same
lines without the live area in plain mode."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable

from stabilizer.cli.progress import LiveProgress, Pace, PlainProgress, time_left_text
from stabilizer.local.engine.execution_follower import EngineEvent
from stabilizer.reports.records import AttemptRecord, EvalPoint, MetricPoint, Notification, TrainingPlan, parse_log_line

SUBJECTS = [
    "Attempt 1 launched: warm-up LR 0.1, LR 0.1, no BN",
    "ExplodingTensor at step 3: relaunching attempt 2 with add_batch_norm 0->1",
    "Attempt 2 launched: warm-up LR 0.1, LR 0.1, BN",
    "Training succeeded after 2 attempts",
]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def note(subject: str) -> Notification:
    details = {"event_type": "x", "execution": {"name": "run-1"}, "decision": {"reason": "because"}}
    message = f"Execution: run-1\nPolicy: default\n\nWhy: because\n\nDetails (JSON):\n{json.dumps(details, indent=2)}"
    return Notification(subject=subject, message=message, received=0.0)


def two_attempts(clock: Clock) -> list[Callable[[], EngineEvent]]:
    """The events of the reference problem: attempt 1 explodes at step 3, attempt 2 runs 36 steps."""
    first = AttemptRecord(number=1, job_name="stabilizer-abc-1")
    second = AttemptRecord(number=2, job_name="stabilizer-abc-2")
    events: list[Callable[[], EngineEvent]] = []

    def at(seconds: float, event: EngineEvent, change=None) -> None:
        def apply() -> EngineEvent:
            clock.now = 100.0 + seconds
            if change:
                change()
            return event

        events.append(apply)

    def job(attempt: AttemptRecord, status: str, secondary: str) -> None:
        attempt.status, attempt.secondary_status = status, secondary

    at(0.3, EngineEvent(kind="state", state="ValidateInput"))
    at(0.4, EngineEvent(kind="state", state="LaunchTrainingJob"))
    at(0.5, EngineEvent(kind="job", attempt=first, detail="InProgress/Downloading"))
    at(0.6, EngineEvent(kind="notification", notification=note(SUBJECTS[0])))
    at(
        1.0,
        EngineEvent(kind="job", attempt=first, detail="InProgress/Training"),
        lambda: job(first, "InProgress", "Training"),
    )
    at(1.5, EngineEvent(kind="plan", attempt=first), lambda: setattr(first, "plan", TrainingPlan(36)))
    # The job logs every 10 steps: it blows up at step 3 before logging one; the finding says where.
    findings = {"findings": [{"rule": "ExplodingTensor", "step": 3}]}
    at(8.3, EngineEvent(kind="finding", attempt=first), lambda: setattr(first, "findings", findings))
    at(9.0, EngineEvent(kind="job", attempt=first, detail="Failed/Failed"), lambda: job(first, "Failed", "Failed"))
    for state in ("CheckJobAndRules", "DecideNextStep", "LaunchTrainingJob"):
        at(9.4, EngineEvent(kind="state", state=state))
    at(9.4, EngineEvent(kind="notification", notification=note(SUBJECTS[1])))
    at(9.4, EngineEvent(kind="notification", notification=note(SUBJECTS[2])))
    at(
        9.7,
        EngineEvent(kind="job", attempt=second, detail="InProgress/Training"),
        lambda: job(second, "InProgress", "Training"),
    )
    # Attempt 2 says nothing of its total for a while: its bar is indeterminate until the plan line.
    at(10.0, EngineEvent(kind="plan", attempt=second), lambda: setattr(second, "plan", TrainingPlan(36)))
    for seconds, step in ((20.0, 9), (30.0, 19), (40.0, 29), (46.0, 35)):
        point = MetricPoint(step=step, loss=1.0, grad_norm=2.0, lr=0.1)
        at(seconds, EngineEvent(kind="metric", attempt=second, metric=point), lambda p=point: second.metrics.append(p))
    at(47.0, EngineEvent(kind="eval", attempt=second, evaluation=EvalPoint(3, 0.69, 0.73)))
    at(
        48.0,
        EngineEvent(kind="job", attempt=second, detail="Completed/Completed"),
        lambda: job(second, "Completed", "Completed"),
    )
    at(49.0, EngineEvent(kind="state", state="TrainingSucceeded"))
    at(49.0, EngineEvent(kind="notification", notification=note(SUBJECTS[3])))
    return events


def replay(view, clock: Clock) -> None:
    with view:
        for apply in two_attempts(clock):
            view(apply())


def plain_lines(verbose: bool) -> list[str]:
    clock = Clock()
    out = io.StringIO()
    replay(PlainProgress(out, verbose=verbose, clock=clock), clock)
    return out.getvalue().splitlines()


def test_plain_prints_one_line_per_notification_and_nothing_else():
    lines = plain_lines(verbose=False)
    assert len(lines) == len(SUBJECTS)
    assert [line.split("] ", 1)[1] for line in lines] == SUBJECTS
    assert lines[0] == "[    0.6s] Attempt 1 launched: warm-up LR 0.1, LR 0.1, no BN"
    text = "\n".join(lines)
    assert "{" not in text and "Details (JSON)" not in text


def test_verbose_adds_the_bodies_and_the_observations():
    lines = plain_lines(verbose=True)
    text = "\n".join(lines)
    for subject in SUBJECTS:
        assert subject in text
    assert text.count("Details (JSON):") == len(SUBJECTS)
    assert '"event_type": "x"' in text
    assert "attempt 1 sentinel: ExplodingTensor fired at step 3" in text
    assert "attempt 2 training: 36 steps" in text
    assert "attempt 2 step 35 loss 1 grad_norm 2 lr 0.1" in text
    # The monitor loop re-enters its states every poll; each shows once until something happens.
    assert text.count("state LaunchTrainingJob") == 2
    assert len(lines) > 4 * len(SUBJECTS)


def test_a_failed_task_is_a_line_even_without_verbose():
    out = io.StringIO()
    with PlainProgress(out) as view:
        view(EngineEvent(kind="state", state=None, detail="SageMakerThrottled: task failed"))
    assert out.getvalue().endswith("] task failed: SageMakerThrottled: task failed\n")


def live_output(width: int = 160) -> str:
    from rich.console import Console

    clock = Clock()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width, color_system=None)
    replay(LiveProgress(out, "run-1", console=console, clock=clock), clock)
    return out.getvalue()


def test_live_view_prints_the_same_lines_above_a_bar_per_attempt():
    text = live_output()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    for line in plain_lines(verbose=False):
        assert line in plain
    assert "Details (JSON)" not in plain and '"event_type"' not in plain
    # The final frame: both attempts with their steps; the first stopped where it exploded.
    assert re.search(r"attempt 1 .*4/36 steps.*Failed.*ExplodingTensor fired at step 3", plain)
    assert re.search(r"attempt 2 .*36/36 steps.*Completed", plain)
    assert "run-1  TrainingSucceeded" in plain


def test_an_attempt_without_a_known_total_says_so():
    from rich.console import Console

    clock = Clock()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    attempt = AttemptRecord(number=1, job_name="job-1", status="InProgress", secondary_status="Training")
    with LiveProgress(out, "run-1", console=console, clock=clock) as view:
        attempt.metrics.append(MetricPoint(step=9, loss=1.5, grad_norm=3.0))
        view(EngineEvent(kind="metric", attempt=attempt, metric=attempt.metrics[-1]))
    assert "step 10, total steps unknown" in out.getvalue()


def test_total_steps_come_from_the_log_else_from_a_max_steps_cap():
    assert parse_log_line("training steps=36 steps_per_epoch=12 examples=1437 start_step=12") == TrainingPlan(36, 12)
    attempt = AttemptRecord(number=1, job_name="j", hyperparameters={"max_steps": "6"})
    assert attempt.total_steps == 6
    attempt.plan = TrainingPlan(4)
    assert attempt.total_steps == 4
    assert AttemptRecord(number=1, job_name="j", hyperparameters={"max_steps": "0"}).total_steps is None


def test_time_left_follows_the_measured_pace_and_counts_down_between_steps():
    pace = Pace(total=36, done=10, start_step=0, started_at=0.0, updated_at=10.0)  # 1 step a second
    assert pace.seconds_left(10.0) == 26.0
    assert time_left_text(pace, 12.0, finished=False) == "about 0:24 left"
    assert time_left_text(pace, 100.0, finished=False) == "about 0:00 left"
    assert time_left_text(Pace(total=36, done=0, start_step=0), 5.0, finished=False) == "time left -"
    resumed = Pace(total=36, done=22, start_step=12, started_at=0.0, updated_at=20.0)  # 10 steps in 20 s
    assert resumed.seconds_left(20.0) == 28.0
