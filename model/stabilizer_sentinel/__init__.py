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
Each feature is a subpackage; the top level holds the commands, the public doors and what every
part shares::

    launch          ``python -m stabilizer_sentinel.launch``: runs an unmodified script as a job does
    evaluator       ``python -m stabilizer_sentinel.evaluator``: follows a store, writes rule statuses
    lightning_callback, smdebug_compat   the documented import paths of the two modules below
    integration/    how a script gets watched: ``watch()`` (``script_watch``), the ``Guard``, the
                    launcher's global hooks (``launcher_hooks``, installed by the autostart
                    ``sitecustomize``), the Lightning callback, how the script ended, the job's log
    detection/      the checks: the in-job ``sentinel`` (finite check every step, rules at save
                    steps, findings, exit 86), health, the learning check and its statistics, the
                    hang watchdog
    recovery/       going back: ``rewind`` (the last healthy state), ``resume`` (the newest
                    checkpoint), in-job ``recovery``
    rules/          ``Rule``, ``register_rule``, rule lists, the built-in rules, smdebug's rule API
    loops/          the loops and processes a guard watches: networks, optimizer hooks, steps a
                    scaler skips, bare-tensor loops, the backward pass's loss, worker processes, DDP
    capture/        tensor capture (``capture``, collections, forward hooks), the ``store`` (layout
                    below), the Trial API (``trial``: ``create_trial(path)``), the system profiler
    job_config      the ``sagemaker_stabilizer`` configuration and the job's paths (no torch)
    summary         the run's summary in findings.json and how the script ended

Imports point down that list, from the commands through integration, detection and recovery,
rules and loops, capture, to ``job_config`` and ``summary``; no subpackage imports one above it
(tests/packaging/test_import_direction.py).

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
    "Capture": "stabilizer_sentinel.capture.capture",
    "CaptureConfigError": "stabilizer_sentinel.capture.capture",
    "CollectionConfig": "stabilizer_sentinel.capture.capture",
    "parse_capture": "stabilizer_sentinel.capture.capture",
    "RULES": "stabilizer_sentinel.rules",
    "Rule": "stabilizer_sentinel.rules",
    "RuleConfigError": "stabilizer_sentinel.rules",
    "RuleFinding": "stabilizer_sentinel.rules",
    "parse_rule_list": "stabilizer_sentinel.rules",
    "register_rule": "stabilizer_sentinel.rules",
    "EXIT_RULE_STOP": "stabilizer_sentinel.detection.sentinel",
    "FAILURE_PREFIX": "stabilizer_sentinel.detection.sentinel",
    "Sentinel": "stabilizer_sentinel.detection.sentinel",
    "Verdict": "stabilizer_sentinel.detection.sentinel",
    "build_monitoring": "stabilizer_sentinel.detection.sentinel",
    "Guard": "stabilizer_sentinel.integration.guard",
    "watch": "stabilizer_sentinel.integration.script_watch",
    "StabilizerConfig": "stabilizer_sentinel.job_config",
    "StabilizerConfigError": "stabilizer_sentinel.job_config",
    "load_config": "stabilizer_sentinel.job_config",
    "MemoryTrial": "stabilizer_sentinel.capture.trial",
    "ModeKeys": "stabilizer_sentinel.capture.trial",
    "TensorUnavailable": "stabilizer_sentinel.capture.trial",
    "TensorUnavailableForStep": "stabilizer_sentinel.capture.trial",
    "Trial": "stabilizer_sentinel.capture.trial",
    "create_trial": "stabilizer_sentinel.capture.trial",
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
    return getattr(importlib.import_module(_EXPORTS[name]), name)
