"""The report of one execution: ``run.json``, ``report.md`` and plots of loss and gradient norm.

It joins what the workflow recorded (the state payload's attempts, with their recipe, finding
and decision) with what was observed from the outside (each job's log, findings and timing),
and writes them under the run directory. It reads records; it never changes a run.
"""

from __future__ import annotations

import json
from pathlib import Path

from stabilizer.reports import system_usage
from stabilizer.reports.attempts import AttemptRow, attempt_rows, markdown_table, text_table
from stabilizer.reports.plots import plot_quantity
from stabilizer.reports.records import RunRecord


def timing(record: RunRecord) -> dict[str, float]:
    jobs = sum(a.seconds for a in record.attempts)
    wall = record.wall_seconds
    overhead = wall - jobs
    return {
        "wall_seconds": round(wall, 2),
        "job_seconds": round(jobs, 2),
        "control_plane_seconds": round(overhead, 2),
        "control_plane_fraction": round(overhead / wall, 4) if wall > 0 else 0.0,
    }


# The outcomes of an execution (stabilizer_workflow.execution.state.Outcome; docs/contracts.md, "Outcomes"): the
# state machine ends the first two in a Succeed state, the others in TrainingNotRecovered.
SUCCESSES = ("succeeded", "stopped_early")
NOT_RECOVERED = ("unwatched", "unverified", "diverged", "did_not_learn", "gave_up", "failed")


def verdict(record: RunRecord) -> str:
    """The execution's outcome as the workflow named it (``stopped_early``, ``unwatched``, ...),
    ``interrupted`` for a run stopped with Ctrl-C, ``failed`` when the workflow itself broke."""
    if record.interrupted:
        return "interrupted"
    ended = (record.state or {}).get("outcome")
    if record.status == "SUCCEEDED":
        return ended if ended in SUCCESSES else "succeeded"
    if record.status == "FAILED" and record.error == "TrainingNotRecovered":
        # The workflow ended on its own terms; its state says what the evidence showed.
        return ended if ended in NOT_RECOVERED else "gave_up"
    return "failed" if record.status == "FAILED" else record.status.lower()


def outcome(record: RunRecord) -> str:
    """The outcome in words: ``succeeded``, ``stopped early``, ``did not learn``, ..."""
    return verdict(record).replace("_", " ")


def rows(record: RunRecord) -> list[AttemptRow]:
    """The attempts of ``record``: the state payload's, joined with what was observed of each job."""
    return attempt_rows((record.state or {}).get("attempts") or [], record.attempts, state=record.state)


TERMINAL_COLUMNS = ("#", "job", "recipe", "status", "steps", "seconds", "finding")


def table_text(record: RunRecord) -> str:
    """The attempts table for a terminal: a row per attempt (under 120 columns for the reference
    problem), its decision and the reason on the line under it."""
    attempts = rows(record)
    table = text_table([r.cells() for r in attempts], TERMINAL_COLUMNS).splitlines()
    lines = table[:2]
    for row, line in zip(attempts, table[2:], strict=True):
        lines.append(line)
        if row.in_job != "-":
            lines.append(f"   in the job: {row.in_job}")
        if row.decision != "-":
            lines.append(f"   -> {row.decision}: {row.reason}")
    return "\n".join(lines)


def evidence_lines(state: dict) -> list[str]:
    """What each attempt's summary showed, the evidence its verdict rests on (docs/contracts.md, 10).

    Steps are the losses the sentinel checked against the optimizer steps the job took: a job stopped
    by a rule checked the loss of a step it never took, so the first can exceed the second by one."""
    lines = []
    for attempt in state.get("attempts") or []:
        seen = attempt.get("watched")
        if not seen:
            lines.append(f"- attempt {attempt.get('number')}: no summary (nothing watched it, or it had not ended)")
            continue
        parts = [f"watched by the {seen.get('integration') or 'sentinel'}", _steps_text(seen)]
        first, last = seen.get("first_loss"), seen.get("last_loss")
        if first is None and last is None:
            parts.append("no loss seen")
        else:
            parts.append(f"loss {_known(first)} -> {_known(last)}")
        learned = seen.get("learned")
        parts.append({True: "learned", False: "did not learn"}.get(learned, "learning not judged (too few steps)"))
        parts.append(f"started from {seen.get('started_from') or 'scratch'}")
        # What the script can do; the decision says what a relaunch did (a network change starts fresh).
        parts.append("its script can resume from a checkpoint" if seen.get("restores")
                     else "its script cannot resume from a checkpoint")
        lines.append(f"- attempt {attempt.get('number')}: " + "; ".join(parts))
    return lines


def _known(value: object) -> str:
    return "unknown" if value is None else str(value)


def _steps_text(seen: dict) -> str:
    observed, taken = seen.get("steps_observed"), seen.get("steps_taken")
    skipped = f", {seen['steps_skipped']} skipped" if seen.get("steps_skipped") else ""
    if taken is None:
        return f"{_known(observed)} steps checked{skipped}"
    return f"{_known(observed)} steps checked, {taken} optimizer steps taken{skipped}"


def markdown(record: RunRecord, plots: list[Path], run_dir: Path) -> str:
    t = timing(record)
    state = record.state or {}
    lines = [
        f"# Execution {record.name}",
        "",
        f"- outcome: **{outcome(record)}** (status {record.status}"
        + (f", error {record.error}" if record.error else "")
        + ")",
        f"- policy: {state.get('policy', record.input.get('policy', 'default'))}",
        f"- attempts: {len(record.attempts)}",
        f"- wall time: {t['wall_seconds']:.1f} s; training jobs: {t['job_seconds']:.1f} s; "
        f"control plane: {t['control_plane_seconds']:.1f} s ({100 * t['control_plane_fraction']:.1f} %)",
    ]
    if state.get("reason"):
        lines.append(f"- reason: {state['reason']}")
    lines += ["", "## Attempts", "", *markdown_table([r.cells() for r in rows(record)])]
    if state.get("attempts"):
        lines += ["", "## Evidence", "", *evidence_lines(state)]
    if plots:
        lines += ["", "## Loss and gradient norm", ""]
        lines += [f"![{p.stem}]({p.relative_to(run_dir).as_posix()})" for p in plots]
    lines += system_usage.markdown_lines(record)
    lines += ["", "## Notifications", ""]
    for note in record.notifications:
        lines.append(f"- {note.received:.1f} s — {note.subject}")
    for number, note in enumerate(record.notifications, start=1):
        lines += ["", f"### {number}. {note.subject}", "", "```text", note.message.rstrip(), "```"]
    lines += ["", "## States", "", " → ".join(record.states), ""]
    lines += ["## Input", "", "```json", json.dumps(record.input, indent=2), "```", ""]
    return "\n".join(lines)


def plot(record: RunRecord, directory: Path) -> list[Path]:
    """One figure per quantity (``loss.png``, ``grad_norm.png``): a line per attempt, where it blew up marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    marks = {a.number: explosion for a in record.attempts if (explosion := a.explosion()) is not None}
    written = []
    for attribute, label in (("loss", "training loss"), ("grad_norm", "gradient norm")):
        series = {a.number: a.series(attribute) for a in record.attempts}
        figure = plot_quantity(series, marks, label, title=f"{label} per attempt — {record.name}")
        path = directory / f"{attribute}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def write_report(record: RunRecord, run_dir: Path) -> dict[str, Path]:
    """run.json, report.md and plots/ under ``run_dir``; returns their paths."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = record.to_dict()
    data["outcome"] = outcome(record)
    data["timing"] = timing(record)
    data["attempts_table"] = [r.cells() for r in rows(record)]
    run_json = run_dir / "run.json"
    run_json.write_text(json.dumps(data, indent=2, default=str))
    plots = plot(record, run_dir / "plots") + system_usage.plot(record, run_dir / "plots")
    report_md = run_dir / "report.md"
    report_md.write_text(markdown(record, plots, run_dir))
    return {"json": run_json, "markdown": report_md, **{p.stem: p for p in plots}}
