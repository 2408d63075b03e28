"""A small GPT trained the way people write it: the script the device benchmark runs, plain and watched.

    python stabilizer/bench/gpt_loop.py --steps 200                              # on CUDA where there is one
    python -m stabilizer_sentinel.launch stabilizer/bench/gpt_loop.py --steps 200   # watched, unchanged

It knows nothing of the watcher. A decoder-only transformer learns sequences drawn from a fixed random
table of successors (four per token: the loss falls from ln(vocab) towards ln 4), with AdamW, a
warm-up then cosine rate set by hand into every group each step, bf16 autocast (or fp16 with a loss
scaler, ``--amp fp16``) and gradient clipping. It logs its loss every ``--log-every`` steps, as
scripts do (each log is a read of the device, and so a synchronisation of its own), and prints one
JSON line last: the logged losses and the milliseconds per step over the steps after ``--warmup``
(the device drained before and after them).

With ``STABILIZER_BENCH_SYNCS`` set to a file, it counts the synchronisations of every step from the
first logged one on (``torch.cuda.set_sync_debug_mode("warn")``: each synchronising call warns), by who
made them: code of the watcher's package on the stack, or not. The count is the benchmark's
instrument (stabilizer.bench.device), not the script's; it is written to that file as JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import time
import traceback
import warnings

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

WATCHER = f"{os.sep}stabilizer_sentinel{os.sep}"


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, depth: int, heads: int, context: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batches(args: argparse.Namespace, device: torch.device) -> list[torch.Tensor]:
    """``--batches`` batches of token sequences (context + 1 long), each token one of its predecessor's four."""
    generator = torch.Generator().manual_seed(1)
    successors = torch.randint(args.vocab, (args.vocab, 4), generator=generator)
    out = []
    for _ in range(args.batches):
        rows = [torch.randint(args.vocab, (args.batch,), generator=generator)]
        for _ in range(args.context):
            rows.append(successors[rows[-1], torch.randint(4, (args.batch,), generator=generator)])
        out.append(torch.stack(rows, 1).to(device))
    return out


class Syncs:
    """Counts synchronising calls per step by maker (the watcher's code on the stack, or not)."""

    def __init__(self) -> None:
        self.step = -1
        self.by_step: dict[str, collections.Counter[int]] = {"watcher": collections.Counter(),
                                                              "script": collections.Counter()}
        self.lines: collections.Counter[str] = collections.Counter()

    def show(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        stack = traceback.extract_stack()[:-1]
        ours = [frame for frame in stack if WATCHER in frame.filename]
        self.by_step["watcher" if ours else "script"][self.step] += 1
        if ours:
            frame = ours[-1]
            self.lines[f"{frame.filename.split(WATCHER)[-1]}:{frame.lineno} {frame.name}"] += 1

    def report(self, first: int, last: int) -> dict:
        steps = range(first, last)
        watcher = [self.by_step["watcher"][step] for step in steps]
        return {"steps": len(steps), "watcher": sum(watcher), "script": sum(self.by_step["script"][s] for s in steps),
                "watcher_steps_with_none": sum(1 for count in watcher if count == 0),
                "watcher_most_at_a_step": max(watcher, default=0), "watcher_lines": dict(self.lines.most_common(12))}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20, help="steps before the timed ones")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=20, help="the rate's linear warm-up")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping; 0 for none")
    p.add_argument("--amp", choices=["bf16", "fp16", "none"], default="bf16")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=16, help="distinct batches, cycled")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def main() -> None:
    args = parser().parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.width, args.depth, args.heads, args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    data = batches(args, device)
    counting = os.environ.get("STABILIZER_BENCH_SYNCS")
    syncs = Syncs() if counting and device.type == "cuda" else None
    losses: dict[int, float] = {}
    started = None
    for step in range(args.steps):
        if step == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            if syncs is not None and device.type == "cuda":
                warnings.simplefilter("always")
                warnings.showwarning = syncs.show
                torch.cuda.set_sync_debug_mode("warn")
        if syncs is not None:
            syncs.step = step
        rate = args.lr * min(1.0, (step + 1) / args.warmup_steps)
        rate *= 0.55 + 0.45 * math.cos(math.pi * step / args.steps)
        for group in optimizer.param_groups:
            group["lr"] = rate
        tokens = data[step % len(data)]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if args.clip:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        scaler.step(optimizer)
        scaler.update()
        if step % args.log_every == 0 or step == args.steps - 1:
            losses[step] = loss.item()
            print(f"step {step}: loss {losses[step]:.4f}", flush=True)
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    timed = args.steps - args.warmup
    result = {"ms_per_step": (time.perf_counter() - started) * 1000 / timed if started and timed else None,
              "losses": losses, "device": str(device), "parameters": sum(p.numel() for p in model.parameters())}
    if syncs is not None:
        with open(counting, "w") as out:
            json.dump(syncs.report(args.warmup, args.steps), out)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
