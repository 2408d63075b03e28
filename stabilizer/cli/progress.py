"""What a person sees while an execution runs: one line per notification, a bar per attempt.

- Every SNS notification is one line, its subject, printed as it is published. The bodies (what
  fired, the evidence, the next recipe, the JSON details) are in the report, and printed under
  their line with ``--verbose``, as are the observations behind them (states entered, job
  statuses, logged steps, evaluations, rule verdicts).
- On a terminal, a live area under those lines holds the execution's current state and one
  progress bar per attempt: steps done of the steps the job announced in its log (``training
  steps=N``), the time left at the pace measured so far, the job's status, loss and gradient norm.
  While the total is not known the bar is indeterminate and says so.
- Elsewhere (CI logs, pipes, ``--plain``) the same lines are written, without the live area.

Both only read the engine's observations; they never act on the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from stabilizer.local.engine.execution_follower import EngineEvent
from stabilizer.reports.records import AttemptRecord

TERMINAL_JOB_STATUSES = ("Completed", "Failed", "Stopped")


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def sentinel_findings(attempt: AttemptRecord) -> str | None:
    """The sentinel's findings of an attempt in a few words, or None while it found nothing."""
    found = [
        f"{f.get('rule', '?')} fired at step {f.get('step', '?')}" for f in (attempt.findings or {}).get("findings", [])
    ]
    return "; ".join(found) or None


class Lines:
    """The lines both views print: a notification's subject (its body too with ``verbose``), a
    failed task; with ``verbose`` also every observation. ``write`` receives each line."""

    def __init__(
        self, write: Callable[[str], None], *, verbose: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.write = write
        self.verbose = verbose
        self.clock = clock
        self.started = clock()
        # The monitor loop enters the same few states every poll; in verbose mode each is shown
        # once until something else happens (a job status, a finding, a notification).
        self._states_shown: set[str] = set()

    def line(self, text: str) -> None:
        self.write(f"[{self.clock() - self.started:7.1f}s] {text}")

    def __call__(self, event: EngineEvent) -> None:
        if event.kind == "notification" and event.notification:
            note = event.notification
            self.line(note.subject)
            if self.verbose:
                for text in note.message.rstrip().splitlines():
                    self.write(f"    {text}")
            self._states_shown.clear()
            return
        if event.kind == "state" and not event.state:
            self.line(f"task failed: {event.detail}")  # retried or caught by the definition; always worth a line
            return
        if self.verbose:
            self._observation(event)

    def _observation(self, event: EngineEvent) -> None:
        attempt = event.attempt
        if event.kind == "state" and event.state:
            if event.state not in self._states_shown:
                self._states_shown.add(event.state)
                self.line(f"state {event.state}")
            return
        if event.kind in ("job", "finding", "rules"):
            self._states_shown.clear()
        if event.kind == "job" and attempt:
            self.line(f"attempt {attempt.number} {attempt.job_name}: {event.detail}")
            if attempt.failure_reason and attempt.status == "Failed":
                self.line(f"attempt {attempt.number} failure reason: {attempt.failure_reason}")
        elif event.kind == "plan" and attempt and attempt.plan:
            self.line(f"attempt {attempt.number} training: {attempt.plan.total_steps} steps")
        elif event.kind == "metric" and attempt and event.metric:
            m = event.metric
            self.line(
                f"attempt {attempt.number} step {m.step} loss {fmt(m.loss)} grad_norm {fmt(m.grad_norm)} lr {fmt(m.lr)}"
            )
        elif event.kind == "eval" and attempt and event.evaluation:
            e = event.evaluation
            self.line(
                f"attempt {attempt.number} eval epoch {e.epoch} test_loss {fmt(e.test_loss)} "
                f"test_accuracy {fmt(e.test_accuracy)}"
            )
        elif event.kind == "finding" and attempt:
            self.line(f"attempt {attempt.number} sentinel: {sentinel_findings(attempt) or 'no findings'}")
        elif event.kind == "rules" and attempt:
            self.line(f"attempt {attempt.number} rule evaluations: {event.detail}")


class PlainProgress:
    """The lines alone, for logs and pipes."""

    def __init__(self, stream: TextIO, *, verbose: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.lines = Lines(self._write, verbose=verbose, clock=clock)

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def message(self, text: str) -> None:
        self._write(text)

    def __call__(self, event: EngineEvent) -> None:
        self.lines(event)


@dataclass
class Pace:
    """Where an attempt's bar stands: steps done of ``total`` (None: not known yet), and the time
    left at the pace measured since training started (None until two points are known)."""

    total: int | None
    done: int
    start_step: int
    started_at: float | None = None  # clock when training started (the plan line, else the first step)
    updated_at: float | None = None  # clock of the last logged step

    def seconds_left(self, now: float) -> float | None:
        if self.total is None or self.started_at is None or self.updated_at is None:
            return None
        progressed = self.done - self.start_step
        elapsed = self.updated_at - self.started_at
        if progressed <= 0 or elapsed <= 0:
            return None
        remaining = (self.total - self.done) * elapsed / progressed
        # Between two logged steps the estimate counts down rather than standing still.
        return max(0.0, remaining - (now - self.updated_at))


def steps_text(pace: Pace) -> str:
    if pace.total is None:
        return f"step {pace.done}, total steps unknown"
    return f"{pace.done}/{pace.total} steps"


def time_left_text(pace: Pace, now: float, finished: bool) -> str:
    if finished:
        return ""
    left = pace.seconds_left(now)
    if left is None:
        return "time left -" if pace.total is not None else ""
    minutes, seconds = divmod(round(left), 60)
    return f"about {minutes}:{seconds:02d} left"


class LiveProgress:
    """The lines, with a live area under them: the execution's state and a bar per attempt."""

    def __init__(
        self,
        stream: TextIO,
        execution: str,
        *,
        verbose: bool = False,
        console: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from rich.console import Console

        self.console = console or Console(file=stream)
        self.execution = execution
        self.clock = clock
        self.lines = Lines(self._print, verbose=verbose, clock=clock)
        self.state = "-"
        self.paces: dict[int, Pace] = {}
        self.tasks: dict[int, Any] = {}
        self.progress = self._progress()

    def _print(self, text: str) -> None:
        self.progress.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def _progress(self) -> Any:
        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
        from rich.table import Column
        from rich.text import Text

        view = self

        class Steps(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(steps_text(view.paces[task.fields["attempt"]]))

        class TimeLeft(ProgressColumn):
            def render(self, task: Any) -> Text:
                pace = view.paces[task.fields["attempt"]]
                return Text(time_left_text(pace, view.clock(), task.finished or task.fields["over"]), style="cyan")

        class Bars(Progress):
            def get_renderables(self) -> Any:
                elapsed = view.clock() - view.lines.started
                yield Text.assemble((view.execution, "bold"), f"  {view.state}  {elapsed:.0f} s")
                yield self.make_tasks_table(self.tasks)

        # The handlers' output is redirected while they run; the live area must not take part in that.
        return Bars(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=28),
            Steps(table_column=Column(no_wrap=True)),
            TimeLeft(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[detail]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=self.console,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.refresh()
        self.progress.stop()

    def message(self, text: str) -> None:
        self._print(text)

    def __call__(self, event: EngineEvent) -> None:
        self.lines(event)
        if event.kind == "state" and event.state:
            self.state = event.state
        if event.attempt is not None:
            self._update(event.attempt, event.kind)

    def _update(self, attempt: AttemptRecord, kind: str) -> None:
        now = self.clock()
        pace = self.paces.get(attempt.number)
        if pace is None:
            pace = self.paces[attempt.number] = Pace(total=None, done=0, start_step=0)
            self.tasks[attempt.number] = self.progress.add_task(
                f"attempt {attempt.number}", total=None, attempt=attempt.number, over=False, detail=""
            )
        pace.total = attempt.total_steps
        pace.done = attempt.steps_done
        if kind == "plan" and attempt.plan is not None:
            pace.start_step, pace.started_at = attempt.plan.start_step, now
        if kind == "metric":
            if pace.started_at is None:  # no plan line: the pace is measured from the first step
                pace.start_step, pace.started_at = pace.done, now
            pace.updated_at = now
        over = attempt.status in TERMINAL_JOB_STATUSES
        last = attempt.last
        detail = [attempt.secondary_status if attempt.status == "InProgress" else attempt.status]
        if last is not None:
            detail.append(f"loss {fmt(last.loss)}  grad {fmt(last.grad_norm)}")
        if found := sentinel_findings(attempt):
            detail.append(found)
        self.progress.update(
            self.tasks[attempt.number],
            total=pace.total,
            completed=pace.done,
            over=over,
            detail="  ".join(detail),
        )
        if over:
            self.progress.stop_task(self.tasks[attempt.number])
