"""The live view of a running execution: attempt, state, step, loss, gradient norm, rules, decisions.

On a terminal it is a small panel redrawn in place (rich), with each SNS message printed above
it as it is published; elsewhere (CI logs, pipes) it is plain lines, one per observation. Both
only read the engine's observations; they never act on the run.
"""

from __future__ import annotations

import math
import time
from typing import Any, TextIO

from stabilizer.local.engine import EngineEvent
from stabilizer.records import AttemptRecord, Notification


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def rule_status(attempt: AttemptRecord | None, *, findings_only: bool = False) -> str:
    """What the rules say about an attempt, in a few words (the sentinel's findings, then
    the out-of-job evaluations unless ``findings_only``)."""
    if attempt is None:
        return "-"
    parts = []
    if attempt.findings:
        for finding in attempt.findings.get("findings", []):
            parts.append(f"{finding.get('rule', '?')} fired at step {finding.get('step', '?')}")
    for status in [] if findings_only else attempt.rule_statuses:
        parts.append(f"{status.get('RuleConfigurationName')}: {status.get('RuleEvaluationStatus')}")
    return "; ".join(parts) if parts else "no findings"


def notification_text(note: Notification) -> str:
    return f"{note.subject}\n{note.message.rstrip()}"


class PlainProgress:
    """One line per observation; metric lines as the job logs them."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()
        # The monitor loop enters the same few states every poll; each is shown once until
        # something else happens (a job status, a finding, a notification).
        self._states_shown: set[str] = set()

    def _line(self, text: str) -> None:
        self.stream.write(f"[{time.monotonic() - self.started:7.1f}s] {text}\n")
        self.stream.flush()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def message(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __call__(self, event: EngineEvent) -> None:
        attempt = event.attempt
        if event.kind == "state" and event.state:
            if event.state not in self._states_shown:
                self._states_shown.add(event.state)
                self._line(f"state {event.state}")
            return
        if event.kind in ("job", "finding", "rules", "notification"):
            self._states_shown.clear()
        if event.kind == "state":
            self._line(f"task failed: {event.detail}")
        elif event.kind == "job" and attempt:
            self._line(f"attempt {attempt.number} {attempt.job_name}: {event.detail}")
            if attempt.failure_reason and attempt.status == "Failed":
                self._line(f"attempt {attempt.number} failure reason: {attempt.failure_reason}")
        elif event.kind == "metric" and attempt and event.metric:
            m = event.metric
            self._line(
                f"attempt {attempt.number} step {m.step} loss {fmt(m.loss)} grad_norm {fmt(m.grad_norm)} lr {fmt(m.lr)}"
            )
        elif event.kind == "eval" and attempt and event.evaluation:
            e = event.evaluation
            self._line(
                f"attempt {attempt.number} eval epoch {e.epoch} test_loss {fmt(e.test_loss)} "
                f"test_accuracy {fmt(e.test_accuracy)}"
            )
        elif event.kind == "finding" and attempt:
            self._line(f"attempt {attempt.number} sentinel: {rule_status(attempt, findings_only=True)}")
        elif event.kind == "rules" and attempt:
            self._line(f"attempt {attempt.number} rule evaluations: {event.detail}")
        elif event.kind == "notification" and event.notification:
            self._line("SNS message published:")
            for line in notification_text(event.notification).splitlines():
                self.stream.write(f"    {line}\n")
            self.stream.flush()


class LiveProgress:
    """A panel redrawn in place on a terminal, with SNS messages printed above it."""

    def __init__(self, stream: TextIO, execution: str) -> None:
        from rich.console import Console

        self.console = Console(file=stream)
        self.execution = execution
        self.started = time.monotonic()
        self.state = "-"
        self.attempt: AttemptRecord | None = None
        self.decision = "-"
        self.live: Any = None

    def __enter__(self) -> LiveProgress:
        from rich.live import Live

        # The handlers' output is redirected while they run; the panel must not take part in that.
        self.live = Live(
            self._render(), console=self.console, refresh_per_second=4, redirect_stdout=False, redirect_stderr=False
        )
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(None, None, None)

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(show_header=False, box=None, padding=(0, 1))
        table.add_column(style="bold")
        table.add_column()
        a = self.attempt
        last = a.last if a else None
        table.add_row("execution", self.execution)
        table.add_row("elapsed", f"{time.monotonic() - self.started:.0f} s")
        table.add_row("step (state)", self.state)
        table.add_row("attempt", f"{a.number}  {a.job_name}" if a else "-")
        table.add_row("job", f"{a.status} / {a.secondary_status}" if a else "-")
        table.add_row("training step", str(last.step) if last else "-")
        table.add_row("loss", fmt(last.loss) if last else "-")
        table.add_row("gradient norm", fmt(last.grad_norm) if last else "-")
        table.add_row("rules", rule_status(a))
        table.add_row("last decision", self.decision)
        return table

    def __call__(self, event: EngineEvent) -> None:
        if event.attempt is not None:
            self.attempt = event.attempt
        if event.kind == "state" and event.state:
            self.state = event.state
        elif event.kind == "notification" and event.notification:
            note = event.notification
            self.decision = note.subject
            self.console.print(f"[bold]SNS[/bold] {note.subject}", highlight=False)
            self.console.print(note.message.rstrip(), highlight=False, markup=False)
        if self.live is not None:
            self.live.update(self._render())
