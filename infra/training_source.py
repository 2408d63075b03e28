"""Package `model/` as `sourcedir.tar.gz`, the SageMaker script-mode source archive.

The archive is reproducible (sorted entries, fixed owner and time), so an unchanged `model/`
gives the same bytes and CDK does not upload it again. It is written to a staging directory
that holds nothing else; the stack deploys that directory to `source/` in the project bucket.
This module must not import the training code.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

ARCHIVE_NAME = "sourcedir.tar.gz"
# Not part of what the container runs: caches, local data, test files.
_SKIPPED_PARTS = frozenset({"__pycache__", ".pytest_cache", "tests", "data", ".ipynb_checkpoints"})


def _members(model_dir: Path) -> list[Path]:
    return [
        path
        for path in sorted(model_dir.rglob("*"))
        if path.is_file()
        and not _SKIPPED_PARTS.intersection(path.relative_to(model_dir).parts)
        and path.suffix != ".pyc"
    ]


def archive_bytes(model_dir: Path) -> bytes:
    """The gzip'd tar of `model_dir`'s files at the archive root, byte-for-byte reproducible."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"the training source directory {model_dir} does not exist")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _members(model_dir):
            info = tarfile.TarInfo(str(path.relative_to(model_dir)))
            info.size = path.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def stage_source_archive(model_dir: Path, cache_root: Path) -> Path:
    """A directory containing only `sourcedir.tar.gz` for `model_dir`, cached by content."""
    data = archive_bytes(model_dir)
    stage = cache_root / f"sourcedir-{hashlib.sha256(data).hexdigest()[:20]}"
    archive = stage / ARCHIVE_NAME
    if not archive.is_file():
        stage.mkdir(parents=True, exist_ok=True)
        tmp = stage / f".{ARCHIVE_NAME}.{os.getpid()}"
        tmp.write_bytes(data)
        tmp.replace(archive)
    return stage
