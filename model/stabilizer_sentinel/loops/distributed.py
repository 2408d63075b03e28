"""DDP for the guard: this process's rank, and agreeing on a stop so that all ranks leave at one step.

One 2-integer all-reduce per step tells every rank whether any rank found something or must stop;
the findings themselves are gathered only at a step where one fired. This module must not decide
anything about a finding.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def rank_and_size() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else torchrun's environment."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def agree(guard: Any, verdict: Any, stop: bool) -> bool:
    """Whether any rank must stop; rank 0 adopts the findings of the others (gathered only when one fired)."""
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flags = torch.tensor([int(bool(verdict.findings)), int(stop)], dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    found, stop_any = (bool(v) for v in flags.tolist())
    if found:
        gathered: list[Any] = [None] * guard.world_size
        dist.all_gather_object(gathered, [dict(entry, rank=guard.rank) for entry in verdict.findings])
        others = [entry for rank, entries in enumerate(gathered) if rank != guard.rank for entry in entries]
        everyone = [entry for entries in gathered for entry in entries]
        if guard.primary:
            if guard.rewind is not None and others:  # another rank's finding: keep the state before it
                guard.rewind.persist(before_step=min(entry["step"] for entry in others))
            guard.sentinel.adopt(others)
        elif guard.sentinel.stop_finding is None and everyone and guard.sentinel.action == "stop":
            guard.sentinel.stop_finding = everyone[0]
    return stop_any
