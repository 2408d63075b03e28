"""Starts the launcher level inside a SageMaker job, before the user's unmodified entry point runs.

Python's ``site`` imports the first ``sitecustomize`` module on ``sys.path`` in every interpreter.
The job's environment puts this directory there (docs/contracts.md, section 8)::

    PYTHONPATH=/opt/ml/input/data/stabilizer:/opt/ml/input/data/stabilizer/stabilizer_sentinel/autostart

The SageMaker training toolkit passes its own ``sys.path`` (which holds PYTHONPATH) on as the
entry point's PYTHONPATH, so the script's interpreter imports this module too. It does something
only in the entry point's process: ``SM_USER_ENTRY_POINT`` is set (the toolkit sets it for the
script, not for itself) and the command line runs that file or module, which also holds for each
worker ``torchrun`` starts, and in each ``multiprocessing`` child (spawn, forkserver) of that
process, which watches itself as a worker (stabilizer_sentinel.loops.worker_processes). There it reads
the ``sagemaker_stabilizer`` configuration and, when it
says ``"integration": "launcher"`` or ``"auto"`` (the workflow's default), installs the global hooks of
``stabilizer_sentinel.integration.launcher_hooks``: with "auto" they stand by, and stand down if the script calls
``watch()`` before its first optimizer step. Any other
process pays one environment lookup. A bad configuration ends the process with status 2 and a
failure file naming the field, before the script starts.

Afterwards the next ``sitecustomize`` further along ``sys.path`` (an image's own) still runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _runs_the_entry_point(argv: list[str] | None = None) -> bool:
    entry = os.environ.get("SM_USER_ENTRY_POINT")
    if not entry:
        return False
    argv = argv if argv is not None else list(getattr(sys, "orig_argv", []))[1:] or list(sys.argv)
    module = entry[:-3] if entry.endswith(".py") else entry
    valued = False  # the argument before was an interpreter option that takes the next one as its value
    for index, arg in enumerate(argv):
        if valued:
            valued = False
            continue
        if arg == "-m" and index + 1 < len(argv):
            return argv[index + 1] == module
        if arg == "-c":
            return False
        if arg in ("-W", "-X", "--check-hash-based-pycs"):  # ``python -W error train.py``: "error" is no script
            valued = True
            continue
        if not arg.startswith("-"):
            return os.path.basename(arg) == os.path.basename(entry)
    return False


def _a_worker_of_the_entry_point() -> bool:
    """A ``multiprocessing`` child (spawn, forkserver) of the entry point's process
    (stabilizer_sentinel.loops.worker_processes)."""
    if not os.environ.get("SM_USER_ENTRY_POINT"):
        return False
    from stabilizer_sentinel.loops import worker_processes

    if not worker_processes.is_worker_command(list(getattr(sys, "orig_argv", []))[1:]):
        return False
    parent = worker_processes.parent_command()
    return parent is not None and _runs_the_entry_point(parent)


def _activate(worker: bool = False) -> None:
    try:
        from stabilizer_sentinel.integration.import_settings import follow_thread_setting

        follow_thread_setting()  # before torch is loaded: the script's OMP_NUM_THREADS, set before its import
        from stabilizer_sentinel.integration.launcher_hooks import activate

        activate(worker=worker)
    except ValueError as error:  # StabilizerConfigError, RuleConfigError, CaptureConfigError
        reason = f"{type(error).__name__}: {error}"
        failure = os.environ.get("STABILIZER_FAILURE_FILE") or "/opt/ml/output/failure"
        try:
            os.makedirs(os.path.dirname(failure), exist_ok=True)
            with open(failure, "w") as handle:
                handle.write(" ".join(reason.split())[:1000] + "\n")
        except OSError:
            pass
        print(f"stabilizer: {reason}", file=sys.stderr, flush=True)
        os._exit(2)  # site would swallow an exception raised here and run the script unprotected


def _chain() -> None:
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_stabilizer_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    if _runs_the_entry_point():
        _activate()
    elif _a_worker_of_the_entry_point():
        _activate(worker=True)
finally:
    _chain()
