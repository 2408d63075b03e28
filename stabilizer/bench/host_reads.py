"""Host reads per training step: where the watcher waits for the device (a benchmark, not a test).

    python -m stabilizer.bench.host_reads                 # 40 steps, each integration level
    python -m stabilizer.bench.host_reads --steps 100

On an accelerator, every value the host reads from a tensor (``item()``, ``tolist()``, ``float()``,
``bool()``, a copy to CPU memory) waits for the work queued before it: a host synchronisation,
which stalls the queue the training loop keeps ahead of the device. This machine has no GPU, so the
synchronisations are counted where they would happen: each read of a tensor the watcher makes
(``HostReads``, a ``TorchFunctionMode`` that counts the calls whose caller is watcher code), step by
step, in a small classifier's loop watched as a job watches it (in-job recovery, so the rewind's copy
of the state every 5 steps is taken). Counted, not timed: on the CPU a read costs nothing, and the
count is what carries over to a GPU, where ``torch.cuda.set_sync_debug_mode`` measures the same points.

The one read every step is the finite check's: the loss and the gradient norm, read together before
the optimizer step, because a non-finite step must be stopped before it reaches the weights and no
optimizer but a fused one takes a flag from the device. This module measures and prints; it must
not be imported by the training code.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import stabilizer_sentinel
from stabilizer_sentinel.integration.script_watch import REWIND_EVERY

PACKAGE = str(Path(stabilizer_sentinel.__file__).parent)
# Tensor methods that hand a value (or a copy) to the host: on an accelerator each waits for the device.
READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__,
         torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}


def _to_host(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if func is not torch.Tensor.to:
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(str(target) == "cpu" for target in targets if isinstance(target, str | torch.device))


class HostReads(TorchFunctionMode):
    """Counts reads of tensors to the host made by watcher code, by step (``step``) and by source line."""

    def __init__(self) -> None:
        super().__init__()
        self.step = -1
        self.by_step: collections.Counter[int] = collections.Counter()
        self.by_line: collections.Counter[str] = collections.Counter()
        self.steps_of: dict[str, set[int]] = collections.defaultdict(set)  # source line -> steps it read at

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or _to_host(func, args, kwargs):
            caller = traceback.extract_stack(limit=2)[0]  # the frame that called the tensor method
            if caller.filename.startswith(PACKAGE):
                where = f"{caller.filename[len(PACKAGE) + 1:]}:{caller.lineno} {caller.name}"
                self.by_step[self.step] += 1
                self.by_line[where] += 1
                self.steps_of[where].add(self.step)
        return func(*args, **kwargs)


def _data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    return [(x[(i * 32) % 1760:(i * 32) % 1760 + 32], y[(i * 32) % 1760:(i * 32) % 1760 + 32]) for i in range(steps)]


def library_loop(steps: int, workdir: Path) -> HostReads:
    """A plain loop with ``watch()`` (the library level): in-job recovery, the rewind's copies every 5 steps."""
    from stabilizer_sentinel.integration.script_watch import watch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    environ = {"STABILIZER_HYPERPARAMETERS_FILE": str(workdir / "absent.json"),
               "STABILIZER_CHECKPOINT_DIR": str(workdir), "STABILIZER_CONFIG": '{"recovery": "in_job"}'}
    guard = watch(model, optimizer, environ=environ)
    reads = HostReads()
    with reads:
        for step, (inputs, labels) in enumerate(_data(steps)):
            reads.step = step
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            guard.step(loss)
            optimizer.step()
    guard.close()
    return reads


def report(reads: HostReads, steps: int) -> list[str]:
    """Lines: how many steps read once, and each source line's reads and the steps they fell on."""
    once = sum(1 for step in range(steps) if reads.by_step[step] == 1)
    lines = [f"{steps} steps, {sum(reads.by_step.values())} reads: {once} steps read exactly once, the most at "
             f"one step {max(reads.by_step[step] for step in range(steps))}"]
    for where, count in reads.by_line.most_common():
        on = len(reads.steps_of[where])
        lines.append(f"  {count:5d} reads on {on:3d} steps ({count / on:.1f} a step)  {where}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench.host_reads", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        reads = library_loop(args.steps, Path(workdir))
    print(f"library: watch(), in-job recovery (the rewind's copy every {REWIND_EVERY} steps)")
    print("\n".join(report(reads, args.steps)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
