"""Where the project's parts are: the checkout stabilizer runs from, or the installed distribution.

From a checkout (an editable install, or the tests), the parts are its folders: the state machine's
definition in ``statemachine/``, the Lambda asset root ``lambdas/``, the training source directory
``model/`` (which holds the in-job library too). Installed from a wheel there is no checkout: the
wheel carries the definition as data of ``stabilizer_workflow`` and the reference job's source as
data of ``stabilizer`` (``stabilizer/reference_job/``), and the library's packages are installed beside the others.

Nothing here imports the rest of ``stabilizer.local``: every module may ask where the parts are.
"""

from __future__ import annotations

from pathlib import Path


def project_root() -> Path:
    """The checkout stabilizer runs from (installed from a wheel: the directory it is installed in)."""
    return Path(__file__).resolve().parents[2]


def in_checkout(root: Path | None = None) -> bool:
    """Whether ``root`` (this checkout by default) holds the project's folders."""
    root = root or project_root()
    return all((root / part).is_dir() for part in ("statemachine", "lambdas", "model"))


def installed_parts() -> tuple[Path, Path, Path, Path]:
    """Where an installed distribution keeps the parts: (definition directory, Lambda asset root,
    reference training source, library root)."""
    import stabilizer_sentinel
    import stabilizer_workflow

    workflow = Path(stabilizer_workflow.__file__).resolve().parent
    return (
        workflow / "statemachine",
        workflow.parent,
        Path(__file__).resolve().parents[1] / "reference_job",
        Path(stabilizer_sentinel.__file__).resolve().parents[1],
    )


def reference_source() -> Path:
    """The reference job's training source directory (``model/`` of a checkout)."""
    return project_root() / "model" if in_checkout() else installed_parts()[2]
