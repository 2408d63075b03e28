"""The public-scripts benchmark: unmodified training scripts of public projects (`tests/public_scripts`,
read by `stabilizer.bench.corpus.load_scripts`), each judged for transparency and for its verdicts.

    python -m stabilizer.bench.public_scripts                   # every script: transparency and verdicts
    python -m stabilizer.bench.public_scripts --scripts pytorch_examples__mnist --jobs 2
    python -m stabilizer.bench.public_scripts --runs mnist-lr1000 --no-transparency --json out.json
    python -m stabilizer.bench.public_scripts --report a.json b.json   # earlier runs as one report

Transparency (`stabilizer.bench.transparency`): at each script's healthy setting, two unwatched runs and
one watched at the launcher level, compared; the row says `identical` or the first difference.

Verdicts: every run through the local workflow, the script unchanged under the default `auto`
integration, executed and judged by `stabilizer.bench.calibration` exactly as the calibration corpus
is: right or wrong, false positive, false negative, misdiagnosis, attempts, the step of the first
finding.

Nothing here works around what watching does to a script: a difference is a row of the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from stabilizer.bench import calibration
from stabilizer.bench.corpus import PUBLIC_SCRIPTS_DIR, Run, Script, load_scripts, select
from stabilizer.bench.transparency import LAUNCHER, Transparency, environment, prepare, standin_path, transparency


# ---------------------------------------------------------------------------- verdicts
def verdict(script: Script, run: Run, policy: str, data_dir: Path, root: Path) -> calibration.Result:
    """One run through the local workflow, from a copy of the folder with its data made."""
    source = root / f"{run.name}-{policy}-source"
    prepare(script, source, environment(script, root / "unused"))
    moved = dataclasses.replace(run, job={**run.job, "source": str(source)})
    job_environment = {**script.environment, **({"PYTHONPATH": standin_path(script)} if script.standins else {})}
    return calibration.execute(moved, policy, data_dir, root, job_environment)


def _task(kind: str, script_name: str, run_name: str, policy: str, data_dir: str, root: str) -> Any:
    [script] = [s for s in load_scripts() if s.name == script_name]
    run = calibration.by_name(list(script.runs), run_name)
    try:
        if kind == "transparency":
            return transparency(script, Path(root) / "transparency" / script.name)
        return verdict(script, run, policy, Path(data_dir), Path(root) / "verdicts")
    except Exception as error:  # one broken script or execution is a row, not the end of the benchmark
        logging.exception("%s of %s (%s) failed", kind, run.name, policy)
        if kind == "transparency":
            return Transparency(script.name, run.name, f"error {type(error).__name__}: {error}", [str(error)],
                                0.0, 0.0, None, root)
        return calibration.judge(run, calibration.Result(
            run=run.name, kind=run.kind, policy=policy, healthy=run.healthy, outcome=f"error {type(error).__name__}",
            attempts=0, first_call="none", steps_computed=0, wasted_steps=0, wall_seconds=0.0, reason=str(error)))


# ---------------------------------------------------------------------------- the tables
def transparency_lines(rows: list[Transparency]) -> list[str]:
    return calibration.table(("script", "run", "unwatched s", "watched s", "transparency"), [
        [r.script, r.run, f"{r.unwatched_seconds:.0f}", f"{r.watched_seconds:.0f}", r.result] for r in rows])


def verdict_lines(results: list[calibration.Result]) -> list[str]:
    return calibration.table(
        ("run", "script", "policy", "healthy", "attempts", "detected at", "first call", "outcome", "right", "verdict"),
        [[r.run, r.kind, r.policy, "yes" if r.healthy else "no",
          str(r.attempts) + (f" +{r.rollbacks} in job" if r.rollbacks else ""),
          "-" if r.detection_step is None else f"step {r.detection_step}", r.first_call, r.outcome,
          "right" if r.outcome_met else "wrong", calibration.verdict(r)] for r in results])


def total_lines(rows: list[Transparency], results: list[calibration.Result]) -> list[str]:
    lines = []
    if rows:
        differ = [r for r in rows if not r.result.startswith("identical")]
        named = f" ({', '.join(r.script for r in differ)})" if differ else ""
        lines.append(f"transparency: {len(rows) - len(differ)} of {len(rows)} scripts identical watched, "
                     f"{len(differ)} with a difference{named}")
    for policy in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == policy]
        healthy, failing = [r for r in mine if r.healthy], [r for r in mine if not r.healthy]
        lines.append(
            f"verdicts ({policy}): {sum(r.outcome_met for r in mine)}/{len(mine)} right; false positives "
            f"{sum(bool(r.false_positive) for r in healthy)} of {len(healthy)} healthy, false negatives "
            f"{sum(bool(r.false_negative) for r in failing)} of {len(failing)} failing, misdiagnoses "
            f"{sum(bool(r.misdiagnosis) for r in failing)}; {sum(r.attempts for r in mine)} attempts, "
            f"{sum(r.rollbacks for r in mine)} rollbacks in the job")
    return lines


def report(rows: list[Transparency], results: list[calibration.Result]) -> list[str]:
    lines = []
    if rows:
        lines += ["transparency at the healthy setting (unwatched twice, watched once by "
                  f"python -m {LAUNCHER}):", *transparency_lines(rows)]
        details = [f"  {r.script}: {d}" for r in rows for d in r.differences[1:]]
        lines += ["further differences:", *details] if details else []
        lines.append("")
    if results:
        reasons = [f"  {r.run} ({r.policy}): {r.reason}" for r in results if r.reason]
        lines += ["verdicts through the local workflow (auto integration, the script unchanged):",
                  *verdict_lines(results), "reasons:", *reasons, "", *calibration.quality_lines(results), ""]
    return lines + total_lines(rows, results)


# ---------------------------------------------------------------------------- command line
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench.public_scripts",
                                     description="unmodified public scripts: transparency and verdicts")
    parser.add_argument("--scripts", help="comma-separated script folders (default: all)")
    parser.add_argument("--runs", help="comma-separated run names (default: all); transparency for the healthy ones")
    parser.add_argument("--jobs", type=int, default=1, help="scripts and executions run in parallel processes")
    parser.add_argument("--json", type=Path, help="write every row here (after each one)")
    parser.add_argument("--policy", choices=[*calibration.POLICIES, "both"], default="default")
    parser.add_argument("--recovery", choices=["in_job", "relaunch", "both"], default="in_job",
                        help="job.recovery for the verdicts; both: each run both ways (default, default:relaunch)")
    parser.add_argument("--healthy-seeds", type=int, default=1, metavar="N",
                        help="each healthy run whose script takes a seed hyperparameter at N seeds (its own and the "
                        "next N-1), for the spread the recovered quality is read against")
    parser.add_argument("--no-transparency", action="store_true", help="verdicts only")
    parser.add_argument("--no-verdicts", action="store_true", help="transparency only")
    parser.add_argument("--run-dir", type=Path, default=Path("runs"), help="where runs are kept (default: runs/)")
    parser.add_argument("--data-dir", type=Path, help="the offline digits channels (default: prepared under runs/)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="print earlier --json files as one report (a later file's row replaces an earlier's)")
    return parser.parse_args(argv)


def load_report(paths: list[Path]) -> tuple[list[Transparency], list[calibration.Result]]:
    """The rows of `--json` files, a later file's row replacing an earlier's for the same script or run."""
    rows: dict[str, Transparency] = {}
    results: dict[tuple[str, str], calibration.Result] = {}
    names = set(calibration.Result.__dataclass_fields__)
    for path in paths:
        data = json.loads(path.read_text())
        rows.update({row["script"]: Transparency(**row) for row in data["transparency"]})
        results.update({(r["run"], r["policy"]): calibration.Result(**{k: v for k, v in r.items() if k in names})
                        for r in data["verdicts"]})
    runs = [run for s in load_scripts() for run in s.runs]
    order = {run.name: i for i, run in enumerate(runs)}
    calibration.fill_settings(list(results.values()), runs)
    return (sorted(rows.values(), key=lambda r: order.get(r.run, len(order))),
            sorted(results.values(), key=lambda r: (order.get(r.run, len(order)), r.policy)))


def _write(path: Path | None, rows: list[Transparency], results: list[calibration.Result]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"transparency": [asdict(r) for r in rows],
                                    "verdicts": [asdict(r) for r in results]}, indent=2, default=str))


def main(argv: list[str] | None = None) -> int:
    from stabilizer.cli.commands import UsageError, prepare_data
    from stabilizer.local.checkout import project_root

    args = parse(argv)
    if args.report:
        for line in report(*load_report(args.report)):
            print(line)
        return 0
    try:
        scripts = load_scripts(PUBLIC_SCRIPTS_DIR)
        for absent in (s for s in scripts if not s.present):
            print(f"left out: {absent.name}: its upstream files are not in place ({absent.upstream.repo} at "
                  f"{absent.upstream.commit[:12]}; tests/public_scripts/README.md)", file=sys.stderr)
        scripts = [s for s in scripts if s.present]
        names = args.scripts.split(",") if args.scripts else None
        runs = select([run for s in scripts for run in s.runs], names, args.runs.split(",") if args.runs else None)
        if args.jobs < 1:
            raise ValueError(f"--jobs: expected a whole number >= 1, got {args.jobs}")
        judged = calibration.with_seeds(runs, args.healthy_seeds)  # the verdicts' runs, seeded healthy ones too
        data_dir = prepare_data(argparse.Namespace(data_dir=args.data_dir, run_dir=args.run_dir),
                                project_root() / "model", sys.stdout)
    except (ValueError, UsageError) as error:
        print(f"python -m stabilizer.bench.public_scripts: {error.args[0] if error.args else error}"
              .replace("--kinds", "--scripts"), file=sys.stderr)
        return 64
    root = (args.run_dir / "public_scripts" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    policies = calibration.ways(list(calibration.POLICIES) if args.policy == "both" else [args.policy], args.recovery)
    tasks = [] if args.no_transparency else [("transparency", r.kind, r.name, "") for r in runs if r.healthy]
    tasks += [] if args.no_verdicts else [("verdict", r.kind, r.name, p) for r in judged for p in policies]
    print(f"cpus: {os.cpu_count()}  load average before: {os.getloadavg()[0]:.2f}  {len(tasks)} tasks, "
          f"{args.jobs} in parallel; runs kept in {root}", flush=True)
    started = time.monotonic()
    rows: list[Transparency] = []
    results: list[calibration.Result] = []
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn"), initializer=calibration.worker_init,
                             initargs=(str(root / "engine.log"),)) as pool:
        futures = [pool.submit(_task, kind, script, run, policy, str(data_dir), str(root))
                   for kind, script, run, policy in tasks]
        for future in as_completed(futures):
            row = future.result()
            if isinstance(row, Transparency):
                rows.append(row)
                print("  " + transparency_lines([row])[-1], flush=True)
            else:
                results.append(row)
                print("  " + verdict_lines([row])[-1], flush=True)
            _write(args.json, rows, results)
    order = {(kind, run, policy): i for i, (kind, _script, run, policy) in enumerate(tasks)}
    rows.sort(key=lambda r: order[("transparency", r.run, "")])
    results.sort(key=lambda r: order[("verdict", r.run, r.policy)])
    _write(args.json, rows, results)
    print()
    for line in report(rows, results):
        print(line)
    print(f"wall {time.monotonic() - started:.0f} s for {len(tasks)} tasks, {args.jobs} in parallel; "
          f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
