"""Training in child processes of the watched script: each one that trains is watched as a worker.

Hogwild! (one model in shared memory, several ``torch.multiprocessing`` processes each with its own
optimizer) and any loop run in a ``multiprocessing.Process`` train where the entry point's hooks
are not: a spawned child is a new interpreter, a forked one exits with ``os._exit`` (no ``atexit``).
So:

- **Which processes.** A child started by ``multiprocessing``'s spawn (``spawn_main``) or forkserver
  whose parent runs the job's entry point installs the launcher hooks itself (the autostart
  ``sitecustomize``, ``is_worker_command``); a child forked while the entry point's hooks stood by
  inherits them (``os.register_at_fork``, stabilizer_sentinel.integration.launcher_hooks) and is closed by
  ``multiprocessing``'s own exit finalizers. A child forked after the hooks attached (a DataLoader
  worker of a watched loop) is a copy of a watched process: it writes nothing. A child that never
  steps an optimizer (a DataLoader worker) never attaches, so it writes nothing either.
- **What a worker writes.** Its findings.json document goes to ``findings-by-process/<pid>.json``
  beside findings.json; then, under a file lock, findings.json becomes the merge of every part
  (``merged``): every process's findings (each names its ``process``), one summary over all of
  them, and ``processes``, their number. The entry point writes its own document there too when
  a worker wrote before it; a run of one process writes findings.json as before, with no parts.
- **Stopping.** A worker whose rule stops the job leaves as a rank does (exit status 86, the
  failure file); its finding is in findings.json at once, where the workflow reads it at its next
  check and stops the job, as it does with a Debugger rule's verdict (docs/contracts.md, section 2).

A worker captures no tensors (like a rank other than 0 under DDP: they would share one store), and
the ranks of a process group (``torch.distributed``) stay what stabilizer_sentinel.loops.distributed says.
Standard library only: the ``sitecustomize`` of every process asks ``is_worker_command``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PARTS = "findings-by-process"
_LOCK = ".lock"
_ENTRY_POINT = "entry-point"

_ROLE: dict[str, bool] = {"worker": False}  # this process's


def become_worker() -> None:
    """This process is a worker of the watched script (see the module docstring)."""
    _ROLE["worker"] = True


def is_worker() -> bool:
    return _ROLE["worker"]


def is_worker_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (an interpreter's, after its program name) is a ``multiprocessing`` child's:
    spawn's ``-c 'from multiprocessing.spawn import spawn_main; ...' --multiprocessing-fork``, or the
    forkserver's ``-c 'from multiprocessing.forkserver import main; ...'`` (its children are forked)."""
    argv = list(argv)
    if "-c" not in argv or argv.index("-c") + 1 >= len(argv):
        return False
    code = argv[argv.index("-c") + 1]
    return ("multiprocessing.spawn import spawn_main" in code and "--multiprocessing-fork" in argv) or (
        "multiprocessing.forkserver import main" in code)


def parent_command() -> list[str] | None:
    """The parent process's command line, after its program name; None where it cannot be read."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part][1:]


def write_findings(path: Path, document: dict[str, Any]) -> None:
    """Write findings.json: directly for a run of one process, else this process's part and the merge."""
    from stabilizer_sentinel.capture import store

    parts = path.parent / PARTS
    if not is_worker() and not parts.is_dir():
        store.write_json_atomic(path, document)
        return
    parts.mkdir(parents=True, exist_ok=True)
    name = f"{os.getpid()}.json" if is_worker() else f"{_ENTRY_POINT}.json"
    store.write_json_atomic(parts / name, {**document, "process": name[: -len(".json")]})
    with _locked(parts / _LOCK):
        store.write_json_atomic(path, merged(_read_parts(parts)))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl  # POSIX, where jobs run; imported here so that the library still imports elsewhere

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_parts(parts: Path) -> list[dict[str, Any]]:
    documents = []
    for file in sorted(parts.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            documents.append(json.loads(file.read_text()))
    return documents


# How a run of several processes ended: the gravest ending of any; one still running keeps it open.
_GRAVITY = ("exception", "rule_stop", "interrupted", None, "completed")


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One findings.json document from the documents of several processes (docs/contracts.md, section 2)."""
    parts = sorted(parts, key=lambda part: (part.get("process") == _ENTRY_POINT, str(part.get("process"))))
    document: dict[str, Any] = {
        "version": max((part.get("version", 2) for part in parts), default=2),
        "job_action": next((part["job_action"] for part in parts if "job_action" in part), "stop"),
        "findings": [dict(entry, process=part.get("process")) for part in parts for entry in part.get("findings", [])],
        "processes": len(parts),
    }
    summaries = [part["summary"] for part in parts if part.get("summary")]
    if summaries:
        document["summary"] = merged_summary(summaries)
    return document


def merged_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Every step of every process counted; its ending the gravest; learned only if each process learned.

    Its losses are those of the process that took the most steps (the first of them on a tie), except
    the last: a non-finite one when any process ended on one, so that a process that diverged is not
    hidden by one that did not.
    """
    if len(summaries) == 1:
        return dict(summaries[0])
    most = max(summaries, key=lambda summary: summary.get("steps_observed") or 0)

    def values(key: str) -> list[Any]:
        return [summary.get(key) for summary in summaries if summary.get(key) is not None]

    endings = [summary.get("ended") for summary in summaries]
    learned = [summary.get("learned") for summary in summaries]
    nonfinite = [value for value in values("last_loss") if isinstance(value, str)]  # written "nan", "inf"
    return {
        **most,
        "ended": min(endings, key=lambda ended: _GRAVITY.index(ended) if ended in _GRAVITY else 0),
        "exception": next(iter(values("exception")), None),
        "steps_taken": sum(values("steps_taken")),
        "steps_observed": sum(values("steps_observed")),
        "steps_skipped": sum(values("steps_skipped")),
        "steps_idle": sum(values("steps_idle")),
        "first_step": min(values("first_step"), default=None),
        "last_step": max(values("last_step"), default=None),
        "last_loss": nonfinite[0] if nonfinite else most.get("last_loss"),
        "learned": False if False in learned else True if all(value is True for value in learned) else None,
    }
