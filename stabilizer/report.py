"""The report of one execution: ``run.json``, ``report.md`` and plots of loss and gradient norm.

It joins what the workflow recorded (the state payload's attempts, with their recipe, finding
and decision) with what was observed from the outside (each job's log, findings and timing),
and writes them under the run directory. It reads records; it never changes a run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabilizer.records import AttemptRecord, RunRecord

RECIPE_KEYS = ("warmup_learning_rate", "learning_rate", "add_batch_norm", "grad_clip")


@dataclass
class AttemptRow:
    """One line of the attempts table."""

    number: int
    job_name: str
    recipe: str
    status: str
    steps: str
    seconds: str
    finding: str
    decision: str


def _recipe(run_spec: dict[str, Any] | None, hyperparameters: dict[str, str]) -> str:
    values: dict[str, Any] = {}
    for key in RECIPE_KEYS:
        if run_spec and key in run_spec:
            values[key] = run_spec[key]
        elif key in hyperparameters:
            try:
                values[key] = json.loads(hyperparameters[key])
            except ValueError:
                values[key] = hyperparameters[key]
    if not values:
        return "-"
    parts = [
        f"warm-up LR {values.get('warmup_learning_rate', '?'):g}"
        if isinstance(values.get("warmup_learning_rate"), int | float)
        else None,
        f"LR {values.get('learning_rate'):g}" if isinstance(values.get("learning_rate"), int | float) else None,
        "BN" if values.get("add_batch_norm") in (1, True, "1") else "no BN",
        f"clip {values['grad_clip']:g}"
        if isinstance(values.get("grad_clip"), int | float) and values["grad_clip"]
        else None,
    ]
    return ", ".join(p for p in parts if p)


def workflow_attempts(record: RunRecord) -> dict[str, dict[str, Any]]:
    """The state payload's attempts, by job name."""
    attempts = (record.state or {}).get("attempts") or []
    return {a.get("job_name"): a for a in attempts if isinstance(a, dict)}


def attempt_rows(record: RunRecord) -> list[AttemptRow]:
    recorded = workflow_attempts(record)
    rows = []
    for attempt in record.attempts:
        workflow = recorded.get(attempt.job_name, {})
        finding = workflow.get("finding") or None
        explosion = attempt.explosion()
        if finding:
            finding_text = f"{finding.get('rule')} at step {finding.get('step')}"
        elif explosion:
            finding_text = f"{explosion[1]} at step {explosion[0]}"
        else:
            finding_text = "-"
        decision = workflow.get("decision") or {}
        decision_text = "-"
        if decision:
            decision_text = decision.get("remedy") or decision.get("action") or "-"
            if decision.get("reason"):
                decision_text = f"{decision_text}: {decision['reason']}"
        last = attempt.last
        steps = workflow.get("steps")
        if steps is None:
            steps = last.step + 1 if last else 0
        rows.append(
            AttemptRow(
                number=attempt.number,
                job_name=attempt.job_name,
                recipe=_recipe(workflow.get("run_spec"), attempt.hyperparameters),
                status=attempt.status,
                steps=str(steps),
                seconds=f"{attempt.seconds:.1f}",
                finding=finding_text,
                decision=decision_text,
            )
        )
    return rows


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


def outcome(record: RunRecord) -> str:
    if record.interrupted:
        return "interrupted"
    if record.status == "SUCCEEDED":
        return "succeeded"
    if record.status == "FAILED" and record.error == "TrainingNotRecovered":
        # The workflow ended on its own terms: its state says whether it gave up (remedies or
        # limits used up) or failed (a job crashed in a way no recipe change fixes).
        return "failed" if (record.state or {}).get("outcome") == "failed" else "gave up"
    return "failed" if record.status == "FAILED" else record.status.lower()


def table_text(record: RunRecord) -> str:
    """The attempts table for a terminal."""
    rows = attempt_rows(record)
    headers = ["#", "job", "recipe", "status", "steps", "seconds", "finding", "decision"]
    data = [[str(r.number), r.job_name, r.recipe, r.status, r.steps, r.seconds, r.finding, r.decision] for r in rows]
    widths = [max(len(h), *(len(d[i][:60]) for d in data)) if data else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for d in data:
        lines.append("  ".join(cell[:60].ljust(w) for cell, w in zip(d, widths, strict=True)))
    return "\n".join(lines)


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
    lines += ["", "## Attempts", "", "| # | job | recipe | status | steps | seconds | finding | decision |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in attempt_rows(record):
        cells = [str(r.number), r.job_name, r.recipe, r.status, r.steps, r.seconds, r.finding, r.decision]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if plots:
        lines += ["", "## Loss and gradient norm", ""]
        lines += [f"![{p.stem}]({p.relative_to(run_dir).as_posix()})" for p in plots]
    lines += ["", "## Notifications", ""]
    for note in record.notifications:
        lines.append(f"- {note.received:.1f} s — {note.subject}")
    for number, note in enumerate(record.notifications, start=1):
        lines += ["", f"### {number}. {note.subject}", "", "```text", note.message.rstrip(), "```"]
    lines += ["", "## States", "", " → ".join(record.states), ""]
    lines += ["## Input", "", "```json", json.dumps(record.input, indent=2), "```", ""]
    return "\n".join(lines)


def _finite_series(attempt: AttemptRecord, attribute: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for step, value in attempt.series(attribute):
        if math.isfinite(value) and value > 0:  # a log axis has no place for the others
            steps.append(step)
            values.append(value)
    return steps, values


def plot(record: RunRecord, directory: Path) -> list[Path]:
    """One figure per quantity: a line per attempt, the explosion point marked with an x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for attribute, label in (("loss", "training loss"), ("grad_norm", "gradient norm")):
        figure, axes = plt.subplots(figsize=(8, 4.5))
        for attempt in record.attempts:
            steps, values = _finite_series(attempt, attribute)
            if not steps and attempt.explosion() is None:
                continue
            (line,) = axes.plot(steps, values, marker=".", label=f"attempt {attempt.number}")
            explosion = attempt.explosion()
            if explosion is not None:
                step, kind = explosion
                # Marked at the last finite value before it (a non-finite value has no place on the axis).
                before = [v for s, v in zip(steps, values, strict=True) if s <= step]
                y = before[-1] if before else (values[-1] if values else 1.0)
                axes.scatter([step], [y], marker="x", s=120, color=line.get_color(), zorder=5)
                axes.annotate(f"{kind} @ {step}", (step, y), textcoords="offset points", xytext=(5, 8), fontsize=8)
        axes.set_yscale("log")
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.set_title(f"{label} per attempt — {record.name}")
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
        axes.grid(alpha=0.3)
        path = directory / f"{attribute}.png"
        figure.tight_layout()
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
    data["attempts_table"] = [r.__dict__ for r in attempt_rows(record)]
    run_json = run_dir / "run.json"
    run_json.write_text(json.dumps(data, indent=2, default=str))
    plots = plot(record, run_dir / "plots")
    report_md = run_dir / "report.md"
    report_md.write_text(markdown(record, plots, run_dir))
    return {"json": run_json, "markdown": report_md, **{p.stem: p for p in plots}}
