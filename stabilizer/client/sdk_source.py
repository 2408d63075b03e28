"""An SDK job's source, packed as the SDK packs it: an estimator's ``source_dir``, ``entry_point`` and
``dependencies`` (``Framework._stage_user_code_in_s3``), or a ModelTrainer's ``source_code`` with its
``ignore_patterns``.

A source already in S3 (or a ModelTrainer's ``.tar.gz``) is taken as it is, and a local directory
that needs nothing added or left out is handed on as a directory; anything else becomes a
`sourcedir.tar.gz` under a content-hashed path (`pack_source`). What goes into an archive, and the
size limit, are stabilizer.source.sourcedir's; this module only says which files the SDK would send.
No AWS call: uploading is stabilizer.client.sdk_aws's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stabilizer.client.sdk_attributes import given, is_s3
from stabilizer.client.sdk_errors import SdkJobError
from stabilizer.source.sourcedir import ARCHIVE_NAME, Packed, SourceError, SourcePlan, pack, plan_source

# What the SDK's ModelTrainer leaves out of a source upload by default (SourceCode.ignore_patterns).
_MODEL_TRAINER_IGNORED = {".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints"}


def _plan(directory: Path | None, *, extra: Sequence[Path] = (), ignore_patterns: Sequence[str] = ()) -> SourcePlan:
    try:
        return plan_source(directory, extra=extra, ignore_patterns=ignore_patterns)
    except SourceError as error:
        raise SdkJobError(str(error)) from None


def _packed(plan: SourcePlan, shown_as: str) -> Packed:
    try:
        return pack(plan, shown_as=shown_as)
    except SourceError as error:
        raise SdkJobError(str(error)) from None


def pack_source(plan: SourcePlan, cache: Path | None = None, shown_as: str = "the source") -> str:
    """`sourcedir.tar.gz` of `plan` (stabilizer.source.sourcedir), written where the content's hash says.

    The same source packs to the same path (and, on AWS, the same key). The SDK's own
    ``create_tar_file`` is not used: it packs links, `.git`, virtual environments and earlier runs
    alike; what is left out, and the size limit, are `stabilizer.source.sourcedir`'s.
    """
    packed = _packed(plan, shown_as)
    home = (cache or Path(tempfile.gettempdir()) / "stabilizer-sources") / packed.digest[:16]
    home.mkdir(parents=True, exist_ok=True)
    target = home / ARCHIVE_NAME
    if not target.is_file():
        scratch = home / f".{ARCHIVE_NAME}.{os.getpid()}"
        scratch.write_bytes(packed.data)
        scratch.replace(target)
    return str(target)


def estimator_source(estimator: Any, rule_files: Sequence[Path] = ()) -> tuple[str, str]:
    """(source, entry point) the way `Framework._stage_user_code_in_s3` packs them; `rule_files`
    (a folder of custom rule files, stabilizer.client.debugger) go in beside the dependencies."""
    entry_point, source_dir = estimator.entry_point, estimator.source_dir
    dependencies = [*(getattr(estimator, "dependencies", None) or []), *rule_files]
    if not isinstance(entry_point, str) or not entry_point:
        raise SdkJobError("entry_point: the estimator has no entry point; stabilizer runs script-mode jobs")
    if is_s3(source_dir):
        if dependencies:
            raise SdkJobError("dependencies: cannot be added to a source_dir that is already in S3")
        return source_dir, entry_point
    if source_dir:
        directory = Path(source_dir).expanduser().resolve()
        if not (directory / entry_point).is_file():
            raise SdkJobError(f"entry_point: {entry_point!r} is not in source_dir {directory}")
        if not dependencies:
            return str(directory), entry_point  # local mode packs the directory, and so does the AWS upload
        # source_dir's entries and each dependency at the archive root (`tar_and_upload_dir`).
        extra = [Path(d).expanduser() for d in dependencies]
        return pack_source(_plan(directory, extra=extra), shown_as=str(directory)), entry_point
    script = Path(entry_point).expanduser().resolve()
    if not script.is_file():
        raise SdkJobError(f"entry_point: no such file {script}")
    # No source_dir: the SDK uploads the entry point alone (with any dependencies).
    extra = [script, *(Path(d).expanduser() for d in dependencies)]
    return pack_source(_plan(None, extra=extra), shown_as=str(script)), script.name


def trainer_source(trainer: Any) -> tuple[str, str]:
    code = trainer.source_code
    if not given(code):
        raise SdkJobError("source_code: the ModelTrainer has none; stabilizer runs a script of yours")
    if given(getattr(code, "command", None)):
        raise SdkJobError(
            "source_code.command: stabilizer runs an entry script (source_code.entry_script) through the "
            "container's training toolkit, not an arbitrary command"
        )
    entry, source_dir = getattr(code, "entry_script", None), getattr(code, "source_dir", None)
    if not given(entry) or not given(source_dir):
        raise SdkJobError("source_code: give both source_dir and entry_script")
    requirements = getattr(code, "requirements", None)
    if given(requirements) and requirements != "requirements.txt":
        raise SdkJobError(
            f"source_code.requirements: the training toolkit installs requirements.txt at the source root; "
            f"rename {requirements!r} to requirements.txt"
        )
    if is_s3(source_dir) or str(source_dir).endswith(".tar.gz"):
        return str(source_dir), entry
    directory = Path(source_dir).expanduser().resolve()
    # ModelTrainer copies source_dir with shutil.ignore_patterns(*ignore_patterns): each pattern
    # matched against every name at every depth, which is what a gitignore line without a "/" does.
    patterns = [str(p) for p in (getattr(code, "ignore_patterns", None) or _MODEL_TRAINER_IGNORED)]
    trimmed = _plan(directory, ignore_patterns=patterns)
    if [e.name for e in trimmed.files] == [e.name for e in _plan(directory).files]:
        return str(directory), entry  # the patterns leave nothing out: the directory as it is
    return pack_source(trimmed, shown_as=str(directory)), entry
