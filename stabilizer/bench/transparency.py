"""Transparency: does watching a script show? One script of the public-scripts corpus (`tests/public_scripts`)
run twice unwatched (`python SCRIPT args`) and once watched at the launcher level (`python -m
stabilizer_sentinel.launch SCRIPT args`), at its healthy setting, each in a fresh copy of its folder at the
same path with the same environment and seed, and the three compared.

Watching must not show: the same stdout and stderr (a line that differs between the two unwatched runs,
a timing or a process id for instance, is volatile and not compared), exit status, files (names and
content hashes under the job's directory; the sentinel's checkpoint directory lies outside it; a file
whose content differs between the unwatched runs is compared by name) and losses (the manifest's loss
metric over stdout). Where the unwatched runs differ and the watched one differs, a third unwatched run
decides (``transparency``). `stabilizer.bench.public_scripts` runs it for every script and prints the rows.
It compares and reports; it works around nothing that watching does to a script.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stabilizer.bench.corpus import STANDINS, Run, Script, edited_files

RUN_SECONDS = 900  # one script run, unwatched or watched, on a busy 2-core machine
LAUNCHER = "stabilizer_sentinel.launch"
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b.*")  # the last line of a traceback


@dataclass
class Observed:
    """What one run of a script showed: what a user would see of it."""

    exit_status: int | None  # None: still running at RUN_SECONDS
    stdout: list[str]
    stderr: list[str]
    files: dict[str, str]  # path under the job's directory -> sha256 of its content
    losses: list[str]  # the loss metric's captures over stdout, as printed
    seconds: float


@dataclass
class Transparency:
    script: str
    run: str
    result: str  # "identical", or the first difference
    differences: list[str]
    unwatched_seconds: float
    watched_seconds: float
    exit_status: int | None  # unwatched
    run_dir: str


# ---------------------------------------------------------------------------- running a script
def prepare(script: Script, code_dir: Path, environment: dict[str, str]) -> Path:
    """A fresh copy of the script's folder at `code_dir`, with its data made by its data maker."""
    if code_dir.exists():
        shutil.rmtree(code_dir)
    shutil.copytree(script.directory, code_dir, ignore=shutil.ignore_patterns("__pycache__"))
    if script.data_maker:
        made = subprocess.run([sys.executable, *script.data_maker], cwd=code_dir, env=environment,
                              capture_output=True, text=True, check=False, timeout=RUN_SECONDS)
        if made.returncode != 0:
            raise RuntimeError(f"{script.name}: {' '.join(script.data_maker)} exited {made.returncode}: "
                               f"{(made.stderr or made.stdout).strip()[-500:]}")
    return code_dir


def standin_path(script: Script) -> str:
    """The PYTHONPATH entry that makes the script's stand-in packages importable ("" when it needs none)."""
    return str(script.directory.parent / STANDINS) if script.standins else ""


def environment(script: Script, sentinel_dir: Path) -> dict[str, str]:
    """The environment of every run of the script, watched or not: one thread, a fixed hash seed, no
    bytecode files, the manifest's `environment`, the stand-ins on PYTHONPATH, the sentinel's files in
    `sentinel_dir`; the watched run configured as the workflow's jobs are by default (`recovery` in_job:
    copies of the state kept)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SM_", "STABILIZER_")) and k not in ("PYTHONPATH", "TRAINING_JOB_NAME")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
                "STABILIZER_CHECKPOINT_DIR": str(sentinel_dir / "checkpoints"),
                "STABILIZER_FAILURE_FILE": str(sentinel_dir / "failure"),
                "STABILIZER_TENSOR_DIR": str(sentinel_dir / "checkpoints" / "tensors"),
                "STABILIZER_CONFIG": json.dumps({"recovery": "in_job"})})
    env.update(script.environment)  # what the manifest says a user sets to run it
    if script.standins:
        env["PYTHONPATH"] = standin_path(script)
    return env


def loss_regex(run: Run) -> str:
    """The Regex of the job's loss metric (the metric definition named by `loss_metric`)."""
    return next(d["Regex"] for d in run.job["metric_definitions"] if d["Name"] == run.job["loss_metric"])


def _hashes(root: Path) -> dict[str, str]:
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def observe(script: Script, watched: bool, root: Path, keep_as: str) -> Observed:
    """Run the healthy setting once in a fresh `root/job/code`, then keep its directories as `root/keep_as`."""
    job_dir, sentinel_dir = root / "job", root / "sentinel"
    for directory in (job_dir, sentinel_dir):
        if directory.exists():
            shutil.rmtree(directory)
    env = environment(script, sentinel_dir)
    code = prepare(script, job_dir / "code", env)
    before = _hashes(job_dir)
    run = script.healthy
    args = [script.script, *script.command_arguments(run.job["hyperparameters"])]
    command = [sys.executable, "-m", LAUNCHER, *args] if watched else [sys.executable, *args]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True, check=False,
                              timeout=RUN_SECONDS, stdin=subprocess.DEVNULL)
        status, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as timeout:
        status = None
        stdout = (timeout.stdout or b"").decode(errors="replace")  # bytes, whatever text= says
        stderr = f"still running after {RUN_SECONDS} s"
    seconds = time.monotonic() - started
    after = _hashes(job_dir)
    written = {name: digest for name, digest in after.items() if before.get(name) != digest}
    gone = {name: "deleted" for name in before if name not in after}
    kept = root / keep_as
    if kept.exists():
        shutil.rmtree(kept)
    kept.mkdir(parents=True)
    for directory in (job_dir, sentinel_dir):
        if directory.exists():
            directory.rename(kept / directory.name)
    (kept / "stdout.txt").write_text(stdout)
    (kept / "stderr.txt").write_text(stderr)
    return Observed(status, stdout.splitlines(), stderr.splitlines(), {**written, **gone},
                    re.findall(loss_regex(run), stdout, flags=re.MULTILINE), round(seconds, 1))


# ---------------------------------------------------------------------------- comparing runs
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
DURATION_UNIT = re.compile(r"\s*(?:ms|s|sec|secs|seconds|min|minutes)\b")
# A label before the number: "time:", "elapsed", "took", a time per unit of work ("ms/batch 3.44"), or a
# rate made of a time (nanoGPT's "mfu 0.01%", its model flops utilisation: the flops over the step's time).
DURATION_WORD = re.compile(r"\b(?:time|elapsed|took|mfu|(?:ms|s|sec|secs)/\w+)\W*$", re.IGNORECASE)


def _shape(line: str) -> tuple[str, list[str]]:
    """A line's text with its numbers taken out and its runs of spaces made one (a number printed in a
    fixed width pads with spaces as its digits vary: "|   9/22" and "|  10/22" are one shape), and the
    numbers in order."""
    return re.sub(r" +", " ", NUMBER.sub("#", line)), NUMBER.findall(line)


def _volatile_fields(first: list[str], second: list[str]) -> dict[str, set[int]]:
    """For each shape of line, the numbers (by position) that differ between the two unwatched runs in
    some line of that shape: a field such as a timing is volatile wherever it is printed, even in a
    line where the two unwatched runs happened to print the same value."""
    fields: dict[str, set[int]] = {}
    for a, b in zip(first, second, strict=False):
        (shape_a, numbers_a), (shape_b, numbers_b) = _shape(a), _shape(b)
        if a != b and shape_a == shape_b:
            fields.setdefault(shape_a, set()).update(i for i, (x, y) in enumerate(zip(numbers_a, numbers_b,
                                                                                     strict=True)) if x != y)
    return fields


def _durations(line: str) -> set[int]:
    """The numbers (by position) the line says are durations: followed by a unit of time (``0.06s``,
    ``12 ms``) or following ``time:``, ``elapsed``, ``took`` (or ``mfu``, a rate made of one). A timing is
    volatile even where it is printed once and the two unwatched runs happened to print the same value."""
    return {i for i, number in enumerate(NUMBER.finditer(line))
            if DURATION_UNIT.match(line, number.end()) or DURATION_WORD.search(line, 0, number.start())}


def _only_volatile(unwatched: str, watched: str, fields: dict[str, set[int]]) -> bool:
    (shape_u, numbers_u), (shape_w, numbers_w) = _shape(unwatched), _shape(watched)
    volatile = fields.get(shape_u, set()) | _durations(unwatched)
    return shape_u == shape_w and numbers_u != numbers_w and all(
        i in volatile for i, (x, y) in enumerate(zip(numbers_u, numbers_w, strict=True)) if x != y)


def _stream_difference(name: str, first: list[str], second: list[str], watched: list[str]) -> str | None:
    """The first line of `watched` that differs from the unwatched `first` where the two unwatched agree
    (a field that differs between them in any line of the same shape is not compared: `_volatile_fields`)."""
    if len(first) == len(second) == len(watched):  # line by line: each line volatile or not on its own
        fields = _volatile_fields(first, second)
        line = next((i for i, (a, b, w) in enumerate(zip(first, second, watched, strict=True))
                     if a == b != w and not _only_volatile(a, w, fields)), None)
        return None if line is None else f"{name} line {line + 1}: unwatched {first[line]!r}, watched {watched[line]!r}"
    volatile: set[int] = set()
    for op, i1, i2, _j1, _j2 in difflib.SequenceMatcher(None, first, second, autojunk=False).get_opcodes():
        if op != "equal":
            volatile.update(range(i1, max(i2, i1 + 1)))
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, first, watched, autojunk=False).get_opcodes():
        if op == "equal" or (op == "replace" and i2 - i1 == j2 - j1 and volatile >= set(range(i1, i2))):
            continue
        if op == "insert":
            return f"{name}: watched printed {watched[j1]!r} after line {i1}"
        if op == "delete":
            return f"{name}: watched did not print line {i1 + 1} {first[i1]!r}"
        line = next((i for i in range(i1, i2) if i not in volatile), i1)
        return f"{name} line {line + 1}: unwatched {first[line]!r}, watched {watched[j1 + line - i1]!r}" \
            if j1 + line - i1 < j2 else f"{name} line {i1 + 1}: unwatched {first[i1]!r}, watched {watched[j1]!r}"
    return None


def _why(stderr: list[str]) -> str:
    """Why a run ended badly: its exception's line, or else the last line it printed."""
    said = [line.strip() for line in stderr if line.strip()]
    return next((line for line in reversed(said) if EXCEPTION_LINE.match(line)), said[-1] if said else "")


def differences(first: Observed, second: Observed, watched: Observed, ordered: bool = True) -> list[str]:
    """Every way the watched run shows, most telling first: exit status, stdout, losses, files, stderr;
    first of all, an unwatched run that failed (the corpus's healthy setting is wrong: nothing to compare)."""
    found = []
    if first.exit_status != 0:
        found.append(f"the unwatched run failed (exit {first.exit_status}): {_why(first.stderr)}")
    if watched.exit_status != first.exit_status:
        why = _why(watched.stderr)
        found.append(f"exit {watched.exit_status} (unwatched {first.exit_status})" + (f": {why}" if why else ""))
    if ordered:  # stdout and the losses in it; not where processes print at once and lines interleave
        found += [d for d in [_stream_difference("stdout", first.stdout, second.stdout, watched.stdout)] if d]
    if ordered and first.losses == second.losses and watched.losses != first.losses:
        index = next((i for i, (a, b) in enumerate(zip(first.losses, watched.losses, strict=False)) if a != b),
                     min(len(first.losses), len(watched.losses)))
        unwatched_loss, watched_loss = first.losses[index:index + 1], watched.losses[index:index + 1]
        found.append(f"losses: {len(watched.losses)} watched, {len(first.losses)} unwatched; first differs at "
                     f"#{index + 1}: unwatched {unwatched_loss}, watched {watched_loss}")
    found += _file_differences(first.files, second.files, watched.files)
    found += [d for d in [_stream_difference("stderr", first.stderr, second.stderr, watched.stderr)] if d]
    return found


def _name_shape(name: str) -> str:
    """A file name with its numbers blanked: `events.out.tfevents.1732.host.4127.0` and the same file
    of another run share a shape."""
    return re.sub(r"\d+", "#", name)


def _file_differences(first: dict[str, str], second: dict[str, str], watched: dict[str, str]) -> list[str]:
    """Files written by one run and not the other, or with other content. A name that differs between
    the two unwatched runs (a time or a process id in it: TensorBoard's event files) is volatile: such
    files are compared by how many of each shape were written, and not by content."""
    volatile = {_name_shape(name) for name in set(first) ^ set(second)}
    found = []
    for name in sorted(set(first) | set(watched)):
        if _name_shape(name) in volatile:
            continue
        if name not in watched:
            found.append(f"file {name}: written unwatched, not watched")
        elif name not in first:
            found.append(f"file {name}: written watched only")
        elif first[name] == second.get(name) and watched[name] != first[name]:
            found.append(f"file {name}: content differs")
    for shape in sorted(volatile):
        counts = [sum(_name_shape(name) == shape for name in files) for files in (first, second, watched)]
        if counts[0] == counts[1] != counts[2]:
            found.append(f"files {shape}: {counts[2]} written watched, {counts[0]} unwatched")
    return found


def transparency(script: Script, root: Path) -> Transparency:
    """Two unwatched runs and one watched run of the healthy setting, compared.

    Where the watched run differs and the two unwatched runs differ too (a script that is not deterministic:
    a line they agree on may have agreed by chance), a third unwatched run is drawn, and the difference stands
    only where the watched run differs from every pair of the three: pytorch/examples' forward-forward network
    ends at a train error of 0.36 or 0.40 run to run, and two unwatched runs that both ended at 0.46 made a
    watched 0.31 a difference (stop 75)."""
    root.mkdir(parents=True, exist_ok=True)
    first = observe(script, False, root, "unwatched-1")
    second = observe(script, False, root, "unwatched-2")
    watched = observe(script, True, root, "watched")
    ordered = not script.interleaved_output
    found = differences(first, second, watched, ordered=ordered)
    if found and (first.stdout, first.stderr, first.files) != (second.stdout, second.stderr, second.files):
        third = observe(script, False, root, "unwatched-3")
        if not (differences(first, third, watched, ordered=ordered) and differences(second, third, watched,
                                                                                    ordered=ordered)):
            found = []
    edited = edited_files(script)
    if edited:  # not the upstream script any more: say so before anything else
        found.insert(0, f"vendored files edited: {', '.join(edited)}")
    same = f"identical (stdout not compared: {script.interleaved_output})" if script.interleaved_output else "identical"
    return Transparency(script.name, script.healthy.name, found[0] if found else same, found,
                        round((first.seconds + second.seconds) / 2, 1), watched.seconds, first.exit_status, str(root))
