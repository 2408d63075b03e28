"""The unchanged-script level: run a training script, unmodified, under the sentinel.

    python -m stabilizer_sentinel.launch train.py --lr 0.5 --epochs 3
    python -m stabilizer_sentinel.launch -m mypackage.train --lr 0.5
    torchrun --nproc_per_node 2 -m stabilizer_sentinel.launch train.py ...

In a SageMaker job nothing wraps the command: ``stabilizer_sentinel/autostart/sitecustomize.py`` calls
``activate()`` when the job's ``sagemaker_stabilizer`` configuration says ``"integration":
"launcher"`` or ``"auto"`` (the default the workflow sends; docs/contracts.md, section 8). The hooks
then stand by: a script that calls ``watch()`` (or adds the Lightning ``SentinelCallback``) before
its first optimizer step makes them stand down, and the library watches; otherwise they attach.

``python -m stabilizer_sentinel.launch`` takes the same path: it becomes ``python SCRIPT args``
(``os.execve``, the same process) in the job's environment, the autostart directory on
``PYTHONPATH`` and the integration set to launcher, so the script runs exactly as ``python`` runs
it (its directory first on ``sys.path``) and the hooks (stabilizer_sentinel.integration.launcher_hooks) watch it
as in a job. This module imports no torch: the script's interpreter does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Mapping

from stabilizer_sentinel.job_config import load_config

USAGE = "usage: python -m stabilizer_sentinel.launch SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"


def command(argv: list[str]) -> list[str]:
    """The interpreter command that runs ``SCRIPT args`` or ``-m MODULE args``: ``python`` itself."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(0 if argv else 2)
    if argv[0] == "-m" and len(argv) < 2:
        raise SystemExit(USAGE)
    return [sys.executable, *_interpreter_options(), *argv]


def _interpreter_options() -> list[str]:
    """This interpreter's options (``-u``, which torchrun gives its workers; ``-X``, ``-W``), kept for the script."""
    given = list(getattr(sys, "orig_argv", []))
    for index in range(1, len(given)):
        if given[index] == "-m" and given[index + 1 : index + 2] == [__spec__.name if __spec__ else ""]:
            return given[1:index]
        if given[index] == f"-m{__spec__.name if __spec__ else ''}":
            return given[1:index]
    return []


def job_environment(argv: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment in which the job's autostart watches ``argv``'s script at the launcher level.

    As in a job (docs/contracts.md, section 8): the library and its ``autostart`` directory on
    ``PYTHONPATH``, so ``sitecustomize`` installs the hooks before the script runs;
    ``SM_USER_ENTRY_POINT`` naming the script, so only its process does; and the configuration
    (``STABILIZER_CONFIG``) the job's, with ``"integration": "launcher"``, asked for on the command line.
    """
    env = dict(os.environ if environ is None else environ)
    with contextlib.suppress(ValueError):  # a bad configuration: the autostart fails on it, as in a job
        config = dataclasses.asdict(load_config(env))
        config = {name: value for name, value in config.items() if value not in (None, {})}
        env["STABILIZER_CONFIG"] = json.dumps({**config, "integration": "launcher"})
    env["SM_USER_ENTRY_POINT"] = argv[1] if argv[0] == "-m" else os.path.basename(argv[0])
    package = os.path.dirname(os.path.abspath(__file__))
    library = os.path.dirname(package)
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    # The script's interpreter has every entry of this one's sys.path but the first (the working
    # directory of `python -m`): the library's directory goes on PYTHONPATH when it was found there.
    first = [library] if sys.path and _same(sys.path[0], library) and library not in sys.path[1:] else []
    env["PYTHONPATH"] = os.pathsep.join([*first, os.path.join(package, "autostart"), *paths])
    return env


def _same(entry: str, directory: str) -> bool:
    return os.path.abspath(entry or os.curdir) == directory


def main(argv: list[str] | None = None) -> None:
    """Become ``python SCRIPT args`` (or ``python -m MODULE args``) in the job's environment.

    ``os.execve`` keeps the process (its pid, which ``torchrun`` waits on, and its standard
    streams), and the interpreter puts the script's directory (for ``-m``, the working directory)
    first on ``sys.path``, exactly as without the launcher. The autostart then watches it as in a
    job; a bad configuration fails there, naming its field, before the script runs.
    """
    argv = sys.argv[1:] if argv is None else argv
    run = command(argv)
    env = job_environment(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, run, env)


if __name__ == "__main__":
    main()
