"""Package `model/` as `sourcedir.tar.gz`, the SageMaker script-mode source archive, and stage the in-job library.

What goes in, and how (reproducible bytes: sorted entries, fixed owner and time), is
`stabilizer.source.sourcedir`'s, the one packer of every job's source; an unchanged `model/` gives
the same bytes and CDK does not upload it again. It is written to a staging directory that holds
nothing else; the stack deploys that directory to `source/` in the project bucket. Which files
the library holds is `stabilizer.source.job_library`'s, the list local mode uploads too.

This module must not import the training code, nor the client or local mode: of `stabilizer`, the
CDK app imports only the floor they stand on (tests/packaging/test_import_direction.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from stabilizer.source.job_library import library_files
from stabilizer.source.sourcedir import ARCHIVE_NAME, source_archive

__all__ = ["ARCHIVE_NAME", "archive_bytes", "stage_library", "stage_source_archive"]


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


def stage_library(model_dir: Path, cache_root: Path) -> Path:
    """A directory holding only the in-job library's packages of `model_dir`, cached by content."""
    files = library_files(model_dir)
    digest = hashlib.sha256()
    for relative in files:
        content = hashlib.sha256((model_dir / relative).read_bytes()).digest()
        digest.update(relative.as_posix().encode() + b"\0" + content)
    stage = cache_root / f"library-{digest.hexdigest()[:20]}"
    if not stage.is_dir():
        tmp = cache_root / f".{stage.name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for relative in files:
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(model_dir / relative, tmp / relative)
        try:
            tmp.rename(stage)
        except OSError:  # another process published the same content first
            shutil.rmtree(tmp, ignore_errors=True)
    return stage
