"""Package `model/` as `sourcedir.tar.gz`, the SageMaker script-mode source archive.

What goes in, and how (reproducible bytes: sorted entries, fixed owner and time), is
`stabilizer.sourcedir`'s, the one packer of every job's source; an unchanged `model/` gives the
same bytes and CDK does not upload it again. It is written to a staging directory that holds
nothing else; the stack deploys that directory to `source/` in the project bucket. This module
must not import the training code.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from stabilizer.sourcedir import ARCHIVE_NAME, source_archive

__all__ = ["ARCHIVE_NAME", "archive_bytes", "stage_source_archive"]


def archive_bytes(model_dir: Path) -> bytes:
    """The gzip'd tar of `model_dir`'s files at the archive root, byte-for-byte reproducible."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"the training source directory {model_dir} does not exist")
    return source_archive(model_dir)


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
