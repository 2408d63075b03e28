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
    python train.py --help             # every hyperparameter, with its default

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

import argparse
import dataclasses
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

import stabilizer_sentinel as sentinel  # sentinel
from data import read_channel
from resnet import ResNet
from stabilizer_contract.checkpoints import checkpoint_name, checkpoints_in, newest_checkpoint
from stabilizer_sentinel.capture import CaptureConfigError, parse_capture
from stabilizer_sentinel.job_config import StabilizerConfigError, load_config
from stabilizer_sentinel.rules import RuleConfigError, parse_rule_list
from stabilizer_sentinel.sentinel import EXIT_RULE_STOP

SENTINEL_STOP_EXIT_CODE = EXIT_RULE_STOP  # docs/contracts.md: the sentinel stopped the job because a rule fired
CHECKPOINTS_KEPT = 2


@dataclass
class Config:
    warmup_learning_rate: float = 0.1  # the reference recipe's warm-up LR (it explodes without batch norm)
    learning_rate: float = 0.1  # the reference recipe's LR after warm-up
    warmup_epochs: int = 1  # the reference recipe warms up for one epoch
    add_batch_norm: bool = False  # the reference network has no batch norm: that is the problem
    num_epochs: int = 3  # enough for the offline data set to reach a useful accuracy
    batch_size: int = 128  # as the reference recipe
    depth: int = 20  # ResNet-20: 3 stages of 3 blocks
    activation: str = "elu"  # the ELU-Conv-ELU-Conv block of the reference network
    grad_clip: float = 0.0  # max total gradient norm; 0 = off, as the reference recipe
    seed: int = 0  # fixes initialisation and data order, so runs and resumes are reproducible
    checkpoint_every: int = 50  # steps between checkpoints; cheap on small models, bounded loss on stop
    max_steps: int = 0  # 0 = no limit; used by tests and benchmarks to cut a run short
    log_every: int = 10  # steps between log lines; each line costs a host synchronisation
    sentinel_rules: list = field(default_factory=list)  # rules evaluated in-job (docs/contracts.md section 3)
    sentinel_action: str = "stop"  # what the sentinel does when a rule fires: stop or notify
    capture: dict = field(default_factory=dict)  # collections to save: name -> save_interval/save_steps

    def learning_rate_at(self, epoch: int) -> float:
        return self.warmup_learning_rate if epoch < self.warmup_epochs else self.learning_rate

    def phase_at(self, epoch: int) -> str:
        return "warmup" if epoch < self.warmup_epochs else "main"


HELP = {
    "warmup_learning_rate": "learning rate for the first warmup_epochs epochs",
    "learning_rate": "learning rate after warm-up",
    "warmup_epochs": "number of epochs at the warm-up learning rate",
    "add_batch_norm": "1 adds BatchNorm before each residual addition, 0 leaves it out",
    "num_epochs": "number of epochs to train",
    "batch_size": "mini-batch size",
    "depth": "ResNet depth, 6n+2 (20 = three stages of three blocks)",
    "activation": "activation in the residual blocks: elu or relu",
    "grad_clip": "clip the total gradient norm to this value; 0 turns clipping off",
    "seed": "random seed for initialisation and data order",
    "checkpoint_every": "steps between checkpoints (the last step always checkpoints)",
    "max_steps": "stop after this many steps in total; 0 means no limit",
    "log_every": "steps between 'step=... loss=...' log lines",
    "sentinel_rules": "JSON list of rules the in-job sentinel evaluates",
    "sentinel_action": "what the sentinel does when a rule fires: stop or notify",
    "capture": 'JSON object of collections to save, e.g. {"gradients": {"save_interval": 100}}',
}


def _parse_bool(value: str | bool | int) -> bool:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0/1 or true/false, got {value!r}")


def _parse_json(kind: type):
    def parse(value: str | list | dict):
        parsed = json.loads(value) if isinstance(value, str) else value
        if not isinstance(parsed, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {value!r}")
        return parsed

    return parse


def _field_parser(f: dataclasses.Field):
    if f.type in ("bool", bool):
        return _parse_bool
    if f.type in ("list", list):
        return _parse_json(list)
    if f.type in ("dict", dict):
        return _parse_json(dict)
    return {"float": float, "int": int, "str": str}.get(f.type, f.type)


class HyperparameterError(ValueError):
    """A hyperparameter is unknown or malformed; the message names it and what was expected."""


class _Parser(argparse.ArgumentParser):
    # argparse would print and exit 2 on its own; raising lets main() write the failure file
    # first, so the reason reaches DescribeTrainingJob's FailureReason like any other failure.
    def error(self, message: str):
        raise HyperparameterError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        description="Train the reference ResNet (SageMaker script mode). Hyperparameters may also come from SM_HPS.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # a misspelt hyperparameter must fail, not silently match another
    )
    for f in dataclasses.fields(Config):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        parser.add_argument(f"--{f.name}", type=_field_parser(f), default=default, help=HELP[f.name])
    parser.add_argument("--dry-run", action="store_true", help="a few steps on tiny data, for tests")
    return parser


def parse_config(argv: list[str] | None = None, environ: dict | None = None) -> tuple[Config, bool]:
    """Hyperparameters from SM_HPS first, then the command line (which wins), as SageMaker passes both."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    known = {f.name for f in dataclasses.fields(Config)}
    sm_hps = json.loads(environ.get("SM_HPS", "{}") or "{}")
    # SageMaker adds its own sagemaker_* hyperparameters; they are not ours to validate.
    from_env = {k: v for k, v in sm_hps.items() if k in known}
    parser.set_defaults(**{k: _field_parser(next(f for f in dataclasses.fields(Config) if f.name == k))(v)
                           for k, v in from_env.items()})
    args, unknown = parser.parse_known_args(argv)
    ours = [a for a in unknown if a.startswith("--") and not a.startswith("--sagemaker_")]
    if ours:
        parser.error(f"unknown hyperparameter {ours[0]} (valid: {', '.join(sorted(known))})")
    dry_run = args.dry_run
    config = Config(**{name: getattr(args, name) for name in known})
    if config.sentinel_action not in ("stop", "notify"):
        parser.error(f"--sentinel_action must be stop or notify, got {config.sentinel_action!r}")
    try:  # rule lists and capture settings fail here, naming the field, before any training
        parse_rule_list(config.sentinel_rules)
        parse_capture(config.capture)
        job = load_config(environ)
        parse_rule_list(job.rules)
        parse_capture(job.capture)
    except (RuleConfigError, CaptureConfigError, StabilizerConfigError) as error:
        parser.error(str(error))
    for name in ("batch_size", "num_epochs", "checkpoint_every", "log_every"):
        if getattr(config, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(config, name)}")
    return config, dry_run


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
    path = directory / checkpoint_name(next_step)
    partial = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": next_step,
                "config": dataclasses.asdict(config)}, partial)
    partial.rename(path)  # a reader (or S3 sync) never sees half a checkpoint
    for old in checkpoints_in(directory)[:-CHECKPOINTS_KEPT]:
        old.unlink()
    return path


ARCHITECTURE_KEYS = ("depth", "activation", "add_batch_norm")


def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer, paths: Paths, config: Config) -> int:
    """Resume from our own newest checkpoint, else from the resume channel; returns the next step."""
    own = newest_checkpoint(paths.checkpoint_dir)
    source = own or newest_checkpoint(paths.resume)
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
    guard.record.restores = True
    if guard.rewind is not None:
        # The guard copies the last healthy state every few steps and writes it as a checkpoint when a
        # rule fires; the config goes with it, as in every checkpoint restore() reads.
        guard.rewind.extra = {"config": dataclasses.asdict(config)}
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
