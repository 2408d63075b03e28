"""The one home of the checkpoint file name: ``checkpoint-<step, eight digits>.pt``.

Everything that writes a checkpoint (the training script's periodic ones, the rewind snapshot
the sentinel persists when a rule fires) names it with ``checkpoint_name``; everything in the job
that looks for one uses ``newest_checkpoint``. The workflow reads the step back from the object
keys it listed in S3 with ``checkpoint_step`` and never rebuilds a name: it resumes from the key
it found (docs/contracts.md, section 1).

The step is zero-padded so that names sort by step as text, in a directory listing and in an S3
listing alike. This module must not import torch: it only names files.
"""

from __future__ import annotations

import re
from pathlib import Path

PATTERN = "checkpoint-*.pt"
# At most an int64's digits: a name with more is not a checkpoint (the workflow keeps the key it resumes
# from in its state, whose size it bounds).
STEP_DIGITS = 19
_NAME = re.compile(rf"^checkpoint-([0-9]{{1,{STEP_DIGITS}}})\.pt$")  # ASCII digits: one byte each


def checkpoint_name(next_step: int) -> str:
    """The file name of a checkpoint from which training goes on at ``next_step``."""
    if next_step < 0:
        raise ValueError(f"next_step must be >= 0, got {next_step}")
    return f"checkpoint-{next_step:08d}.pt"


def checkpoint_step(name: str | None) -> int | None:
    """The step in a checkpoint file name (or S3 key or URI), None when it is not one."""
    match = _NAME.match((name or "").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def checkpoints_in(directory: Path | None) -> list[Path]:
    """The checkpoints of a directory, oldest step first."""
    if directory is None or not directory.is_dir():
        return []
    found = [(checkpoint_step(path.name), path) for path in directory.glob(PATTERN)]
    return [path for step, path in sorted((s, p) for s, p in found if s is not None)]


def newest_checkpoint(directory: Path | None) -> Path | None:
    found = checkpoints_in(directory)
    return found[-1] if found else None
