"""The calibration corpus: training runs that stabilizer's own code did not write, each with the
outcome a right verdict gives it. Read here; run and judged by `stabilizer.bench.calibration`.

The corpus lives in `tests/corpus/<kind>/`: one user script (`train.py`, argparse flags, a plain
loop, data it makes itself or one of scikit-learn's bundled sets) and `manifest.json`, which
describes the job once (entry point, metric definitions, loss metric, knobs under the script's own
names) and lists its runs. A run is the script with some hyperparameters and what must happen:

    {"name": "rnn-lm-lr4-noclip", "healthy": false,
     "hyperparameters": {"lr": 4.0, "clip": 0.0},
     "expect": {"first_attempt": "diverged", "remedy": {"lr": "down", "clip": "up"}, "outcome": ["succeeded"]}}

- `healthy` runs must end with an outcome of `expect.outcome` (`succeeded`, or `stopped_early`
  when the run configures an early stop) after one attempt.
- failing runs name what their first attempt must be called (`first_attempt`: `diverged` for an
  explosion or a divergence, `did_not_learn` for a loss that does not fall; a list where either is
  right), the direction each hyperparameter must move if a remedy touches it (`remedy`), and the
  outcomes the execution may end with (`outcome`: `["succeeded"]` when a declared knob can fix it,
  the failure outcomes when none can).

This module only reads manifests and builds execution inputs; it runs nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabilizer.local.checkout import project_root

CORPUS_DIR = project_root() / "tests" / "corpus"
# The outcomes an expectation may use (the state's Outcome, docs/contracts.md).
SUCCESS = ("succeeded", "stopped_early")
FAILURE_CALLS = ("diverged", "did_not_learn", "stopped_early", "unwatched", "unverified", "gave_up", "failed")
OUTCOMES = (*SUCCESS, "diverged", "did_not_learn", "gave_up", "failed", "unwatched", "unverified")
DIRECTIONS = ("up", "down")
# Every execution of the corpus: a few relaunches at most, so that a policy that keeps trying
# cannot make the full corpus take hours; checks every second.
LIMITS = {"max_num_retraining": 4, "max_monitor_transitions": 1500, "max_total_training_seconds": 3600}


class ManifestError(ValueError):
    """A manifest is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Expect:
    outcome: tuple[str, ...]  # the outcomes the execution may end with
    first_attempt: tuple[str, ...] = ()  # failing runs: what the first attempt may be called
    remedy: dict[str, str] = field(default_factory=dict)  # hyperparameter -> "up" | "down"


@dataclass(frozen=True)
class Run:
    kind: str
    name: str
    healthy: bool
    description: str
    job: dict[str, Any]  # the execution input's `job`, source absolute
    expect: Expect
    step_regex: str  # the step number in the script's own log line, for the steps columns
    watch: str  # "library": the script calls watch(); "none": it relies on the default integration
    monitoring: dict[str, Any] | None = None

    def execution_input(self, policy: str) -> dict[str, Any]:
        data: dict[str, Any] = {"policy": policy, "wait_seconds": 1, "limits": dict(LIMITS), "job": self.job}
        if self.monitoring is not None:
            data["monitoring"] = self.monitoring
        return data


def _field(source: Path, where: str, mapping: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in mapping:
        raise ManifestError(f"{source}: {where}{key}: required")
    value = mapping[key]
    if not isinstance(value, kind):
        names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
        raise ManifestError(f"{source}: {where}{key}: expected {names}, got {type(value).__name__}")
    return value


def _names(source: Path, where: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or any(item not in allowed for item in items):
        raise ManifestError(
            f"{source}: {where}: expected one of {', '.join(allowed)} (or a list of them), got {value!r}")
    return tuple(items)


def _expect(source: Path, where: str, data: dict[str, Any], healthy: bool, hyperparameters: dict[str, Any]) -> Expect:
    known = {"outcome", "first_attempt", "remedy"}
    if unknown := sorted(set(data) - known):
        raise ManifestError(f"{source}: {where}expect.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    outcome = _names(source, f"{where}expect.outcome", data.get("outcome"), OUTCOMES)
    if healthy:
        if not set(outcome) <= set(SUCCESS):
            raise ManifestError(f"{source}: {where}expect.outcome: a healthy run ends {' or '.join(SUCCESS)}")
        if "first_attempt" in data or "remedy" in data:
            raise ManifestError(f"{source}: {where}expect: a healthy run has no first_attempt or remedy")
        return Expect(outcome)
    first = _names(source, f"{where}expect.first_attempt", data.get("first_attempt"), FAILURE_CALLS)
    remedy = data.get("remedy", {})
    if not isinstance(remedy, dict):
        raise ManifestError(f"{source}: {where}expect.remedy: expected an object hyperparameter -> up|down")
    for name, direction in remedy.items():
        if name not in hyperparameters:
            raise ManifestError(f"{source}: {where}expect.remedy.{name}: not one of the job's hyperparameters")
        if direction not in DIRECTIONS:
            raise ManifestError(f"{source}: {where}expect.remedy.{name}: expected up or down, got {direction!r}")
    return Expect(outcome, first, dict(remedy))


def load_kind(directory: Path) -> list[Run]:
    """The runs of one kind's manifest; ManifestError names the file and field when it is malformed."""
    source = directory / "manifest.json"
    try:
        data = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ManifestError(f"{source}: cannot read: {error}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: expected a JSON object")
    job = dict(_field(source, "", data, "job", dict))
    step_regex = _field(source, "", data, "step_regex", str)
    watch = _field(source, "", data, "watch", str)
    if watch not in ("library", "none"):
        raise ManifestError(f"{source}: watch: expected library (the script calls watch()) or none, got {watch!r}")
    entry = directory / str(job.get("entry_point", ""))
    if not entry.is_file():
        raise ManifestError(f"{source}: job.entry_point: {entry.name!r} is not a file in {directory}")
    job["source"] = str(directory.resolve())
    runs = []
    for index, item in enumerate(_field(source, "", data, "runs", list)):
        where = f"runs[{index}]."
        if not isinstance(item, dict):
            raise ManifestError(f"{source}: {where[:-1]}: expected an object")
        name = _field(source, where, item, "name", str)
        healthy = _field(source, where, item, "healthy", bool)
        hyperparameters = {**job.get("hyperparameters", {}), **item.get("hyperparameters", {})}
        expect = _expect(source, f"{where}", _field(source, where, item, "expect", dict), healthy, hyperparameters)
        runs.append(Run(
            kind=directory.name, name=name, healthy=healthy, description=item.get("description", ""),
            job={**job, "hyperparameters": hyperparameters, **({"knobs": item["knobs"]} if "knobs" in item else {})},
            expect=expect, step_regex=step_regex, watch=watch, monitoring=item.get("monitoring"),
        ))
    return runs


def load(root: Path = CORPUS_DIR) -> list[Run]:
    """Every run of the corpus, kind by kind in name order; run names are unique."""
    runs = [run for directory in sorted(root.iterdir()) if (directory / "manifest.json").is_file()
            for run in load_kind(directory)]
    seen: set[str] = set()
    for run in runs:
        if run.name in seen:
            raise ManifestError(f"{root}: run name {run.name!r} appears twice")
        seen.add(run.name)
    return runs


def select(runs: list[Run], kinds: list[str] | None = None, names: list[str] | None = None) -> list[Run]:
    """The runs of the kinds and names given (all when None); ValueError names what is unknown."""
    for wanted, have, flag in ((kinds, {r.kind for r in runs}, "--kinds"), (names, {r.name for r in runs}, "--runs")):
        unknown = [w for w in wanted or [] if w not in have]
        if unknown:
            raise ValueError(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(sorted(have))})")
    return [r for r in runs if (not kinds or r.kind in kinds) and (not names or r.name in names)]
