"""An SDK estimator's ``distribution`` (and ``instance_count``) as the execution input's ``job.distribution``.

The SageMaker Python SDK's PyTorch estimator keeps ``distribution`` as given, except ``pytorchddp``,
which its constructor rewrites to ``{"smdistributed": {"dataparallel": {...}}}`` (SDK 2.257,
``sagemaker.pytorch.estimator.PyTorch.__init__``); the SDK itself refuses ``torch_distributed`` on
instances without GPUs or Trainium chips, and ``pytorchddp`` outside its framework versions and
instance types, before this module sees the estimator. Two launchers go in:

- ``{"torch_distributed": {"enabled": True}}``: torchrun on every host;
- ``{"pytorchddp": {"enabled": True}}`` (seen as ``smdistributed.dataparallel``): SageMaker's data
  parallel library.

Anything else (``mpi``, ``smdistributed.modelparallel``, ``parameter_server``, ``pytorchxla``,
``multi_worker_mirrored_strategy``, instance groups, a ModelTrainer's ``distributed``) is refused
naming the SDK attribute. The workflow writes the hyperparameters the SDK would
(``stabilizer_workflow.execution.distribution``); a test compares the two requests.

This module reads attributes only: no AWS call, no session.
"""

from __future__ import annotations

from typing import Any


class DistributionError(ValueError):
    """The estimator's distribution is not one the workflow runs; the message names the attribute."""


Refusal = type[ValueError]


def _enabled(value: Any) -> bool:
    return isinstance(value, dict) and bool(value.get("enabled", False))


def distribution_of(estimator: Any, error: Refusal = DistributionError) -> dict[str, Any] | None:
    """``job.distribution`` for the estimator's ``distribution``; None when it has none enabled.

    What the workflow does not run raises ``error`` (the caller's own error class), naming the attribute.
    """
    given = getattr(estimator, "distribution", None) or {}
    if not isinstance(given, dict):
        raise error(f"distribution: expected a dict, got {type(given).__name__}")
    if getattr(estimator, "instance_groups", None):
        raise error("instance_groups: stabilizer runs one group of identical instances")
    found: dict[str, Any] = {}
    for key, value in given.items():
        if key == "torch_distributed":
            if _enabled(value):
                found["torch_distributed"] = {"enabled": True}
        elif key == "smdistributed" and isinstance(value, dict) and set(value) == {"dataparallel"}:
            if _enabled(value["dataparallel"]):
                found["pytorchddp"] = {"enabled": True}  # the SDK's rewriting of pytorchddp
        elif isinstance(value, dict) and not value.get("enabled", True) and key != "smdistributed":
            continue  # a launcher given but switched off
        else:
            detail = f".{'/'.join(sorted(value))}" if key == "smdistributed" and isinstance(value, dict) else ""
            raise error(
                f"distribution.{key}{detail}: stabilizer runs torch_distributed and pytorchddp "
                "(smdistributed dataparallel) jobs"
            )
    return found or None


def distribution_fields(estimator: Any, error: Refusal = DistributionError) -> dict[str, Any]:
    """The ``job`` fields for the estimator's distribution: ``{"distribution": ...}`` or nothing."""
    distribution = distribution_of(estimator, error)
    return {} if distribution is None else {"distribution": distribution}
