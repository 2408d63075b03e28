"""Attempts as rows, and rows as tables: the same row in the terminal, the report and the notebook.

A row joins what the workflow recorded of an attempt (the state payload's attempts: recipe,
finding, decision and its reason) with what was observed of its job from the outside (its log,
findings and timing), which is all there is for an attempt the payload does not hold yet (a run
interrupted while a job was starting). A recipe reads as the workflow's notifications write it
(``stabilizer_workflow.remedies.recipe_text``). It reads records; it never changes a run.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stabilizer.reports.records import AttemptRecord

COLUMNS = ("#", "job", "recipe", "status", "steps", "seconds", "finding", "in_job", "decision", "reason")


def recipe_text(values: Any, state: dict[str, Any] | None = None) -> str:
    """A recipe in a few words (``warm-up LR 0.1, LR 0.1, no BN``), as the notifications write it,
    through the knobs of the job in `state` (a state payload; the reference job's without one)."""
    from stabilizer_workflow.remedies import recipe_text as recipes

    return recipes.recipe_text(values, recipes.knob_names(state))


@dataclass
class AttemptRow:
    """One line of the attempts table."""

    number: str
    job: str
    recipe: str
    status: str
    steps: str
    seconds: str
    finding: str
    in_job: str  # the job's own rollbacks (job.recovery in_job), in a few words
    decision: str
    reason: str

    def cells(self) -> dict[str, str]:
        return dict(zip(COLUMNS, vars(self).values(), strict=True))


def _hyperparameters(attempt: AttemptRecord) -> dict[str, Any]:
    """A job's hyperparameters as values (CreateTrainingJob carries them as JSON text)."""
    values: dict[str, Any] = {}
    for key, text in attempt.hyperparameters.items():
        try:
            values[key] = json.loads(text)
        except ValueError:
            values[key] = text
    return values


def _finding(recorded: dict[str, Any] | None, observed: AttemptRecord | None,
             rollbacks: Sequence[dict[str, Any]] = ()) -> str:
    """The finding that ended the attempt; else the first the job rolled back from itself (``Diverging at step 4
    (rolled back)``), so that a job that recovered in place does not read as one where nothing fired."""
    if recorded:
        phase = f" ({recorded['phase']})" if recorded.get("phase") else ""
        return f"{recorded.get('rule')} at step {recorded.get('step')}{phase}"
    if not rollbacks and observed is not None:  # the job's own list, where the state holds none
        rollbacks = (observed.findings or {}).get("rollbacks", [])
    if rollbacks and rollbacks[0].get("rule"):
        return f"{rollbacks[0]['rule']} at step {rollbacks[0].get('step')} (rolled back)"
    explosion = observed.explosion() if observed else None
    return f"{explosion[1]} at step {explosion[0]}" if explosion else "-"


def _in_job(recorded: dict[str, Any], observed: AttemptRecord | None) -> str:
    """``2 rollbacks, on at LR 0.0167`` (``1 rollback (1 bad batch skipped), on at LR 0.01``): what the job
    decided itself, as the state or its findings.json say."""
    rollbacks = recorded.get("rollbacks") or []
    let_go = recorded.get("rollbacks_let_go") or 0  # the oldest, let go to keep the state small
    written = (observed.findings or {}).get("rollbacks", []) if observed is not None else []
    if written and (not rollbacks or let_go):  # the job's own list has every one
        rollbacks = [{"rate_after": r.get("learning_rate_after"), "bad_batch": r.get("outcome") == "bad_batch"}
                     for r in written]
        let_go = 0
    if not rollbacks and not let_go:
        return "-"
    total = len(rollbacks) + let_go
    count = f"{total} rollback{'s' if total > 1 else ''}"
    if let_go:
        count += f" ({let_go} no longer in the state)"
    if not rollbacks:
        return count
    bad = sum(1 for r in rollbacks  # a state recorded before Rollback.bad_batch: its fingerprints
              if (r["bad_batch"] if "bad_batch" in r else bool(r.get("bad_batches"))))
    if bad:
        count += f" ({bad} bad batch{'es' if bad > 1 else ''} skipped)"
    last = rollbacks[-1].get("rate_after")
    if isinstance(last, int | float):
        return f"{count}, on at LR {last:.3g}"
    return f"{count}, the last found no lower rate"


def _row(
    number: Any, recorded: dict[str, Any], observed: AttemptRecord | None, state: dict[str, Any] | None = None
) -> AttemptRow:
    decision = recorded.get("decision") or {}
    run_spec = recorded.get("run_spec") or (_hyperparameters(observed) if observed else {})
    steps = recorded.get("steps")
    if steps is None and observed is not None:
        steps = observed.steps_done
    seconds = f"{observed.seconds:.1f}" if observed is not None else recorded.get("seconds")
    return AttemptRow(
        number=str(number),
        job=str(recorded.get("job_name") or (observed.job_name if observed else "")),
        recipe=recipe_text(run_spec, state) if run_spec else "-",
        status=str(observed.status if observed else recorded.get("status", "")),
        steps="-" if steps is None else str(steps),
        seconds="-" if seconds is None else str(seconds),
        finding=_finding(recorded.get("finding"), observed, recorded.get("rollbacks") or ()),
        in_job=_in_job(recorded, observed),
        decision=str(decision.get("remedy") or decision.get("action") or "-"),
        reason=str(decision.get("reason") or "-"),
    )


def attempt_rows(
    recorded: Sequence[dict[str, Any]], observed: Sequence[AttemptRecord] = (), state: dict[str, Any] | None = None
) -> list[AttemptRow]:
    """A row per attempt: the observed jobs in launch order when there are any, else the
    workflow's attempts (a notebook reading an execution it did not follow). `state` (the state
    payload) says which hyperparameters are the job's knobs, for the recipe column."""
    by_job = {a.get("job_name"): a for a in recorded if isinstance(a, dict)}
    if observed:
        return [_row(o.number, by_job.get(o.job_name, {}), o, state) for o in observed]
    return [_row(a.get("number", ""), a, None, state) for a in recorded]


def _columns(rows: list[dict[str, str]], columns: Iterable[str] | None) -> list[str]:
    return list(columns) if columns else list(rows[0])


def text_table(rows: list[dict[str, str]], columns: Iterable[str] | None = None, width: int = 60) -> str:
    """Aligned columns with a rule under the header; cells cut at ``width`` characters."""
    if not rows:
        return "(nothing yet)"
    names = _columns(rows, columns)
    cells = [[str(r.get(c, ""))[:width] for c in names] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(names)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(names, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def html_table(rows: list[dict[str, str]], columns: Iterable[str] | None = None) -> str:
    if not rows:
        return "<p><em>nothing yet</em></p>"
    names = _columns(rows, columns)
    cell = "<{tag} style='text-align:left'>{text}</{tag}>"
    head = "".join(cell.format(tag="th", text=html.escape(c)) for c in names)
    body = "".join(
        "<tr>" + "".join(cell.format(tag="td", text=html.escape(str(r.get(c, "")))) for c in names) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(rows: list[dict[str, str]], columns: Iterable[str] | None = None) -> list[str]:
    if not rows:
        return ["(nothing yet)"]
    names = _columns(rows, columns)
    lines = ["| " + " | ".join(names) + " |", "| " + " | ".join("---" for _ in names) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in names) + " |")
    return lines


class Table:
    """Rows shown as HTML in a notebook and as aligned text elsewhere."""

    def __init__(
        self, rows: Sequence[dict[str, str] | AttemptRow], columns: Iterable[str] | None = None, title: str = ""
    ):
        self.rows = [r.cells() if isinstance(r, AttemptRow) else r for r in rows]
        self.columns = list(columns) if columns else None
        self.title = title

    def _repr_html_(self) -> str:
        title = f"<p><strong>{html.escape(self.title)}</strong></p>" if self.title else ""
        return title + html_table(self.rows, self.columns)

    def __repr__(self) -> str:
        return (self.title + "\n" if self.title else "") + text_table(self.rows, self.columns, width=70)
