"""Train the reference ResNet under the SageMaker script-mode contract.

The same file runs in the SageMaker PyTorch container and as a local process. Everything it
reads and writes is listed in docs/contracts.md (section 1): hyperparameters as `--name value`
arguments (or `SM_HPS`), channels from `SM_CHANNEL_TRAIN` / `SM_CHANNEL_TEST`, the model to
`SM_MODEL_DIR`, checkpoints to the checkpoint directory, a one-line reason to the failure file.

    python data.py digits --out /tmp/digits
    SM_CHANNEL_TRAIN=/tmp/digits/train SM_CHANNEL_TEST=/tmp/digits/test SM_MODEL_DIR=/tmp/m \\
      STABILIZER_CHECKPOINT_DIR=/tmp/ckpt STABILIZER_FAILURE_FILE=/tmp/failure \\
      python train.py --num_epochs 3 --add_batch_norm 1
    python train.py --dry-run          # a few steps on tiny data, for tests
    python train.py --help             # every hyperparameter, with its default (recipe.py)

It is an ordinary user of the sentinel library (``stabilizer_sentinel``, the plain-loop level): the three
lines marked ``# sentinel`` below, plus two optional calls a plain loop may leave out (the test
loss for the ``Overfit`` rule, and closing with the job's status). The library reads its
configuration from the job's ``sagemaker_stabilizer`` hyperparameter (the workflow sends it there
alone); the ``--sentinel_rules``, ``--capture`` and ``--sentinel_action`` flags, for running this file
directly, apply where that configuration leaves a field unset.

It must not decide what to do about a failing run: it reports (log lines, findings, exit status)
and the workflow decides.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

import stabilizer_sentinel as sentinel  # sentinel
from data import read_channel
from recipe import Config, HyperparameterError, parse_config
from resnet import ResNet

# docs/contracts.md: the sentinel stopped the job because a rule fired
SENTINEL_STOP_EXIT_CODE = sentinel.EXIT_RULE_STOP
CHECKPOINTS_KEPT = 2


@dataclass
class Paths:
    train: Path | None
    test: Path | None
    resume: Path | None
    model_dir: Path
    checkpoint_dir: Path
    failure_file: Path
    tensor_dir: Path

    @classmethod
    def from_env(cls, environ: dict | None = None) -> Paths:
        env = os.environ if environ is None else environ

        def optional(name: str, default: str | None) -> Path | None:
            value = env.get(name, default)
            return Path(value) if value else None

        checkpoint_dir = Path(env.get("STABILIZER_CHECKPOINT_DIR", "/opt/ml/checkpoints"))
        return cls(
            train=optional("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"),
            test=optional("SM_CHANNEL_TEST", "/opt/ml/input/data/test"),
            resume=optional("SM_CHANNEL_RESUME", None),
            model_dir=Path(env.get("SM_MODEL_DIR", "/opt/ml/model")),
            checkpoint_dir=checkpoint_dir,
            failure_file=Path(env.get("STABILIZER_FAILURE_FILE", "/opt/ml/output/failure")),
            tensor_dir=Path(env.get("STABILIZER_TENSOR_DIR") or checkpoint_dir / "tensors"),
        )


def log(message: str) -> None:
    print(message, flush=True)


def load_data(paths: Paths, dry_run: bool) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    if dry_run and not (paths.train and (paths.train / "x.npy").exists()):
        rng = np.random.default_rng(0)  # no channel given: tiny random data is enough to exercise the loop
        x, y = rng.random((48, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, 48)
        return (x[:32], y[:32]), (x[32:], y[32:])
    train = read_channel(paths.train)
    test = read_channel(paths.test) if paths.test and paths.test.exists() else (train[0][:0], train[1][:0])
    if dry_run:
        return (train[0][:32], train[1][:32]), (test[0][:16], test[1][:16])
    return train, test


def to_tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))  # NHWC -> NCHW


def save_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    next_step: int, config: Config) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / sentinel.checkpoint_name(next_step)
    partial = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": next_step,
                "config": dataclasses.asdict(config)}, partial)
    partial.rename(path)  # a reader (or S3 sync) never sees half a checkpoint
    for old in sentinel.checkpoints_in(directory)[:-CHECKPOINTS_KEPT]:
        old.unlink()
    return path


ARCHITECTURE_KEYS = ("depth", "activation", "add_batch_norm")


def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer, paths: Paths, config: Config) -> int:
    """Resume from our own newest checkpoint, else from the resume channel; returns the next step."""
    own = sentinel.newest_checkpoint(paths.checkpoint_dir)
    source = own or sentinel.newest_checkpoint(paths.resume)
    if source is None:
        return 0
    state = torch.load(source, map_location="cpu", weights_only=True)
    saved = state["config"]
    if own is None and any(saved.get(k) != getattr(config, k) for k in ARCHITECTURE_KEYS):
        log(f"resume checkpoint {source} has another architecture; starting from scratch")
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log(f"resumed from {source} at step {state['next_step']}")
    return int(state["next_step"])


class StopRequested:
    """Set by SIGTERM, which is how SageMaker stops a job; the loop checkpoints and exits 0."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True


def evaluate(model: ResNet, x_train: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
             batch_size: int, predictions: list[torch.Tensor] | None = None) -> tuple[float, float]:
    if len(x) == 0:
        return math.nan, math.nan
    model.recalibrate_batch_norm(x_train, batch_size)
    model.eval()
    total_loss, correct = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            labels = y[start:start + batch_size].to(device)
            logits = model(x[start:start + batch_size].to(device))
            total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
            if predictions is not None:  # for rules judging held-out predictions (Confusion, ClassImbalance)
                predictions.append(logits.argmax(1).cpu())
    model.train()
    return total_loss / len(x), correct / len(x)


def train(config: Config, paths: Paths, dry_run: bool = False) -> dict:
    torch.manual_seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (x_train, y_train), (x_test, y_test) = load_data(paths, dry_run)
    num_classes = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    num_classes = max(num_classes, 10)
    xt, yt = to_tensor(x_train), torch.from_numpy(y_train)
    xv, yv = to_tensor(x_test), torch.from_numpy(y_test)

    model = ResNet(config.depth, num_classes, config.activation, config.add_batch_norm, in_channels=xt.shape[1])
    model.to(device)
    optimizer = torch.optim.SGD(model.parameter_groups(), lr=config.warmup_learning_rate, momentum=0.9)
    steps_per_epoch = math.ceil(len(xt) / config.batch_size)
    total_steps = steps_per_epoch * config.num_epochs
    if dry_run:
        total_steps = min(total_steps, 3)
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    # The job's sagemaker_stabilizer configuration wins; the legacy hyperparameters fill what it leaves unset.
    guard = sentinel.watch(model, optimizer, rules=config.sentinel_rules, capture=config.capture,  # sentinel
                           action=config.sentinel_action)
    # After watch(): the guard's hook reads its step count and learning check back from the optimizer's state.
    step = restore(model, optimizer, paths, config)
    # This script loads the newest checkpoint itself (restore() above, with its architecture check), so
    # a relaunch of it resumes: the summary says so, and the workflow's "resumes from X" is then true.
    # The guard copies the last healthy state every few steps and writes it as a checkpoint when a
    # rule fires; the config goes with it, as in every checkpoint restore() reads.
    guard.restores_checkpoints(extra={"config": dataclasses.asdict(config)})
    stop = StopRequested()
    log(f"training steps={total_steps} steps_per_epoch={steps_per_epoch} examples={len(xt)} start_step={step} "
        f"device={device.type}")

    started = time.monotonic()
    loss = grad_norm = torch.tensor(0.0)
    checkpointed_at = step
    order_epoch, order = -1, None
    while step < total_steps and not stop.requested:
        epoch, index = divmod(step, steps_per_epoch)
        if epoch != order_epoch:
            # The order of an epoch depends only on (seed, epoch), so a resumed run sees the same batches.
            generator = torch.Generator().manual_seed(config.seed * 100_003 + epoch)
            order_epoch, order = epoch, torch.randperm(len(xt), generator=generator)
            lr = config.learning_rate_at(epoch)
            for group in optimizer.param_groups:
                group["lr"] = lr
        batch = order[index * config.batch_size:(index + 1) * config.batch_size]
        inputs, labels = xt[batch].to(device, non_blocking=True), yt[batch].to(device, non_blocking=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # The sentinel checks in optimizer.step()'s pre-hook, so a step it stops never reaches the weights.
        guard.step(loss, labels=labels, epoch=epoch, phase=config.phase_at(epoch))  # sentinel
        # One fused reduction over all gradients, for the log line and the checkpoint guard.
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        if config.grad_clip > 0:
            # Clipping scales every gradient by max_norm / norm; a non-finite norm would make every
            # layer NaN, so it leaves them as they are and the sentinel still sees which layer broke.
            usable_norm = torch.nan_to_num(grad_norm, nan=0.0, posinf=0.0)
            torch.nn.utils.clip_grads_with_norm_(model.parameters(), config.grad_clip, usable_norm)
        optimizer.step()
        step += 1
        if step % config.log_every == 0 or step == total_steps:
            log(f"step={step - 1} epoch={epoch} loss={loss.item():.6g} lr={lr:g} grad_norm={grad_norm.item():.6g}")
        if step % config.checkpoint_every == 0 or step == total_steps:
            checkpointed_at = _checkpoint_if_finite(model, optimizer, step, config, paths, loss, grad_norm,
                                                    checkpointed_at)
        if step % steps_per_epoch == 0 or step == total_steps:
            # Held-out labels and predictions of the trained model (the last evaluation) for the rules
            # that judge them (Confusion, ClassImbalance); after the first epoch every model fails them.
            predicted: list[torch.Tensor] | None = [] if step == total_steps else None
            test_loss, accuracy = evaluate(model, xt, xv, yv, config.batch_size, predicted)
            log(f"eval epoch={epoch + 1} test_loss={test_loss:.6g} test_accuracy={accuracy:.4f}")
            if len(xv):
                # Overfit reads the loss; Confusion and ClassImbalance the held-out predictions of the last
                # evaluation. A stop exits here with status 86.
                guard.eval_loss(test_loss, labels=yv if predicted else None,
                                outputs=torch.cat(predicted) if predicted else None)

    if stop.requested:
        _checkpoint_if_finite(model, optimizer, step, config, paths, loss, grad_norm, checkpointed_at)
        guard.close(status="stopped")
        log(f"stopped by SIGTERM at step {step}; checkpoint in {paths.checkpoint_dir}")
        return {"stopped": True, "steps": step}

    guard.close(status="completed")
    test_loss, accuracy = evaluate(model, xt, xv, yv, config.batch_size)
    seconds = time.monotonic() - started
    metrics = {"steps": step, "seconds": round(seconds, 3), "final_loss": loss.item(),
               "test_loss": test_loss, "test_accuracy": accuracy}
    paths.model_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), paths.model_dir / "model.pt")
    (paths.model_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    (paths.model_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    log(f"finished steps={step} seconds={seconds:.1f} test_accuracy={accuracy:.4f}")
    return metrics


def _checkpoint_if_finite(model, optimizer, step, config, paths, loss, grad_norm, checkpointed_at) -> int:
    # A checkpoint of a diverged model is worse than none: the last healthy one stays the newest.
    if not (math.isfinite(loss.item()) and math.isfinite(grad_norm.item())):
        log(f"not checkpointing step {step}: loss or gradient norm is not finite")
        return checkpointed_at
    if step != checkpointed_at:
        save_checkpoint(paths.checkpoint_dir, model, optimizer, step, config)
    return step


def write_failure(path: Path, reason: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(" ".join(reason.split())[:1000] + "\n")  # one line, as SageMaker shows it


def main(argv: list[str] | None = None) -> int:
    paths = Paths.from_env()
    try:
        config, dry_run = parse_config(argv)
    except HyperparameterError as error:
        write_failure(paths.failure_file, f"HyperparameterError: {error}")
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    try:
        train(config, paths, dry_run)
    except Exception as error:
        write_failure(paths.failure_file, f"{type(error).__name__}: {error}")
        log(f"failed: {type(error).__name__}: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
