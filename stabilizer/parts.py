"""Where the project's other parts are, and the one way stabilizer imports from them.

The repository holds two parts that are not packages of this distribution, because each is
shipped as it is: ``model/`` is the SageMaker source directory (in the job its modules import as
top-level names: ``data``, ``rule_engine``), and ``lambdas/`` is the Lambda asset (``workflow``,
the handlers). stabilizer runs both as they run there, so it imports them by the same top-level
names, with their directory on ``sys.path``. This module is the only place that knows where they
are and that puts them on the path; nothing else in ``stabilizer/`` edits ``sys.path``.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType


class PartMissingError(ImportError):
    """A part of the project cannot be imported from where it should be; the message says which."""


def project_root() -> Path:
    """The repository this package runs from (stabilizer drives the project's own parts)."""
    return Path(__file__).resolve().parents[1]


def model_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / "model"


def lambdas_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / "lambdas"


def use(directory: Path) -> Path:
    """Put ``directory`` first on ``sys.path`` (once) so its modules import by their own names."""
    entry = str(directory)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    return directory


@contextlib.contextmanager
def used(directory: Path) -> Iterator[Path]:
    """``use`` for a while: the entry is removed again on the way out if it was added here."""
    entry = str(directory)
    added = entry not in sys.path
    use(directory)
    try:
        yield directory
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(entry)


def use_model(root: Path | None = None) -> Path:
    """``model/`` on the path for good: a notebook or benchmark imports ``data`` and ``rule_engine``."""
    return use(model_dir(root))


def from_model(module: str, root: Path | None = None) -> ModuleType:
    """A module of ``model/`` (``data``, ``rule_engine.trial``), imported as the job imports it."""
    directory = use_model(root)
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise PartMissingError(f"cannot import {module} from {directory}: {error}") from None


def from_lambdas(module: str, root: Path | None = None) -> ModuleType:
    """A module of the Lambda asset (``workflow.state``), imported as the handlers import it.

    The asset's directory stays on the path only while importing: the engine puts it there for
    as long as it runs the handlers, and a notebook does not need it otherwise.
    """
    with used(lambdas_dir(root)) as directory:
        try:
            return importlib.import_module(module)
        except ImportError as error:
            raise PartMissingError(f"cannot import {module} from {directory}: {error}") from None
