"""Loading the newest checkpoint back into a model and its optimizer: ``guard.restore()`` and the launcher.

The checkpoint is the job's own newest (a restarted job finds its own checkpoints in its checkpoint
directory), else the ``resume`` input channel's, where the workflow puts the one a relaunch resumes
from (stabilizer_contract.checkpoints names them). The optimizer's state (momentum, the guard's step count)
comes back; its hyperparameters (learning rate, ...) stay as the script set them, since a relaunch's
remedy changes them. A checkpoint that does not fit the model (another architecture: missing or
unexpected keys, other shapes) or the optimizer is reported in one line and left alone.

This module must not decide when to load: the guard and the launcher do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from stabilizer_contract.checkpoints import newest_checkpoint
from stabilizer_sentinel.job_config import JobPaths
from stabilizer_sentinel.say import say


def read_newest(paths: JobPaths) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint and its content; None when there is none or it cannot be read (said in one line)."""
    source = newest_checkpoint(paths.checkpoint_dir) or newest_checkpoint(paths.resume_dir)
    if source is None:
        return None
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a checkpoint this library can read: the loop's own business
        say(f"sentinel: cannot read checkpoint {source} ({exc!r}); starting from step 0")
        return None
    return source, state


def misfit(state: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> str | None:
    """Why a loaded checkpoint cannot go into ``model`` and ``optimizer``; None when it fits."""
    if not isinstance(state, dict) or not {"model", "optimizer", "next_step"} <= set(state):
        return "not a checkpoint with model, optimizer and next_step"
    saved, current = state["model"], model.state_dict()
    missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    if missing or unexpected:
        return f"missing keys {missing[:3]}, unexpected keys {unexpected[:3]}"
    for key, value in current.items():
        if isinstance(value, torch.Tensor) and getattr(saved[key], "shape", None) != value.shape:
            return f"{key} has shape {tuple(saved[key].shape)}, the model {tuple(value.shape)}"
    if optimizer is not None:
        groups = [len(group["params"]) for group in state["optimizer"].get("param_groups", [])]
        if groups != [len(group["params"]) for group in optimizer.param_groups]:
            return f"optimizer parameter groups of sizes {groups}, the optimizer's differ"
    return None


def load_optimizer(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """The checkpoint's optimizer state, under the hyperparameters the script set (a remedy comes in through them)."""
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state["optimizer"])
    for group, setting in zip(optimizer.param_groups, settings, strict=True):
        group.update(setting)


def restore(paths: JobPaths, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[Path, int] | None:
    """Load the newest fitting checkpoint into ``model`` and ``optimizer``: (its path, the next step), or None."""
    found = read_newest(paths)
    if found is None:
        return None
    source, state = found
    reason = misfit(state, model, optimizer)
    if reason is not None:
        say(f"sentinel: checkpoint {source} does not fit this model ({reason}); starting from step 0")
        return None
    model.load_state_dict(state["model"])
    if optimizer is not None:
        load_optimizer(state, optimizer)
    next_step = int(state["next_step"])
    say(f"sentinel: resumed from {source} at step {next_step}")
    return source, next_step


def started_from(source: Path, paths: JobPaths) -> str:
    """How the summary names the state a run loaded: a checkpoint by its file name, anything else by its path."""
    return source.name if source.parent in (paths.checkpoint_dir, paths.resume_dir) else str(source)
