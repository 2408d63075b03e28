"""The offline data set of local mode: scikit-learn's digits as train/test channels, prepared once.

``model/data.py`` is the single definition of the channels; this module only runs it (as a
separate process, the way a job would) when the channels are not there yet.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class DataPreparationError(Exception):
    """The offline channels could not be written; the message says why."""


def channels_present(directory: Path) -> bool:
    return all((Path(directory) / c / n).is_file() for c in ("train", "test") for n in ("x.npy", "y.npy"))


def run_data_script(model_dir: Path, arguments: list[str]) -> subprocess.CompletedProcess:
    """``python data.py ARGUMENTS`` in the training source directory, as a job would run it."""
    return subprocess.run(
        [sys.executable, "data.py", *arguments], cwd=model_dir, capture_output=True, text=True, check=False
    )


def ensure_offline_digits(directory: Path, model_dir: Path) -> Path:
    """``directory`` holding train/ and test/ channels of the digits, written on first use."""
    directory = Path(directory).resolve()
    if channels_present(directory):
        return directory
    result = run_data_script(model_dir, ["digits", "--out", str(directory)])
    if result.returncode != 0 or not channels_present(directory):
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise DataPreparationError(f"could not prepare the offline digits in {directory}: {last}")
    return directory
