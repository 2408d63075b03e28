"""A training job's source directory, packed as `sourcedir.tar.gz` the way the SageMaker SDK packs it.

This is the one place that decides what of a job's source goes to the job, for every path that
packs one: local mode (`stabilizer.local.engine.staging`, the engine's reference `model/`), the AWS
client's upload (`stabilizer.client.sdk_aws.upload_local_files`), SDK estimators and ModelTrainers
(`stabilizer.client.sdk_source`), and the CDK app's archive of `model/` (`infra/training_source.py`).

What the SDK does, and so what this does. An estimator's `source_dir` goes up whole:
``sagemaker.fw_utils.tar_and_upload_dir`` lists every entry of the directory
(``_list_files_to_compress``: ``os.listdir(source_dir)``), adds each ``dependencies`` path, and
``sagemaker.utils.create_tar_file`` writes them at the archive root with ``tarfile.add(path,
arcname=basename, dereference=True)``: recursively, with links followed, nothing left out by name
(SDK 2.257.7). A ModelTrainer drops only what ``SourceCode.ignore_patterns`` names (by default
``.env``, ``.git``, ``__pycache__``, ``.DS_Store``, ``.cache``, ``.ipynb_checkpoints``), matched as
``shutil.ignore_patterns`` does, against each name at every level. So a folder called `data` or
`tests` goes up, and so does everything else a script may open by a relative path.

What is left out, and nothing else:

- the run directory, wherever it lies inside the source: a path the caller names (the CLI's
  ``--run-dir``), or any directory holding the marker file `RUN_MARKER`, which the local engine
  and the CLI write into the directories where runs live;
- `.git` (a directory, or a worktree's `.git` file);
- virtual environments: a directory holding ``pyvenv.cfg`` (venv, virtualenv, uv, poetry) or
  ``conda-meta/`` (conda), whatever its name;
- caches: `CACHE_DIRECTORIES`;
- what the source's ignore file (`IGNORE_FILE`, at the source's root) names, in gitignore syntax
  (`stabilizer.source.ignorefile` says which forms), and a ModelTrainer's ``ignore_patterns``.

An archive larger than `MAX_ARCHIVE_BYTES` is refused (`SourceTooLargeError`, naming ``job.source``,
the sizes, the limit and the biggest entries) before anything is uploaded or launched.

Archives are reproducible: entries sorted, owner root, time 0, mode 0644 (0755 for executables
and directories), so the same content packs to the same bytes and the same content-addressed key.
This module knows files and bytes; it uploads nothing and must not import the training code.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from stabilizer.source.ignorefile import IgnoreRules

ARCHIVE_NAME = "sourcedir.tar.gz"
IGNORE_FILE = ".stabilizerignore"
RUN_MARKER = ".stabilizer-run"
RUN_MARKER_TEXT = (
    "This directory holds stabilizer runs. stabilizer leaves it out of every training job's source "
    "archive (see stabilizer/source/sourcedir.py).\n"
)
CACHE_DIRECTORIES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints"})
# 64 MiB, the size up to which the train Lambda reads a source archive at ValidateInput to check
# that the entry point is in it (lambdas/stabilizer_workflow/launch/sources.py, MAX_ARCHIVE_BYTES); a larger archive
# would skip that check and fail only after an instance started. SageMaker sets no limit of its
# own, but every attempt downloads and unpacks the archive before its script starts (the
# training toolkit's /opt/ml/code), and each relaunch does it again: source is code, data belongs
# in channels (job.channels), which SageMaker mounts or copies without re-packing.
MAX_ARCHIVE_BYTES = 64 * 1024 * 1024
_BIGGEST_SHOWN = 5


class SourceError(ValueError):
    """A job's source cannot be packed; the message names ``job.source``."""


class SourceTooLargeError(SourceError):
    """The archive would exceed `MAX_ARCHIVE_BYTES`."""


# --- what goes in ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One file of the archive: its name there, where it is read from, its size."""

    name: str
    path: Path
    size: int
    executable: bool


@dataclass
class SourcePlan:
    """What a source packs to, before packing: the files, and what was left out and why."""

    root: Path | None
    files: list[Entry] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def biggest(self, count: int = _BIGGEST_SHOWN) -> list[tuple[str, int]]:
        """The largest top-level entries (a directory counts with everything packed inside it)."""
        sizes: dict[str, int] = {}
        for entry in self.files:
            top, sep, _ = entry.name.partition("/")
            key = top + sep
            sizes[key] = sizes.get(key, 0) + entry.size
        return sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:count]

    def left_out_text(self) -> str:
        """``left out: runs/ (run directory), __pycache__/ and 3 more (cache), 2 paths by .stabilizerignore``."""
        if not self.left_out:
            return "nothing left out"
        by_reason: dict[str, list[str]] = {}
        for name, why in self.left_out:
            by_reason.setdefault(why, []).append(name)
        parts = []
        for why, names in by_reason.items():
            if why == IGNORE_FILE:
                continue
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            parts.append(f"{names[0]}{more} ({why})")
        if IGNORE_FILE in by_reason:
            count = len(by_reason[IGNORE_FILE])
            parts.append(f"{count} path{'s' if count != 1 else ''} by {IGNORE_FILE}")
        return "left out: " + ", ".join(parts)

    def _signature(self) -> tuple:
        return tuple((e.name, str(e.path), e.size, e.executable, _mtime(e.path)) for e in self.files) + tuple(
            self.directories
        )


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _is_venv(directory: Path) -> bool:
    return (directory / "pyvenv.cfg").is_file() or (directory / "conda-meta").is_dir()


def _why_left_out(path: Path, name: str, is_dir: bool, leave_out: set[Path]) -> str | None:
    if name == ".git":
        return "git"
    if not is_dir:
        return None
    if name in CACHE_DIRECTORIES:
        return "cache"
    resolved = path.resolve()
    if resolved in leave_out or (path / RUN_MARKER).is_file():
        return "run directory"
    if _is_venv(path):
        return "virtual environment"
    return None


def _walk(plan: SourcePlan, path: Path, name: str, rules: IgnoreRules, leave_out: set[Path],
          ancestors: frozenset[Path]) -> None:
    try:
        info = path.stat()  # follows links, as create_tar_file's dereference=True does
    except OSError:
        plan.left_out.append((name, "broken link or unreadable"))
        return
    is_dir = stat.S_ISDIR(info.st_mode)
    why = _why_left_out(path, path.name, is_dir, leave_out)
    if why is None and rules.ignored(name, is_dir):
        why = IGNORE_FILE
    if why is not None:
        plan.left_out.append((name + ("/" if is_dir else ""), why))
        return
    if is_dir:
        real = path.resolve()
        if real in ancestors:  # a link back up the tree: tarfile would loop; git would not follow it
            plan.left_out.append((name + "/", "link loop"))
            return
        plan.directories.append(name)
        for child in sorted(os.listdir(path)):
            _walk(plan, path / child, f"{name}/{child}", rules, leave_out, ancestors | {real})
    elif stat.S_ISREG(info.st_mode):
        plan.files.append(Entry(name, path, info.st_size, bool(info.st_mode & 0o111)))
    else:
        plan.left_out.append((name, "not a regular file"))


def plan_source(directory: Path | None = None, *, extra: Sequence[Path] = (), leave_out: Sequence[Path] = (),
                ignore_patterns: Sequence[str] = ()) -> SourcePlan:
    """What `directory`'s archive holds: its entries at the archive root, then each of `extra`
    (the SDK's ``dependencies``, or a lone entry point) at the root under its own name.

    `leave_out` names run directories by path; `ignore_patterns` are gitignore lines added after
    the source's own `IGNORE_FILE` (a ModelTrainer's ``ignore_patterns``).
    """
    root = Path(directory).resolve() if directory is not None else None
    if root is not None and not root.is_dir():
        raise SourceError(f"job.source: {root} is not a directory")
    rules = IgnoreRules.read(root / IGNORE_FILE, ignore_patterns) if root else IgnoreRules(ignore_patterns)
    excluded = {Path(p).resolve() for p in leave_out}
    plan = SourcePlan(root=root)
    tops: list[tuple[str, Path]] = []
    if root is not None:
        tops += [(name, root / name) for name in sorted(os.listdir(root))]
    for given in extra:
        path = Path(given)
        if not path.exists():
            raise SourceError(f"job.source: no such file or directory to pack: {path}")
        tops.append((path.name, path))
    ancestors = frozenset({root}) if root else frozenset()
    for name, path in tops:
        _walk(plan, path, name, rules, excluded, ancestors)
    return plan


# --- packing --------------------------------------------------------------------------------------


class _Capped(io.RawIOBase):
    """A sink that keeps what is written and stops once it holds more than `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.limit = limit

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.buffer += data
        if len(self.buffer) > self.limit:
            raise _OverLimitError
        return len(data)


class _OverLimitError(Exception):
    pass


def _write(plan: SourcePlan, sink: BinaryIO) -> None:
    with gzip.GzipFile(fileobj=sink, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        names = sorted([(d, None) for d in plan.directories] + [(e.name, e) for e in plan.files],
                       key=lambda item: item[0])
        for name, entry in names:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if entry is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
                continue
            info.size = entry.size
            info.mode = 0o755 if entry.executable else 0o644
            with entry.path.open("rb") as handle:
                tar.addfile(info, handle)


def size_text(count: int) -> str:
    """Bytes as a person reads them: ``812 B``, ``4.0 KiB``, ``612.3 MiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


@dataclass(frozen=True)
class Packed:
    """A packed source: the archive's bytes and the plan it came from."""

    data: bytes
    plan: SourcePlan

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def summary(self, shown_as: str) -> str:
        """One line for the person: what goes up, how big, and what was left out."""
        count = len(self.plan.files)
        return (
            f"source: {shown_as} -> {ARCHIVE_NAME}, {count} file{'s' if count != 1 else ''}, "
            f"{size_text(len(self.data))} ({size_text(self.plan.total_bytes)} unpacked); "
            f"{self.plan.left_out_text()}"
        )


_cache_lock = threading.Lock()
_last: dict[tuple, Packed] = {}  # the last archive packed, by what went into it


def pack(plan: SourcePlan, *, limit: int | None = None, shown_as: str | None = None) -> Packed:
    """The plan's `sourcedir.tar.gz`; `SourceTooLargeError` as soon as it would exceed `limit`.

    The archive is built in memory, never larger than `limit`, and the last one packed is kept:
    the CLI checks and reports a source before anything starts, and the engine packs the same
    files again when it stages them.
    """
    limit = MAX_ARCHIVE_BYTES if limit is None else limit
    signature = (limit, plan._signature())
    with _cache_lock:
        if signature in _last:
            return Packed(_last[signature].data, plan)
    sink = _Capped(limit)
    try:
        _write(plan, sink)  # type: ignore[arg-type]
    except _OverLimitError:
        where = shown_as or (str(plan.root) if plan.root else "the source")
        biggest = ", ".join(f"{name} {size_text(size)}" for name, size in plan.biggest())
        raise SourceTooLargeError(
            f"job.source: {where} packs to more than {size_text(limit)}, the limit for a source archive "
            f"({len(plan.files)} files, {size_text(plan.total_bytes)} unpacked); biggest entries: {biggest}. "
            f"Give data to the job as a channel (job.channels), or leave files out by naming them in "
            f"{IGNORE_FILE} at the source's root (gitignore syntax)"
        ) from None
    packed = Packed(bytes(sink.buffer), plan)
    with _cache_lock:
        _last.clear()
        _last[signature] = packed
    return packed


def source_archive(directory: Path, *, leave_out: Sequence[Path] = (), limit: int | None = None) -> bytes:
    """`sourcedir.tar.gz` of `directory`, with what this module leaves out left out."""
    return pack(plan_source(directory, leave_out=leave_out), limit=limit, shown_as=str(directory)).data


def mark_run_directory(directory: Path) -> None:
    """Write `RUN_MARKER` into `directory` (created if need be): it is never packed into a source."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / RUN_MARKER
    if not marker.is_file():
        marker.write_text(RUN_MARKER_TEXT)
