"""The remediation benchmark: every scenario with every policy, side by side, in local mode.

    python -m stabilizer.bench                                  # every scenario, both policies
    python -m stabilizer.bench --small                          # the CI-sized form
    python -m stabilizer.bench --scenarios bn-lr-30x,healthy --policy default
    python -m stabilizer.bench --report runs/bench/bench.json other/bench.json   # earlier runs, one table
    python -m stabilizer.bench --corpus --jobs 2                # the calibration corpus (stabilizer.bench.calibration)

Each (scenario, policy) is one execution through the local engine (the project's ASL in moto's
interpreter, the Lambda code in process, each training job a real process of model/train.py).
Scenarios are defined in `stabilizer/bench/scenarios.py`. Per scenario and policy it prints:

- attempts: training jobs launched;
- steps x clean: training steps computed in all attempts (from each job's log: its start step to
  the step it stopped at) divided by the steps of one clean run of the final recipe;
- wasted: steps computed that the final model does not descend from (every step, when the
  execution did not end with a usable model);
- wall: seconds from the start of the execution to its end (the summary adds the share spent
  outside the training jobs, the control plane, and the peak memory of the whole process tree);
- outcome and final recipe; for `default`, whether the scenario's expectation (first rule, first
  remedy, verdict, resume) was met.

then one summary line per policy, and the scenarios where `default` used more attempts or steps
than `original`. Figures are measured, never asserted: `tests/e2e/test_scenarios.py` asserts the
expectations of the small form, not times. Results also go to `<run dir>/bench.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stabilizer.bench import calibration as bench_corpus
from stabilizer.bench.job_logs import job_steps
from stabilizer.bench.process_memory import PeakMemory
from stabilizer.bench.scenarios import DATA_SETS, Scenario, by_name

POLICIES = ("default", "original")


# ---------------------------------------------------------------------------- one execution
@dataclass
class Row:
    scenario: str
    policy: str
    outcome: str
    attempts: int
    steps_computed: int
    clean_steps: int
    wasted_steps: int
    wall_seconds: float
    final_recipe: str
    first_rule: str | None
    first_remedy: str | None
    resumed_at: int | None  # the second attempt's start step, when it resumed
    peak_memory_bytes: int = 0
    job_seconds: float = 0.0  # the training jobs' own wall time; the rest of `wall_seconds` is control plane
    jobs: list[dict[str, Any]] = field(default_factory=list)
    run_dir: str = ""
    unmet: list[str] = field(default_factory=list)  # default only: how the expectation was missed

    @property
    def ratio(self) -> float:
        return self.steps_computed / self.clean_steps if self.clean_steps else float("nan")


def recipe_text(run_spec: dict[str, Any], state: dict[str, Any] | None = None) -> str:
    from stabilizer.reports.attempts import recipe_text as recipe

    parts = [recipe(run_spec, state)]
    if run_spec.get("depth", 20) != 20:
        parts.append(f"depth {run_spec['depth']}")
    if run_spec.get("activation", "elu") != "elu":
        parts.append(str(run_spec["activation"]))
    return ", ".join(parts)


def measure(scenario: Scenario, policy: str, state: dict[str, Any], logs: list[str], wall: float,
            summaries: list[dict[str, Any] | None] | None = None) -> Row:
    """The benchmark row of one finished execution: its state payload, its jobs' logs and their
    findings.json summaries (None where a job left none)."""
    attempts = state.get("attempts") or []
    clean = [
        scenario.clean_steps(a.get("run_spec") or {}) if scenario.clean_steps is not None else None for a in attempts
    ]
    clean += [None] * (len(logs) - len(clean))
    summaries = list(summaries or []) + [None] * (len(logs) - len(summaries or []))
    steps = [job_steps(log, total, summary) for log, total, summary in zip(logs, clean, summaries, strict=False)]
    computed = sum(s.computed for s in steps if s is not None)
    last = steps[-1] if steps else None
    outcome = state.get("outcome") or "unknown"
    # The final model descends from every step up to where the last attempt ended (through the
    # checkpoints it resumed from); nothing is usable when the execution ended without a model.
    useful = last.end if last is not None and outcome in ("succeeded", "stopped_early") else 0
    first = attempts[0] if attempts else {}
    second_start = steps[1].start if len(steps) > 1 and steps[1] is not None else None
    return Row(
        scenario=scenario.name,
        policy=policy,
        outcome=outcome,
        attempts=len(attempts),
        steps_computed=computed,
        clean_steps=last.total if last is not None else 0,
        wasted_steps=max(0, computed - useful),
        wall_seconds=round(wall, 1),
        final_recipe=recipe_text(state.get("run_spec") or {}, state),
        first_rule=(first.get("finding") or {}).get("rule"),
        first_remedy=(first.get("decision") or {}).get("remedy"),
        resumed_at=second_start if len(attempts) > 1 and attempts[1].get("resumed_from") else None,
        jobs=[
            {"job": a.get("job_name"), "status": a.get("status"),
             "steps": None if s is None else asdict(s), "resumed_from": a.get("resumed_from")}
            for a, s in zip(attempts, steps + [None] * (len(attempts) - len(steps)), strict=False)
        ],
    )


def unmet(scenario: Scenario, row: Row) -> list[str]:
    """How a `default` run missed the scenario's expectation (empty when it met it)."""
    expect, missed = scenario.expect, []
    if row.first_rule != expect.rule:
        missed.append(f"first rule {row.first_rule}, expected {expect.rule}")
    if row.first_remedy != expect.remedy:
        missed.append(f"first remedy {row.first_remedy}, expected {expect.remedy}")
    if row.outcome != expect.outcome:
        missed.append(f"outcome {row.outcome}, expected {expect.outcome}")
    if expect.resumes and not row.resumed_at:
        missed.append("the second attempt did not resume from a checkpoint of the first")
    return missed


def prepare_data_sets(digits: Path, root: Path) -> dict[str, Path]:
    """The scenarios' data sets: leading slices of the offline digits channels."""
    import numpy as np

    made = {}
    for name, counts in DATA_SETS.items():
        out = root / name
        for channel, count in zip(("train", "test"), counts, strict=True):
            target = out / channel
            if all((target / f).is_file() for f in ("x.npy", "y.npy")):
                continue
            target.mkdir(parents=True, exist_ok=True)
            for f in ("x.npy", "y.npy"):
                np.save(target / f, np.load(digits / channel / f)[:count])
        made[name] = out
    return made


def run_scenario(scenario: Scenario, policy: str, data: dict[str, Path], run_root: Path, *, small: bool = False) -> Row:
    from stabilizer.local.checkout import project_root
    from stabilizer.local.engine.engine import LocalEngine, Project
    from stabilizer.reports.report import timing

    name = f"{scenario.name}-{policy}-{time.strftime('%H%M%S')}"
    run_dir = run_root / name
    execution_input = scenario.execution_input(policy, small=small)
    project = Project.discover(project_root())
    with PeakMemory() as memory, LocalEngine(run_dir, data[scenario.data], project=project) as engine:
        record = engine.run(execution_input, name=name)
    logs = []
    for attempt in record.attempts:
        path = run_dir / "jobs" / attempt.job_name / "logs" / "training.log"
        logs.append(path.read_text() if path.is_file() else "")
    summaries = [(attempt.findings or {}).get("summary") for attempt in record.attempts]
    row = measure(scenario, policy, record.state or {}, logs, record.wall_seconds, summaries)
    row.peak_memory_bytes = memory.peak
    row.job_seconds = timing(record)["job_seconds"]
    row.run_dir = str(run_dir)
    if policy == "default":
        row.unmet = unmet(scenario, row)
    return row


# ---------------------------------------------------------------------------- the table
COLUMNS = ("scenario", "policy", "attempts", "steps x clean", "wasted", "wall s", "outcome", "final recipe", "expected")


def table_lines(rows: list[Row]) -> list[str]:
    cells = [
        [
            r.scenario, r.policy, str(r.attempts), f"{r.steps_computed}/{r.clean_steps} = {r.ratio:.2f}",
            str(r.wasted_steps), f"{r.wall_seconds:.0f}", r.outcome, r.final_recipe,
            ("met" if not r.unmet else "MISSED: " + "; ".join(r.unmet)) if r.policy == "default" else "",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(COLUMNS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
    return lines


def summary_lines(rows: list[Row]) -> list[str]:
    lines = []
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy]
        computed = sum(r.steps_computed for r in mine)
        clean = sum(r.clean_steps for r in mine)
        outcomes: dict[str, int] = {}
        for r in mine:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        met = f", expectations met {sum(not r.unmet for r in mine)}/{len(mine)}" if policy == "default" else ""
        wall = sum(r.wall_seconds for r in mine)
        control = (wall - sum(r.job_seconds for r in mine)) / wall if wall else 0.0
        lines.append(
            f"{policy}: {len(mine)} scenarios, {sum(r.attempts for r in mine)} attempts, "
            f"steps {computed}/{clean} = {computed / clean if clean else float('nan'):.2f}x clean, "
            f"wasted {sum(r.wasted_steps for r in mine)}, wall {wall:.0f} s (control plane {100 * control:.0f} %), "
            f"peak memory {max(r.peak_memory_bytes for r in mine) / 1024**2:.0f} MiB, "
            f"outcomes {', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}{met}"
        )
    by_key = {(r.scenario, r.policy): r for r in rows}
    losses = []
    for r in rows:
        other = by_key.get((r.scenario, "original"))
        if r.policy != "default" or other is None:
            continue
        if r.attempts > other.attempts or r.steps_computed > other.steps_computed:
            losses.append(
                f"{r.scenario} ({r.attempts} vs {other.attempts} attempts, "
                f"{r.steps_computed} vs {other.steps_computed} steps)"
            )
    if any(r.policy == "original" for r in rows) and any(r.policy == "default" for r in rows):
        lines.append("default uses more than original on: " + (", ".join(losses) if losses else "none"))
    return lines


def load_rows(path: Path) -> list[Row]:
    """The rows an earlier run wrote to its bench.json, in its order."""
    names = {f.name for f in fields(Row)}
    entries = json.loads(path.read_text())
    return [Row(**{key: value for key, value in entry.items() if key in names}) for entry in entries]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stabilizer.bench", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--policy", choices=[*POLICIES, "both"], default="both")
    parser.add_argument("--scenarios", help="comma-separated scenario names (default: all)")
    parser.add_argument("--small", action="store_true", help="the CI-sized form: its scenarios, shrunk")
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / "bench")
    parser.add_argument("--data-dir", type=Path, help="the offline digits channels (default: prepared under runs/)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="BENCH_JSON",
                        help="run nothing: print the table and summary of earlier runs' bench.json files, together")
    parser.add_argument("--corpus", action="store_true",
                        help="run the calibration corpus (tests/corpus) instead of the scenarios")
    bench_corpus.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.corpus:
        return bench_corpus.main(args)
    if args.report:
        rows = [row for path in args.report for row in load_rows(path)]
        for line in [*table_lines(rows), "", *summary_lines(rows)]:
            print(line)
        return 0

    from stabilizer.cli.commands import UsageError, prepare_data
    from stabilizer.local.checkout import project_root

    try:
        scenarios = by_name(args.scenarios.split(",") if args.scenarios else None, small=args.small)
        digits = prepare_data(argparse.Namespace(data_dir=args.data_dir, run_dir=Path("runs")),
                              project_root() / "model", sys.stdout)
    except (ValueError, UsageError) as error:
        parser.error(str(error))
    data = prepare_data_sets(digits, args.run_dir / "data")
    # The interpreter logs every Fail state as an error; executions' ends are in the table instead.
    args.run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=args.run_dir / "engine.log", level=logging.WARNING, force=True)
    policies = list(POLICIES) if args.policy == "both" else [args.policy]
    print(f"cpus: {os.cpu_count()}  load average before: {os.getloadavg()[0]:.2f}  "
          f"{len(scenarios)} scenarios x {len(policies)} policies{'  (small form)' if args.small else ''}", flush=True)
    rows: list[Row] = []
    for scenario in scenarios:
        for policy in policies:
            row = run_scenario(scenario, policy, data, args.run_dir, small=args.small)
            rows.append(row)
            print("  " + table_lines([row])[-1], flush=True)
            _write_rows(args.run_dir / "bench.json", rows)  # after every row: a run cut short keeps what it measured
    print()
    for line in [*table_lines(rows), "", *summary_lines(rows)]:
        print(line)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def _write_rows(path: Path, rows: list[Row]) -> None:
    path.write_text(json.dumps([{**asdict(r), "ratio": r.ratio} for r in rows], indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
