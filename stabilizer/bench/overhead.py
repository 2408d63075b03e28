"""Overhead of tensor capture and the in-job sentinel on training throughput (a benchmark, not a test).

    python -m stabilizer.bench.overhead                   # ResNet-20, batch 128, offline digits
    python -m stabilizer.bench.overhead --steps 100 --depth 8   # quicker

Each configuration trains its own copy of the same network on the same offline data with the step
loop of model/train.py (the same hook points: ``capture.begin_step`` before the forward pass,
``sentinel.after_backward`` before the optimizer step). The configurations run interleaved in one
process, taking turns every ``--chunk`` steps, so machine load that drifts during the run hits all
of them alike; steps/s of each (median over rounds) is printed with its ratio to plain training (no
capture or sentinel calls at all). Writing the store, including the final flush, is timed;
evaluation and checkpoints are not. Tensors go to a temporary directory removed afterwards.

Two configurations measure the sentinel library as users meet it: ``library: watch()`` is the
plain-loop level with its defaults, the rewind's copy every 5 steps included (``guard.step(loss)``
each step, everything else in the optimizer hooks), and
``launcher: unchanged script`` is the unchanged-script level (``stabilizer_sentinel.integration.launcher_hooks``'
global hooks find the model, its ``nn.CrossEntropyLoss`` module and the optimizer; the loop makes no call of ours).
Both run the finite check (``ExplodingTensor``) every step; their hook time is inside the step, so
only their steps/s ratio is shown. The launcher's global optimizer hook sees every configuration's
steps (it returns at once for optimizers it does not watch).
The system profiler samples on its own thread whatever configuration is stepping, so its cost
cannot be told apart by interleaving; its configurations report the CPU time its sampling thread
used (user + system, ``time.thread_time``) per training step of the whole round, as hook time,
and the profiler's own cost per sample.

Targets: sentinel plus gradients every 100 steps >= 0.97x plain; all collections every 10 steps
>= 0.80x plain. The rewind (model/stabilizer_sentinel/recovery/rewind.py: a CPU copy of weights and optimizer state
every 5 steps, two kept) is measured beside them: its time per copy and the memory it holds.
This module measures and prints; it must not be imported by the training code.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stabilizer.local.reference_source import reference_module
from stabilizer_sentinel.capture.capture import BUILTIN_COLLECTIONS

EXPLODING = [{"name": "ExplodingTensor"}]
ALL_COLLECTIONS = BUILTIN_COLLECTIONS

LIBRARY = "library: watch()"
LAUNCHER = "launcher: unchanged script"
# name -> (rules, capture, profiler interval in ms or 0), or None for plain training.
CONFIGS: dict[str, tuple[list, dict, int] | None] = {
    "plain": None,
    LIBRARY: (EXPLODING, {}, 0),
    LAUNCHER: (EXPLODING, {}, 0),
    "sentinel only": (EXPLODING, {}, 0),
    "sentinel + gradients/100": (EXPLODING, {"gradients": {"save_interval": 100}}, 0),
    "sentinel + gradients/10": (EXPLODING, {"gradients": {"save_interval": 10}}, 0),
    "sentinel + all collections/10": (EXPLODING, {name: {"save_interval": 10} for name in ALL_COLLECTIONS}, 0),
    "sentinel + profiler/500ms": (EXPLODING, {}, 500),
    "sentinel + profiler/100ms": (EXPLODING, {}, 100),
    "sentinel + rewind/5": (EXPLODING, {}, 0),
}
REWIND_EVERY = {"sentinel + rewind/5": 5}
TARGETS = {"sentinel + gradients/100": 0.97, "sentinel + all collections/10": 0.80}


class _Setup:
    """One configuration: its own network, optimizer, capture and sentinel, stepped on demand."""

    def __init__(
        self, name: str, config: tuple[list, dict, int] | None, args: argparse.Namespace, workdir: Path
    ) -> None:
        import torch

        from stabilizer_sentinel.detection.sentinel import build_monitoring

        ResNet = reference_module("resnet").ResNet  # noqa: N806 the class, as the job imports it

        torch.manual_seed(0)
        self.name = name
        self.model = ResNet(args.depth, 10, "elu", add_batch_norm=True)
        self.optimizer = torch.optim.SGD(self.model.parameter_groups(), lr=0.05, momentum=0.9)
        self.capture = self.sentinel = self.guard = self.launcher = self.rewind = None
        self.criterion = torch.nn.CrossEntropyLoss()
        if name == LIBRARY:
            from stabilizer_sentinel.integration.script_watch import watch

            self.guard = watch(self.model, self.optimizer, rules=config[0], capture=config[1], action="notify",
                               environ={"STABILIZER_HYPERPARAMETERS_FILE": str(workdir / "absent.json"),
                                        "STABILIZER_CHECKPOINT_DIR": str(workdir)})
        elif name == LAUNCHER:
            from stabilizer_sentinel.integration.launcher_hooks import LauncherHooks
            from stabilizer_sentinel.job_config import JobPaths, StabilizerConfig

            self.launcher = LauncherHooks(StabilizerConfig(rules=config[0], capture=config[1], action="notify"),
                                          JobPaths(workdir, workdir / "failure", workdir / "tensors"))
        elif config is not None:
            rules, collections, profiler_ms = config
            self.capture, self.sentinel = build_monitoring(
                self.model,
                sentinel_rules=rules,
                sentinel_action="notify",
                capture=collections,
                checkpoint_dir=workdir,
                tensor_dir=workdir / "tensors",
                profiler_interval_ms=profiler_ms,
            )
        if name in REWIND_EVERY:
            from stabilizer_sentinel.recovery.rewind import Rewind

            self.rewind = Rewind(self.model, self.optimizer, checkpoint_dir=workdir, every=REWIND_EVERY[name])
            self.sentinel.rewind = self.rewind
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
            loss = self.criterion(logits, labels) if self.launcher is not None else F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.guard is not None:
                self.guard.step(loss)
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
            if self.rewind is not None:
                hook_started = time.perf_counter()
                self.rewind.after_step(step + 1)
                self.hook_seconds += time.perf_counter() - hook_started
        self.seconds += time.perf_counter() - started
        self.steps += len(steps)

    def close(self) -> None:
        started = time.perf_counter()
        if self.sentinel is not None:
            self.sentinel.close()  # flushes the writer thread: getting tensors to disk is counted
        if self.guard is not None:
            self.guard.close()
        if self.launcher is not None:
            self.launcher.close()
        self.seconds += time.perf_counter() - started
        self.hook_seconds += time.perf_counter() - started

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench.overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed training steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all configurations")
    parser.add_argument("--chunk", type=int, default=1, help="steps a configuration runs before the next takes over")
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth (6n+2)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    parser.add_argument("--configs", default="", help="comma-separated configurations to run beside plain "
                        f"(default all): {', '.join(name for name in CONFIGS if name != 'plain')}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    chosen = {"plain", *(name.strip() for name in args.configs.split(",") if name.strip())} if args.configs else None
    unknown = (chosen or set()) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}")
    configs = {name: config for name, config in CONFIGS.items() if chosen is None or name in chosen}
    import torch

    digits_arrays = reference_module("data").digits_arrays

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
    rates: dict[str, list[float]] = {name: [] for name in configs}
    hook_ms: dict[str, list[float]] = {name: [] for name in configs}
    step_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for round_index in range(args.rounds):
            setups = [
                _Setup(name, config, args, Path(tmp) / f"r{round_index}-{i}")
                for i, (name, config) in enumerate(configs.items())
            ]
            # The launcher attaches to the first optimizer that steps: its own warm-up goes first.
            for setup in sorted(setups, key=lambda s: s.launcher is None):
                setup.train(range(-3, 0), batches)  # warm-up steps, not timed below
                setup.seconds, setup.hook_seconds, setup.steps = 0.0, 0.0, 0
                if setup.rewind is not None:
                    setup.rewind.seconds, setup.rewind.copies = 0.0, 0
            # Configurations take turns every `chunk` steps, in a new random order each turn, so
            # load that drifts during the run, and whatever one configuration leaves behind (its
            # writer thread, garbage), falls on all of them alike.
            shuffler = random.Random(round_index)
            for first in range(0, args.steps, args.chunk):
                steps = range(first, min(first + args.chunk, args.steps))
                for setup in shuffler.sample(setups, len(setups)):
                    setup.train(steps, batches)
            round_steps = sum(setup.steps for setup in setups)
            for setup in setups:
                setup.close()
                rates[setup.name].append(setup.rate)
                profiler = setup.sentinel.profiler if setup.sentinel is not None else None
                if profiler is not None:
                    # The sampling thread ran through every configuration's steps.
                    setup.hook_seconds += profiler.busy_seconds * setup.steps / round_steps
                    print(f"  round {round_index + 1} {setup.name}: {profiler.samples_taken} samples, "
                          f"{profiler.busy_seconds / max(profiler.samples_taken, 1) * 1000:.3f} ms CPU per sample",
                          flush=True)
                hook_ms[setup.name].append(setup.hook_seconds / setup.steps * 1000)
                if setup.name == "plain":
                    step_ms.append(setup.seconds / setup.steps * 1000)
                inside = setup.name in (LIBRARY, LAUNCHER)
                print(
                    f"  round {round_index + 1} {setup.name:32s} {setup.rate:.3f} steps/s"
                    + ("" if inside else f", {hook_ms[setup.name][-1]:.3f} ms/step in capture and sentinel"),
                    flush=True,
                )
    _print_table(rates, hook_ms, statistics.median(step_ms))
    _print_rewind_cost(setups)
    return 0


def _print_table(rates: dict[str, list[float]], hook_ms: dict[str, list[float]], plain_ms: float) -> None:
    plain = statistics.median(rates["plain"])
    # Two views: end-to-end throughput (exposed to machine load) and the time spent inside the
    # hooks themselves, as the ratio plain step / (plain step + hook time).
    print(f"\n{'configuration':32s} {'steps/s':>8s} {'ratio':>7s} {'hook ms/step':>13s} {'hook ratio':>11s}  target")
    for name, values in rates.items():
        median = statistics.median(values)
        hooks = statistics.median(hook_ms[name])
        hook_ratio = plain_ms / (plain_ms + hooks)
        target = TARGETS.get(name)
        verdict = "" if target is None else f">= {target:.2f}x {'met' if median / plain >= target else 'MISSED'}"
        if name in (LIBRARY, LAUNCHER):  # their hooks run inside the step: only the throughput ratio says anything
            print(f"{name:32s} {median:8.3f} {median / plain:6.3f}x {'in the step':>13s} {'-':>11s}  {verdict}")
            continue
        print(f"{name:32s} {median:8.3f} {median / plain:6.3f}x {hooks:13.3f} {hook_ratio:10.4f}x  {verdict}")


def _print_rewind_cost(setups: list[_Setup]) -> None:
    for setup in setups:
        rewind = setup.rewind
        if rewind is None or not rewind.snapshots:
            continue
        held = sum(snapshot.nbytes for snapshot in rewind.snapshots)
        print(
            f"{setup.name}: {rewind.seconds / max(rewind.copies, 1) * 1000:.2f} ms per copy "
            f"({rewind.copies} copies, last round), {held / 1024**2:.2f} MiB held "
            f"({len(rewind.snapshots)} copies of weights + optimizer state; "
            f"one is {rewind.snapshots[-1].nbytes / 1024**2:.2f} MiB)"
        )


if __name__ == "__main__":
    sys.exit(main())
