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
  right), the direction each hyperparameter must move if a remedy touches it (`remedy`: `up`,
  `down`, or `keep` where no remedy may change it: a fault in the data, not the recipe), and the
  outcomes the execution may end with (`outcome`: `["succeeded"]` when a declared knob can fix it,
  the failure outcomes when none can).

The public-scripts corpus (`tests/public_scripts/<project>__<script>/`, unmodified scripts of public
projects, `tests/public_scripts/README.md`) uses the same manifest with more keys: where the files
came from (`upstream`), how a user runs the script (`command`), what makes its data (`data`) and
which stand-in packages it imports (`standins`); `load_script` reads them.

This module only reads manifests and builds execution inputs; it runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stabilizer.local.checkout import project_root

CORPUS_DIR = project_root() / "tests" / "corpus"
PUBLIC_SCRIPTS_DIR = project_root() / "tests" / "public_scripts"
# The outcomes an expectation may use (the state's Outcome, docs/contracts.md).
SUCCESS = ("succeeded", "stopped_early")
FAILURE_CALLS = ("diverged", "did_not_learn", "stopped_early", "unwatched", "unverified", "gave_up", "failed")
OUTCOMES = (*SUCCESS, "diverged", "did_not_learn", "gave_up", "failed", "unwatched", "unverified")
DIRECTIONS = ("up", "down", "keep")
# Every execution of the corpus: a few relaunches at most, so that a policy that keeps trying
# cannot make the full corpus take hours; checks every second.
LIMITS = {"max_num_retraining": 4, "max_monitor_transitions": 1500, "max_total_training_seconds": 3600}


class ManifestError(ValueError):
    """A manifest is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Expect:
    outcome: tuple[str, ...]  # the outcomes the execution may end with
    first_attempt: tuple[str, ...] = ()  # failing runs: what the first attempt may be called
    remedy: dict[str, str] = field(default_factory=dict)  # hyperparameter -> "up" | "down" | "keep"
    # Failing runs: the outcomes where the job lowered its own rate (a rollback in the job); None: ``outcome``
    outcome_in_job: tuple[str, ...] | None = None


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
    # One group around the loss the script prints for its final model on a fixed set, after training
    # (the recovered-quality measure that no batch's noise moves); "": it prints none.
    final_regex: str = ""
    # The hyperparameter (a whole number) that sets how long the run trains: steps, updates, epochs; "": none
    # named (``stretched`` cannot lengthen it).
    length: str = ""

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
    known = {"outcome", "first_attempt", "remedy", "outcome_in_job"}
    if unknown := sorted(set(data) - known):
        raise ManifestError(f"{source}: {where}expect.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    outcome = _names(source, f"{where}expect.outcome", data.get("outcome"), OUTCOMES)
    if healthy:
        if not set(outcome) <= set(SUCCESS):
            raise ManifestError(f"{source}: {where}expect.outcome: a healthy run ends {' or '.join(SUCCESS)}")
        if {"first_attempt", "remedy", "outcome_in_job"} & set(data):
            raise ManifestError(
                f"{source}: {where}expect: a healthy run has no first_attempt, remedy or outcome_in_job")
        return Expect(outcome)
    first = _names(source, f"{where}expect.first_attempt", data.get("first_attempt"), FAILURE_CALLS)
    remedy = data.get("remedy", {})
    if not isinstance(remedy, dict):
        raise ManifestError(f"{source}: {where}expect.remedy: expected an object hyperparameter -> up|down|keep")
    for name, direction in remedy.items():
        if name not in hyperparameters:
            raise ManifestError(f"{source}: {where}expect.remedy.{name}: not one of the job's hyperparameters")
        if direction not in DIRECTIONS:
            raise ManifestError(f"{source}: {where}expect.remedy.{name}: expected up, down or keep, got {direction!r}")
    in_job = (_names(source, f"{where}expect.outcome_in_job", data["outcome_in_job"], OUTCOMES)
              if "outcome_in_job" in data else None)
    return Expect(outcome, first, dict(remedy), in_job)


def _groups(pattern: str) -> int:
    """How many groups ``pattern`` has; -1 when it is no regular expression."""
    try:
        return re.compile(pattern).groups
    except re.error:
        return -1


def load_kind(directory: Path, *, files_in_place: bool = True) -> list[Run]:
    """The runs of one kind's manifest; ManifestError names the file and field when it is malformed.
    Without ``files_in_place`` (a public script whose upstream files are not in the checkout) its entry
    point is not looked for."""
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
    final_regex = data.get("final_regex", "")
    if not isinstance(final_regex, str) or (final_regex and _groups(final_regex) != 1):
        raise ManifestError(f"{source}: final_regex: expected a regular expression with one group around the "
                            f"final model's loss, got {final_regex!r}")
    if watch not in ("library", "none"):
        raise ManifestError(f"{source}: watch: expected library (the script calls watch()) or none, got {watch!r}")
    length = data.get("length", "")
    if length and not isinstance(job.get("hyperparameters", {}).get(length), int):
        raise ManifestError(f"{source}: length: expected the name of a whole-number hyperparameter of "
                            f"job.hyperparameters that sets how long a run trains, got {length!r}")
    entry = directory / str(job.get("entry_point", ""))
    if files_in_place and not entry.is_file():
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
            final_regex=final_regex, length=length,
        ))
    return runs


def load(root: Path = CORPUS_DIR) -> list[Run]:
    """Every run of the corpus, kind by kind in name order; run names are unique."""
    runs = [run for directory in sorted(root.iterdir()) if (directory / "manifest.json").is_file()
            for run in load_kind(directory)]
    _unique(root, runs)
    return runs


def _unique(root: Path, runs: list[Run]) -> None:
    seen: set[str] = set()
    for run in runs:
        if run.name in seen:
            raise ManifestError(f"{root}: run name {run.name!r} appears twice")
        seen.add(run.name)


# ---------------------------------------------------------------------------- the public-scripts corpus
SCRIPT_FOLDER = re.compile(r"^[a-z0-9_]+__[a-z0-9_]+$")  # <project>__<script>
COMMIT = re.compile(r"^[0-9a-f]{40}$")
ARGUMENT_STYLES = ("space", "equals")
ENVIRONMENT_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
STANDINS = "_standins"  # the stand-in packages, beside the script folders


@dataclass(frozen=True)
class Upstream:
    repo: str  # owner/name on GitHub
    commit: str
    root: str  # the repository folder the files are copied relative to ("" for the top)
    paths: tuple[str, ...]  # repository paths
    blobs: dict[str, str]  # repository path -> git blob id of the vendored file
    licence: str

    def local(self, path: str) -> str:
        """Where a repository path lies in the script's folder."""
        return path[len(self.root) + 1:] if self.root else path

    def missing(self, directory: Path) -> list[str]:
        """The upstream files (and LICENSE) not in ``directory``: a checkout holds only what is ours until a
        developer puts them in place from the manifest's commit (tests/public_scripts/README.md)."""
        wanted = [self.local(path) for path in self.paths] + ["LICENSE"]
        return [name for name in wanted if not (directory / name).is_file()]


@dataclass(frozen=True)
class Script:
    """One vendored public script: its folder, where it came from, how it runs, and its runs."""

    name: str  # the folder's name, <project>__<script>
    directory: Path
    description: str
    upstream: Upstream
    script: str  # the file a user runs (the transparency runs)
    arguments: str  # "space": --name value (SageMaker's toolkit); "equals": --name=value
    data_maker: tuple[str, ...]  # the maker and its arguments, run in the folder's copy; () for none
    standins: tuple[str, ...]  # packages of tests/public_scripts/_standins the script imports
    runs: tuple[Run, ...]
    no_failing_run: str = ""
    interleaved_output: str = ""  # why its processes' lines interleave in any order ("": they do not)
    # Variables a user sets to run it (Lightning's PL_TRAINER_* defaults, torch's TORCH_FORCE_*), in every run's
    # environment: the transparency runs' and the local workflow's jobs'
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def present(self) -> bool:
        """Its upstream files are in place (a checkout holds only what is ours until they are put there)."""
        return not self.upstream.missing(self.directory)

    @property
    def healthy(self) -> Run:
        return next(run for run in self.runs if run.healthy)

    def command_arguments(self, hyperparameters: dict[str, Any]) -> list[str]:
        """The script's command line for these hyperparameters, as its manifest says a user writes it."""
        from stabilizer.local.emulator.container import to_cmd_args

        args = to_cmd_args(hyperparameters)
        if self.arguments == "space":
            return args
        return [f"{name}={value}" for name, value in zip(args[::2], args[1::2], strict=True)]


def git_blob_id(path: Path) -> str:
    """The id git gives the file's content (`git hash-object`)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def edited_files(script: Script) -> list[str]:
    """The vendored files whose content is not the upstream blob recorded in the manifest."""
    return [path for path in script.upstream.paths
            if git_blob_id(script.directory / script.upstream.local(path)) != script.upstream.blobs[path]]


def _upstream(source: Path, directory: Path, data: dict[str, Any]) -> Upstream:
    where = "upstream."
    repo = _field(source, where, data, "repo", str)
    commit = _field(source, where, data, "commit", str)
    if not COMMIT.match(commit):
        raise ManifestError(f"{source}: upstream.commit: expected 40 lower-case hex digits, got {commit!r}")
    root = _field(source, where, data, "root", str).strip("/")
    paths = _field(source, where, data, "paths", list)
    blobs = _field(source, where, data, "blobs", dict)
    licence = _field(source, where, data, "licence", str)
    if repo.count("/") != 1:
        raise ManifestError(f"{source}: upstream.repo: expected owner/name, got {repo!r}")
    if not paths:
        raise ManifestError(f"{source}: upstream.paths: expected at least one path")
    upstream = Upstream(repo, commit, root, tuple(paths), dict(blobs), licence)
    for index, path in enumerate(paths):
        if not isinstance(path, str) or (root and not path.startswith(root + "/")):
            raise ManifestError(f"{source}: upstream.paths[{index}]: expected a path under {root or 'the top'!r}, "
                                f"got {path!r}")
        if not isinstance(blobs.get(path), str) or not COMMIT.match(blobs[path]):
            raise ManifestError(f"{source}: upstream.blobs.{path}: expected the file's git blob id (40 hex digits)")
    missing = upstream.missing(directory)
    if missing and len(missing) < len(paths) + 1:  # in place, but not all of it: a copy gone wrong
        raise ManifestError(f"{source}: upstream: {', '.join(missing)} missing from {directory} (upstream's files "
                            f"and its LICENSE are put in place together)")
    return upstream


def load_script(directory: Path) -> Script:  # noqa: PLR0912 - one check per manifest field
    """One public script's manifest; ManifestError names the file and field when it is malformed."""
    source = directory / "manifest.json"
    try:
        data = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ManifestError(f"{source}: cannot read: {error}") from None
    if not SCRIPT_FOLDER.match(directory.name):
        raise ManifestError(f"{source}: the folder's name: expected <project>__<script>, got {directory.name!r}")
    upstream = _upstream(source, directory, _field(source, "", data, "upstream", dict))
    present = not upstream.missing(directory)
    runs = load_kind(directory, files_in_place=present)
    command = data.get("command", {})
    if not isinstance(command, dict):
        raise ManifestError(f"{source}: command: expected an object with script and arguments")
    script = command.get("script", runs[0].job["entry_point"] if runs else "")
    if present and not (directory / str(script)).is_file():
        raise ManifestError(f"{source}: command.script: {script!r} is not a file in {directory}")
    arguments = command.get("arguments", "space")
    if arguments not in ARGUMENT_STYLES:
        raise ManifestError(f"{source}: command.arguments: expected space or equals, got {arguments!r}")
    maker = data.get("data", {})
    if not isinstance(maker, dict) or (maker and not isinstance(maker.get("maker"), str)):
        raise ManifestError(f"{source}: data.maker: expected the file name of the data maker")
    if maker and not (directory / maker["maker"]).is_file():
        raise ManifestError(f"{source}: data.maker: {maker['maker']!r} is not a file in {directory}")
    maker_args = maker.get("args", [])
    if not isinstance(maker_args, list) or not all(isinstance(a, str) for a in maker_args):
        raise ManifestError(f"{source}: data.args: expected a list of strings")
    standins = data.get("standins", [])
    standins_dir = directory.parent / STANDINS
    known = {p.name for p in standins_dir.iterdir() if p.is_dir()} if standins_dir.is_dir() else set()
    if not isinstance(standins, list) or any(name not in known for name in standins):
        raise ManifestError(f"{source}: standins: expected a list of {', '.join(sorted(known)) or 'no'} packages, "
                            f"got {standins!r}")
    if sum(run.healthy for run in runs) != 1:
        raise ManifestError(f"{source}: runs: expected exactly one healthy run, got {sum(r.healthy for r in runs)}")
    no_failing_run = data.get("no_failing_run", "")
    if all(run.healthy for run in runs) and not (isinstance(no_failing_run, str) and no_failing_run.strip()):
        raise ManifestError(f"{source}: no_failing_run: required when runs has no failing run (say why none fails)")
    interleaved = data.get("interleaved_output", "")
    if not isinstance(interleaved, str):
        raise ManifestError(f"{source}: interleaved_output: expected why the script's lines interleave (a string)")
    if any(run.watch != "none" for run in runs):
        raise ManifestError(f"{source}: watch: expected none (a public script does not call watch())")
    variables = data.get("environment", {})
    if not isinstance(variables, dict) or any(
            not ENVIRONMENT_NAME.match(str(name)) or not isinstance(value, str) for name, value in variables.items()):
        raise ManifestError(f"{source}: environment: expected an object NAME -> string value, got {variables!r}")
    return Script(
        name=directory.name, directory=directory.resolve(), description=_field(source, "", data, "description", str),
        upstream=upstream, script=str(script), arguments=arguments,
        data_maker=(maker["maker"], *maker_args) if maker else (), standins=tuple(standins), runs=tuple(runs),
        no_failing_run=no_failing_run, interleaved_output=interleaved, environment=dict(variables),
    )


def load_scripts(root: Path = PUBLIC_SCRIPTS_DIR) -> list[Script]:
    """Every public script, in folder order; run names are unique across them. A script whose upstream
    files are not in place loads all the same (``Script.present`` is false): the benchmark names it and
    leaves it out."""
    scripts = [load_script(d) for d in sorted(root.iterdir()) if (d / "manifest.json").is_file()]
    _unique(root, [run for script in scripts for run in script.runs])
    return scripts


def select(runs: list[Run], kinds: list[str] | None = None, names: list[str] | None = None) -> list[Run]:
    """The runs of the kinds and names given (all when None); ValueError names what is unknown."""
    for wanted, have, flag in ((kinds, {r.kind for r in runs}, "--kinds"), (names, {r.name for r in runs}, "--runs")):
        unknown = [w for w in wanted or [] if w not in have]
        if unknown:
            raise ValueError(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(sorted(have))})")
    return [r for r in runs if (not kinds or r.kind in kinds) and (not names or r.name in names)]
