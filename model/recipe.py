"""The reference recipe's hyperparameters: what train.py takes, each default with its reason, and how
they are read from SageMaker's ``SM_HPS`` and the command line.

    python train.py --help             # every hyperparameter, with its default

A sibling of train.py in the training source directory (SageMaker runs train.py with this
directory first on the path). Like train.py it uses only the sentinel library's public API, here
to check rule lists and capture settings before any training, naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field

import stabilizer_sentinel as sentinel
from stabilizer_contract.reference_recipe import RECIPE


def _default(name: str):
    return RECIPE[name].default


@dataclass
class Config:
    # The recipe's defaults, bounds and meanings have one home (stabilizer_contract.reference_recipe).
    warmup_learning_rate: float = _default("warmup_learning_rate")  # it explodes without batch norm
    learning_rate: float = _default("learning_rate")
    warmup_epochs: int = _default("warmup_epochs")
    add_batch_norm: bool = bool(_default("add_batch_norm"))  # no batch norm: that is the problem
    num_epochs: int = _default("num_epochs")  # enough for the offline data set to reach a useful accuracy
    batch_size: int = _default("batch_size")
    depth: int = _default("depth")  # ResNet-20: 3 stages of 3 blocks
    activation: str = _default("activation")  # the ELU-Conv-ELU-Conv block of the reference network
    grad_clip: float = _default("grad_clip")  # max total gradient norm; 0 = off
    seed: int = _default("seed")  # fixes initialisation and data order, so runs and resumes are reproducible
    checkpoint_every: int = _default("checkpoint_every")  # cheap on small models, bounded loss on stop
    max_steps: int = _default("max_steps")  # 0 = no limit; used by tests and benchmarks to cut a run short
    log_every: int = 10  # steps between log lines; each line costs a host synchronisation
    sentinel_rules: list = field(default_factory=list)  # rules evaluated in-job (docs/contracts.md section 3)
    sentinel_action: str = "stop"  # what the sentinel does when a rule fires: stop or notify
    capture: dict = field(default_factory=dict)  # collections to save: name -> save_interval/save_steps

    def learning_rate_at(self, epoch: int) -> float:
        return self.warmup_learning_rate if epoch < self.warmup_epochs else self.learning_rate

    def phase_at(self, epoch: int) -> str:
        return "warmup" if epoch < self.warmup_epochs else "main"


HELP = {
    **{name: hyperparameter.help for name, hyperparameter in RECIPE.items()},
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
        sentinel.parse_rule_list(config.sentinel_rules)
        sentinel.parse_capture(config.capture)
        job = sentinel.load_config(environ)
        sentinel.parse_rule_list(job.rules)
        sentinel.parse_capture(job.capture)
    except (sentinel.RuleConfigError, sentinel.CaptureConfigError, sentinel.StabilizerConfigError) as error:
        parser.error(str(error))
    for name in ("batch_size", "num_epochs", "checkpoint_every", "log_every"):
        if getattr(config, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(config, name)}")
    return config, dry_run
