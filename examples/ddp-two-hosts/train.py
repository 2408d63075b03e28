"""Data-parallel training on two SageMaker instances of two processes each, protected by stabilizer.

    stabilizer run --local --input examples/ddp-two-hosts/input.json

The job asks SageMaker for ``instance_count: 2`` and ``distribution: torch_distributed``: the
container starts ``torchrun --nnodes 2 --nproc_per_node 2 ...`` on each host, so this script runs
as four ranks (two per host) of one process group. Locally the two hosts are two process groups on
this machine, meeting on loopback over gloo; on SageMaker they are two instances.

The script is a plain DDP loop with the library's lines, marked ``# stabilizer``: every rank
watches its own loss and the all-reduced gradients, and when a check fires on any rank of any host,
every rank stops at that same step (one 2-integer all-reduce per step agrees on it). Rank 0 writes
the findings and the checkpoints; on a relaunch every rank, on every host, resumes from the same one.

The first ``warmup_steps`` steps run at ``warmup_lr``; at ``lr`` 0.6 after them the regression
diverges within a few steps. The workflow lowers ``lr`` through the knob the input declares and
relaunches on two hosts, every rank resuming from the checkpoint the sentinel kept from the end of
the warm-up.
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import stabilizer_sentinel as sentinel  # stabilizer


def batch(step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of step ``step``: the same on every run, so a relaunch sees the same data."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 8, generator=generator)
    return x, x @ torch.linspace(-1.0, 1.0, 8).unsqueeze(1) + 0.1 * torch.randn(size, 1, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.6)
    parser.add_argument("--warmup_lr", type=float, default=0.05)
    parser.add_argument("--warmup_steps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    host = os.environ.get("SM_CURRENT_HOST", "algo-1")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, args.width), nn.Tanh(), nn.Linear(args.width, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    guard = sentinel.watch(model, optimizer)  # stabilizer
    start = guard.restore()  # stabilizer
    print(f"rank={rank} host={host} world={world} start={start}", flush=True)
    for step in range(start, args.steps):
        phase = "warmup" if step < args.warmup_steps else "main"
        for group in optimizer.param_groups:
            group["lr"] = args.warmup_lr if phase == "warmup" else args.lr
        x, y = batch(step, rank, args.batch)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        guard.step(loss, phase=phase)  # stabilizer
        optimizer.step()
        if rank == 0 and step % 5 == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
    print(f"rank={rank} host={host} done", flush=True)
    dist.barrier()  # leave together (a gloo rank that tears down early can abort the others at exit)
    gc.collect()  # free the run's collectives now, not at the interpreter's exit (see docs/library.md, DDP)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
