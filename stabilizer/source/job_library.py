"""The in-job library's files: what every training job's `stabilizer` channel holds.

The stack deploys them to the library prefix (infra/training_source.py) and local mode uploads
them to its local S3 (`stabilizer.local.engine.staging.upload_library`); both take the list from here, so
the two deliver the same files. The job receives the prefix as its `stabilizer` channel, with
PYTHONPATH pointing at it (docs/contracts.md, section 8). This module lists files; it copies and
uploads nothing.
"""

from __future__ import annotations

from pathlib import Path

# The in-job library and the contract it imports.
LIBRARY_PACKAGES = ("stabilizer_sentinel", "stabilizer_contract")


def library_files(model_dir: Path) -> list[Path]:
    """The files of `LIBRARY_PACKAGES` under `model_dir`, caches left out, relative to `model_dir`."""
    files = []
    for name in LIBRARY_PACKAGES:
        package = Path(model_dir) / name
        if not package.is_dir():
            raise FileNotFoundError(f"no library to deliver: {package} is not a directory")
        for path in sorted(package.rglob("*")):
            relative = path.relative_to(model_dir)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
                files.append(relative)
    return files
