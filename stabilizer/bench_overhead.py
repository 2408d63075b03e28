"""Overhead of tensor capture and the in-job sentinel on training throughput (a benchmark, not a test).

    python -m stabilizer.bench_overhead                   # ResNet-20, batch 128, offline digits
    python -m stabilizer.bench_overhead --steps 100 --depth 8   # quicker

Each configuration trains its own copy of the same network on the same offline data with the step
loop of model/train.py (the same hook points: ``capture.begin_step`` before the forward pass,
``sentinel.after_backward`` before the optimizer step). The configurations run interleaved in one
process, taking turns every ``--chunk`` steps, so machine load that drifts during the run hits all
of them alike; steps/s of each (median over rounds) is printed with its ratio to plain training (no
capture or sentinel calls at all). Writing the store, including the final flush, is timed;
evaluation and checkpoints are not. Tensors go to a temporary directory removed afterwards.

Targets: sentinel plus gradients every 100 steps >= 0.97x plain; all collections every 10 steps
>= 0.80x plain. This module measures and prints; it must not be imported by the training code.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stabilizer.parts import from_model, use_model

EXPLODING = [{"name": "ExplodingTensor"}]
# model/ is the training source directory: its modules are imported as the job imports them.
ALL_COLLECTIONS = from_model("rule_engine.capture").BUILTIN_COLLECTIONS

CONFIGS: dict[str, tuple[list, dict] | None] = {
    "plain": None,
    "sentinel only": (EXPLODING, {}),
    "sentinel + gradients/100": (EXPLODING, {"gradients": {"save_interval": 100}}),
    "sentinel + gradients/10": (EXPLODING, {"gradients": {"save_interval": 10}}),
    "sentinel + all collections/10": (EXPLODING, {name: {"save_interval": 10} for name in ALL_COLLECTIONS}),
}
TARGETS = {"sentinel + gradients/100": 0.97, "sentinel + all collections/10": 0.80}


class _Setup:
    """One configuration: its own network, optimizer, capture and sentinel, stepped on demand."""

    def __init__(self, name: str, config: tuple[list, dict] | None, args: argparse.Namespace, workdir: Path) -> None:
        import torch
        from resnet import ResNet
        from rule_engine.sentinel import build_monitoring

        torch.manual_seed(0)
        self.name = name
        self.model = ResNet(args.depth, 10, "elu", add_batch_norm=True)
        self.optimizer = torch.optim.SGD(self.model.parameter_groups(), lr=0.05, momentum=0.9)
        self.capture = self.sentinel = None
        if config is not None:
            rules, collections = config
            self.capture, self.sentinel = build_monitoring(
                self.model,
                sentinel_rules=rules,
                sentinel_action="notify",
                capture=collections,
                checkpoint_dir=workdir,
                tensor_dir=workdir / "tensors",
            )
        self.seconds = 0.0
        self.hook_seconds = 0.0
        self.steps = 0

    def train(self, steps: range, batches) -> None:
        import torch
        import torch.nn.functional as F  # noqa: N812

        started = time.perf_counter()
        for step in steps:
            inputs, labels = batches(step)
            hook_started = time.perf_counter()
            if self.capture is not None:
                self.capture.begin_step(step)
            hooks = time.perf_counter() - hook_started
            logits = self.model(inputs)
            loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads)
            hook_started = time.perf_counter()
            if self.sentinel is not None:
                self.sentinel.after_backward(
                    step,
                    epoch=0,
                    phase="main",
                    learning_rate=0.05,
                    loss=loss,
                    grad_norm=grad_norm,
                    inputs=inputs,
                    labels=labels,
                    outputs=logits,
                )
            self.hook_seconds += hooks + time.perf_counter() - hook_started
            self.optimizer.step()
        self.seconds += time.perf_counter() - started
        self.steps += len(steps)

    def close(self) -> None:
        started = time.perf_counter()
        if self.sentinel is not None:
            self.sentinel.close()  # flushes the writer thread: getting tensors to disk is counted
        self.seconds += time.perf_counter() - started
        self.hook_seconds += time.perf_counter() - started

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed training steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all configurations")
    parser.add_argument("--chunk", type=int, default=1, help="steps a configuration runs before the next takes over")
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth (6n+2)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    args = parser.parse_args(argv)
    use_model()
    import torch
    from data import digits_arrays

    if args.threads:
        torch.set_num_threads(args.threads)
    (x, y), _ = digits_arrays()
    data = (torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), torch.from_numpy(y))
    print(
        f"ResNet-{args.depth}, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads",
        flush=True,
    )
    count = len(x) // args.batch_size

    def batches(step: int):
        index = step % count
        return x_t[index * args.batch_size : (index + 1) * args.batch_size], y_t[
            index * args.batch_size : (index + 1) * args.batch_size
        ]

    x_t, y_t = data
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    hook_ms: dict[str, list[float]] = {name: [] for name in CONFIGS}
    step_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for round_index in range(args.rounds):
            setups = [
                _Setup(name, config, args, Path(tmp) / f"r{round_index}-{i}")
                for i, (name, config) in enumerate(CONFIGS.items())
            ]
            for setup in setups:
                setup.train(range(-3, 0), batches)  # warm-up steps, not timed below
                setup.seconds, setup.hook_seconds, setup.steps = 0.0, 0.0, 0
            # Configurations take turns every `chunk` steps, in a new random order each turn, so
            # load that drifts during the run, and whatever one configuration leaves behind (its
            # writer thread, garbage), falls on all of them alike.
            shuffler = random.Random(round_index)
            for first in range(0, args.steps, args.chunk):
                steps = range(first, min(first + args.chunk, args.steps))
                for setup in shuffler.sample(setups, len(setups)):
                    setup.train(steps, batches)
            for setup in setups:
                setup.close()
                rates[setup.name].append(setup.rate)
                hook_ms[setup.name].append(setup.hook_seconds / setup.steps * 1000)
                if setup.name == "plain":
                    step_ms.append(setup.seconds / setup.steps * 1000)
                print(
                    f"  round {round_index + 1} {setup.name:32s} {setup.rate:.3f} steps/s, "
                    f"{hook_ms[setup.name][-1]:.3f} ms/step in capture and sentinel",
                    flush=True,
                )
    plain = statistics.median(rates["plain"])
    plain_ms = statistics.median(step_ms)
    # Two views: end-to-end throughput (exposed to machine load) and the time spent inside the
    # hooks themselves, as the ratio plain step / (plain step + hook time).
    print(f"\n{'configuration':32s} {'steps/s':>8s} {'ratio':>7s} {'hook ms/step':>13s} {'hook ratio':>11s}  target")
    for name, values in rates.items():
        median = statistics.median(values)
        hooks = statistics.median(hook_ms[name])
        hook_ratio = plain_ms / (plain_ms + hooks)
        target = TARGETS.get(name)
        verdict = "" if target is None else f">= {target:.2f}x {'met' if median / plain >= target else 'MISSED'}"
        print(f"{name:32s} {median:8.3f} {median / plain:6.3f}x {hooks:13.3f} {hook_ratio:10.4f}x  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
