"""Training on several instances: the job's ``distribution``, as the SageMaker Python SDK takes it, and
what it adds to the CreateTrainingJob request.

Many hosts are SageMaker's job, not the workflow's: the request carries ``InstanceCount`` and the
hyperparameters the SDK's PyTorch estimator writes for the same ``distribution``
(``sagemaker.pytorch.estimator.PyTorch._pytorch_distribution_configuration``, SDK 2.257), and the
framework container's training toolkit launches the script on every host:

- ``{"torch_distributed": {"enabled": true}}``: ``sagemaker_torch_distributed_enabled: true`` and
  ``sagemaker_instance_type``; the container runs ``torchrun --nnodes N --nproc_per_node P
  --master_addr algo-1 --master_port 7777 --node_rank i`` on host ``algo-<i+1>``;
- ``{"pytorchddp": {"enabled": true}}``: the SDK rewrites it to ``smdistributed.dataparallel``:
  ``sagemaker_distributed_dataparallel_enabled: true``, ``sagemaker_instance_type`` and
  ``sagemaker_distributed_dataparallel_custom_mpi_options: ""``; SageMaker's data parallel library
  runs on the instance types the SDK lists for it (``SM_DATAPARALLEL_SUPPORTED_INSTANCE_TYPES``);
- ``processes_per_host`` (not an SDK key: the toolkit's ``sagemaker_mpi_num_of_processes_per_host``,
  which every launcher of the toolkit reads): processes per host, default the host's GPUs (1 on CPU).

Anything else the SDK's ``distribution`` can say (``mpi``, ``smdistributed`` model parallel,
``parameter_server``, ``pytorchxla``, ``multi_worker_mirrored_strategy``, instance groups) is refused
at ValidateInput, naming the key. A relaunch keeps the job's ``instance_count``: it resumes on the
same number of hosts, every host reading the checkpoint from its ``resume`` channel; after a hang,
on fewer when the job allows it (``job.min_instance_count``, stabilizer_workflow.remedies.hangs.relaunch_hosts).

Pure: no AWS call. This module must not build the rest of the request (stabilizer_workflow.launch.requests does).
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

TORCH_DISTRIBUTED = "sagemaker_torch_distributed_enabled"
DATA_PARALLEL = "sagemaker_distributed_dataparallel_enabled"
DATA_PARALLEL_MPI_OPTIONS = "sagemaker_distributed_dataparallel_custom_mpi_options"
INSTANCE_TYPE = "sagemaker_instance_type"
PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
# sagemaker.fw_utils.SM_DATAPARALLEL_SUPPORTED_INSTANCE_TYPES (SDK 2.257), less its local mode entry.
DATA_PARALLEL_INSTANCE_TYPES = ("ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge")


class Launcher(BaseModel):
    """One launcher of the SDK's ``distribution``: ``{"enabled": true}``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False


class Distribution(BaseModel):
    """``job.distribution``: the SDK estimator's ``distribution`` for the launchers the workflow runs."""

    model_config = ConfigDict(extra="forbid")

    torch_distributed: Launcher | None = Field(
        None, description="torchrun on every host (SageMaker's torch_distributed); gloo or NCCL as the script picks"
    )
    pytorchddp: Launcher | None = Field(
        None, description="SageMaker's data parallel library (the SDK's pytorchddp), on the GPU instances it supports"
    )
    processes_per_host: Annotated[int, Field(ge=1, le=64)] | None = Field(
        None, description="processes per host (the toolkit's sagemaker_mpi_num_of_processes_per_host); default "
        "the host's GPUs, 1 without"
    )

    @model_validator(mode="after")
    def _one_launcher(self) -> Distribution:
        if self.torch_distributed_enabled and self.data_parallel_enabled:
            raise ValueError("give one of torch_distributed and pytorchddp, not both")
        return self

    @property
    def torch_distributed_enabled(self) -> bool:
        return self.torch_distributed is not None and self.torch_distributed.enabled

    @property
    def data_parallel_enabled(self) -> bool:
        return self.pytorchddp is not None and self.pytorchddp.enabled


def accelerated(instance_type: str) -> bool:
    """A GPU (ml.p*, ml.g*) or Trainium (ml.trn*) instance, as the SDK tells them apart
    (``sagemaker.fw_utils._is_gpu_instance``, ``_is_trainium_instance``)."""
    family = instance_type.removeprefix("ml.").split(".")[0]
    return family.startswith(("p", "g", "trn"))


def image_problem(distribution: Distribution | None, instance_type: str) -> str | None:
    """Why the deployment's framework image cannot run the distribution on ``instance_type``. The SDK's
    PyTorch estimator refuses torch_distributed on other than GPU and Trainium instances when it picks
    the image (``sagemaker.fw_utils.validate_torch_distributed_distribution``); with an image of the
    user's own it does not ask, nor is this asked."""
    if distribution is None or not distribution.torch_distributed_enabled or accelerated(instance_type):
        return None
    return (f"job.distribution.torch_distributed: the SageMaker Python SDK runs torch_distributed on GPU and "
            f"Trainium instances only (ml.p*, ml.g*, ml.trn*), not {instance_type}; choose one as job.instance_type, "
            "or give an image of your own as job.image")


def distribution_problem(distribution: Distribution | None, instance_type: str) -> str | None:
    """Why the job's distribution cannot run on ``instance_type``, naming the field; None when it can."""
    if distribution is None or not distribution.data_parallel_enabled:
        return None
    if instance_type not in DATA_PARALLEL_INSTANCE_TYPES:
        return (f"job.distribution.pytorchddp: SageMaker's data parallel library runs on "
                f"{', '.join(DATA_PARALLEL_INSTANCE_TYPES)}, not {instance_type}; use torch_distributed")
    return None


def distribution_hyperparameters(distribution: Distribution | None, instance_type: str) -> dict[str, str]:
    """The ``sagemaker_*`` hyperparameters the SDK sends for this distribution, JSON-encoded as it does."""
    if distribution is None:
        return {}
    values: dict[str, object] = {}
    if distribution.torch_distributed_enabled:
        values = {TORCH_DISTRIBUTED: True, INSTANCE_TYPE: instance_type}
    elif distribution.data_parallel_enabled:
        values = {DATA_PARALLEL: True, INSTANCE_TYPE: instance_type, DATA_PARALLEL_MPI_OPTIONS: ""}
    if distribution.processes_per_host is not None:
        values[PROCESSES_PER_HOST] = distribution.processes_per_host
    return {key: json.dumps(value) for key, value in values.items()}
