"""What a notebook shows of an execution while it runs and once it ended: a status block refreshed
in place, the notifications it sent, and what it cost under its policy.

Everything comes from the client (``stabilizer.client``), whose AWS and local sides answer the
same questions; attempts read as rows from ``stabilizer.reports.attempts``. It never calls Step
Functions or SageMaker itself and never decides anything about a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from stabilizer.reports.attempts import attempt_rows, recipe_text


def status_text(view: Any, started: float | None = None) -> str:
    """A few lines on where an execution is: status, each attempt, the reason once it ended."""
    elapsed = f" after {time.monotonic() - started:.0f} s" if started is not None else ""
    lines = [f"{view.name}: {view.status}{elapsed}"]
    for row in attempt_rows(view.attempts, state=view.state):
        lines.append(f"  attempt {row.number} [{row.recipe}] {row.status}; finding: {row.finding}")
        if row.decision != "-":
            lines.append(f"    -> {row.decision}: {row.reason}")
    state = view.state or {}
    if view.done:
        lines.append(f"outcome: {state.get('outcome') or view.status}; {state.get('reason') or view.cause or ''}")
    return "\n".join(lines)


def follow(
    client: Any,
    execution_arn: str,
    *,
    poll_seconds: float = 1.0,
    timeout: float = 3600,
    show: Callable[[str], None] | None = None,
) -> Any:
    """Refresh one status display until the execution ends (or ``timeout``); returns the last view.

    In a notebook the status is one output updated in place (``display(..., display_id=True)``).
    """
    if show is None:
        show = _display_updater()
    started = time.monotonic()
    while True:
        view = client.describe(execution_arn)
        show(status_text(view, started))
        if view.done or time.monotonic() - started > timeout:
            return view
        time.sleep(poll_seconds)


def _display_updater() -> Callable[[str], None]:
    from IPython.display import display

    handle = None

    class _Text:
        def __init__(self, text: str) -> None:
            self.text = text

        def __repr__(self) -> str:
            return self.text

    def show(text: str) -> None:
        nonlocal handle
        if handle is None:
            handle = display(_Text(text), display_id=True)
        else:
            handle.update(_Text(text))

    return show


def notification_rows(notes: Iterable[Any]) -> list[dict[str, str]]:
    return [
        {
            "seconds": f"{note.received:.1f}",
            "event": note.event_type or note.attributes.get("source", "-"),
            "attempt": note.attributes.get("attempt", "-"),
            "subject": note.subject,
        }
        for note in notes
    ]


def policy_summary(view: Any) -> dict[str, str]:
    """Attempts, training steps and job seconds an execution consumed (and what was billed, with spot
    the savings), and how it ended."""
    state = view.state or {}
    attempts = view.attempts
    steps = sum(a.get("steps") or 0 for a in attempts)
    seconds = sum(a.get("seconds") or 0 for a in attempts)
    final = attempts[-1].get("run_spec") if attempts else None
    summary = {
        "policy": str(state.get("policy") or view.input.get("policy") or "default"),
        "outcome": str(state.get("outcome") or view.status),
        "attempts": str(len(attempts)),
        "training steps": str(steps),
        "job seconds": str(seconds),
    }
    billed = [a["billable_seconds"] for a in attempts if a.get("billable_seconds") is not None]
    if billed:  # BillableTimeInSeconds, and with spot the savings as SageMaker computes them
        summary["billed seconds"] = str(sum(billed))
        if (state.get("job") or {}).get("use_spot_instances") and seconds:
            summary["spot savings"] = f"{(1 - sum(billed) / seconds) * 100:.0f}%"
    summary["final recipe"] = recipe_text(final, state) if final else "-"
    return summary
