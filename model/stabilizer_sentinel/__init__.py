"""An open rule engine for training jobs: tensor capture, a Trial API, Debugger-compatible rules,
an in-job sentinel and an out-of-job evaluator.

It ships inside the SageMaker source directory (``model/``) and needs only torch and NumPy, so
detection works inside a training job on AWS, in local mode and in a notebook afterwards, with or
without SageMaker Debugger.

Protecting a training loop (the plain-loop level; docs/library.md)::

    import stabilizer_sentinel as sentinel
    guard = sentinel.watch(model, optimizer)    # configured by the job's sagemaker_stabilizer hyperparameter
    guard.step(loss)                            # each step, before optimizer.step()

An unchanged script runs under ``python -m stabilizer_sentinel.launch script.py args...`` (or, in a job,
through ``stabilizer_sentinel/autostart/sitecustomize.py``); Lightning users add
``stabilizer_sentinel.lightning_callback.SentinelCallback()`` to their ``Trainer``.

Parts
-----
``script_watch`` ``watch(model, optimizer)``: builds the guard a script asks for
``guard``      ``Guard``: the sentinel and capture wired by hooks into any loop
``job_config`` the ``sagemaker_stabilizer`` configuration and the job's paths (no torch)
``launch``     ``python -m stabilizer_sentinel.launch``: runs an unmodified script as a job does
``launcher_hooks`` the global hooks that watch it (installed by the autostart ``sitecustomize``)
``exit_status`` how a script the launcher watches ended when ``SystemExit`` ended it
``lightning_callback`` ``SentinelCallback`` for PyTorch Lightning
``capture``    which collections are due at a step; copies tensors to the store and to memory
``store``      the on-disk layout below (writer, local and ``s3://`` readers)
``trial``      ``create_trial(path)``: ``tensor_names``, ``steps``, ``tensor(name).value(step)``
``rules``      ``Rule``, ``register_rule``, rule lists, the built-in rules
``sentinel``   in-job evaluation: finite check every step, rules at save steps, findings, exit 86
``evaluator``  ``python -m stabilizer_sentinel.evaluator``: follows a store, writes rule statuses

Tensor store layout (docs/contracts.md section 7)
------------------------------------------------
::

    <tensor dir>/                              # default <checkpoint dir>/tensors
      collections.json                         # {"format": "stabilizer-tensors/1", "collections":
                                               #   {name: {"save_interval"|"save_steps", "modes",
                                               #           "include_regex"?}}}
      steps/000000000010_TRAIN.npz             # one archive per (step, mode): NumPy .npz, one
                                               #   array per tensor, keyed by tensor name
      index/000000000010_TRAIN.json            # {"format", "step", "mode", "file": "steps/...npz",
                                               #   "tensors": {name: {"collections", "shape",
                                               #   "dtype"}}} in the order the job saved them
      training_end.json                        # end-of-job marker: {"format", "last_step",
                                               #   "status": "completed" | "rule_stop" | ...}

Step numbers are the job's global training step (optimizer steps since the start, 0-based, twelve
digits); EVAL records carry the training step at which the evaluation ran. Tensor names are
``<collection>/<name>``: ``weights/<parameter>``, ``biases/<parameter>``,
``gradients/<parameter>``, ``losses/loss``, ``activations/<module>``, ``inputs/inputs``,
``labels/labels``, ``predictions/predictions``.

Rules for writers and readers: every file is written to a temporary name and renamed; the archive
of a step is written before its index entry, so an index entry whose archive exists describes a
complete step (a synced copy on S3 may show either first: readers require both). Archives are read
with ``numpy.load(allow_pickle=False)``; nothing is ever unpickled. ``training_end.json`` is
written last; once a reader has seen it and listed the steps, it has everything
(``trial.loaded_all_steps``).
"""

from __future__ import annotations

import importlib
from typing import Any

# Names are resolved on first use, so reading a store (trial, store, rules) never imports torch:
# the out-of-job evaluator and notebooks without torch can use them.
_EXPORTS = {
    "Capture": "capture",
    "CaptureConfigError": "capture",
    "CollectionConfig": "capture",
    "parse_capture": "capture",
    "RULES": "rules",
    "Rule": "rules",
    "RuleConfigError": "rules",
    "RuleFinding": "rules",
    "parse_rule_list": "rules",
    "register_rule": "rules",
    "EXIT_RULE_STOP": "sentinel",
    "FAILURE_PREFIX": "sentinel",
    "Sentinel": "sentinel",
    "Verdict": "sentinel",
    "build_monitoring": "sentinel",
    "Guard": "guard",
    "watch": "script_watch",
    "StabilizerConfig": "job_config",
    "StabilizerConfigError": "job_config",
    "load_config": "job_config",
    "MemoryTrial": "trial",
    "ModeKeys": "trial",
    "TensorUnavailable": "trial",
    "TensorUnavailableForStep": "trial",
    "Trial": "trial",
    "create_trial": "trial",
    # Checkpoint file names the workflow resumes from (docs/contracts.md, section 1): a script that
    # writes its own checkpoints names and finds them with these.
    "checkpoint_name": "stabilizer_contract.checkpoints",
    "checkpoints_in": "stabilizer_contract.checkpoints",
    "newest_checkpoint": "stabilizer_contract.checkpoints",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stabilizer_sentinel' has no attribute {name!r}")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module if "." in module else f"stabilizer_sentinel.{module}"), name)
