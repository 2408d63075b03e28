"""How the framework container starts the entry point on each host of a job, kept on this machine.

SageMaker gives a job of ``InstanceCount`` N the hosts ``algo-1`` .. ``algo-N`` (sorted; the first
is the master), each with ``/opt/ml/input/config/resourceconfig.json`` (``current_host``, ``hosts``,
``network_interface_name``) and the ``SM_HOSTS`` / ``SM_CURRENT_HOST`` / ``SM_NUM_GPUS`` environment.
The PyTorch container's training toolkit then picks a runner from the ``sagemaker_*`` hyperparameters
the SageMaker Python SDK wrote for the estimator's ``distribution``:

- ``sagemaker_torch_distributed_enabled`` (``distribution={"torch_distributed": {"enabled": True}}``):
  ``torchrun --nnodes N --nproc_per_node P [--master_addr algo-1 --master_port 7777 --node_rank i]
  <entry point> <args>`` on every host (sagemaker-training-toolkit, ``torch_distributed.py``; the
  multi-node options only when N > 1), P the host's GPU count, 1 without GPUs, unless the
  hyperparameter ``sagemaker_mpi_num_of_processes_per_host`` says otherwise (``runner.py``);
- no distribution: ``python <entry point> <args>`` on every host (``ProcessRunner``), with
  ``MASTER_ADDR`` / ``MASTER_PORT`` set (the PyTorch toolkit's ``_set_distributed_environment``);
- ``sagemaker_distributed_dataparallel_enabled`` (the SDK's ``pytorchddp``, rewritten to
  ``smdistributed.dataparallel``), ``sagemaker_mpi_enabled``: MPI launchers over GPU libraries that
  this machine does not have; local mode refuses them before the job starts.

Locally every host is a process group on this machine: the master's address is ``127.0.0.1`` (no
host named ``algo-1`` resolves here) and the port a free one (two local jobs may run at once), and
the processes talk over loopback with gloo. This module says what to run; ``stabilizer.local.emulator.container``
lays out each host and ``stabilizer.local.emulator.training_job`` runs and ends them.
"""

from __future__ import annotations

import json
import socket
from typing import Any

MASTER_PORT_ON_SAGEMAKER = 7777
LOOPBACK = "127.0.0.1"
TORCH_DISTRIBUTED = "sagemaker_torch_distributed_enabled"
PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
# Launchers the container offers that need what this machine has not (SMDDP, MPI over GPUs).
UNSUPPORTED_LOCALLY = {
    "sagemaker_distributed_dataparallel_enabled": "pytorchddp (smdistributed dataparallel)",
    "sagemaker_mpi_enabled": "mpi",
}


class RunnerError(Exception):
    """The job asks for a launcher local mode cannot run; the message names it."""


def hosts_of(request: dict[str, Any]) -> list[str]:
    """``algo-1`` .. ``algo-N`` for the request's ``InstanceCount``."""
    count = int(request.get("ResourceConfig", {}).get("InstanceCount", 1))
    return [f"algo-{index}" for index in range(1, count + 1)]


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.strip().lower() == "true"
    return value is True or (isinstance(value, str) and value.lower() == "true")


def torch_distributed(hyperparameters: dict[str, Any]) -> bool:
    """Whether the container runs the entry point through torchrun."""
    return _flag(hyperparameters.get(TORCH_DISTRIBUTED, False))


def refusal(hyperparameters: dict[str, Any]) -> str | None:
    """Why local mode cannot start this job's launcher, or None."""
    for key, name in UNSUPPORTED_LOCALLY.items():
        if _flag(hyperparameters.get(key, False)):
            return (f"ClientError: local mode runs torch_distributed (torchrun over gloo); {name} "
                    f"({key}) needs SageMaker's GPU instances")
    return None


def processes_per_host(hyperparameters: dict[str, Any], num_gpus: int) -> int:
    """The toolkit's processes per host: the hyperparameter when given, else the GPUs, else 1."""
    raw = hyperparameters.get(PROCESSES_PER_HOST)
    if raw is not None:
        try:
            value = int(json.loads(raw) if isinstance(raw, str) else raw)
        except (TypeError, ValueError):
            raise RunnerError(f"ClientError: {PROCESSES_PER_HOST} must be an integer, got {raw!r}") from None
        if value < 1:
            raise RunnerError(f"ClientError: {PROCESSES_PER_HOST} must be at least 1, got {value}")
        return value
    return num_gpus if num_gpus > 0 else 1


def free_port() -> int:
    """A TCP port nobody listens on now (the job's rendezvous; SageMaker's is 7777 on algo-1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def command(python: str, program: str, args: list[str], hyperparameters: dict[str, Any], *, hosts: list[str],
            host: str, num_gpus: int, master_port: int) -> list[str]:
    """The command the container runs on ``host``: torchrun's, or the entry point's own."""
    if not torch_distributed(hyperparameters):
        return [python, program, *args]
    launcher = [python, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
                "--nproc_per_node", str(processes_per_host(hyperparameters, num_gpus))]
    if len(hosts) > 1:
        launcher += ["--master_addr", LOOPBACK, "--master_port", str(master_port),
                     "--node_rank", str(hosts.index(host))]
    else:
        # One host: torchrun picks its own rendezvous port; a fixed one could collide between jobs.
        launcher += ["--master_addr", LOOPBACK, "--master_port", str(master_port)]
    return [*launcher, program, *args]


def master_environment(master_port: int) -> dict[str, str]:
    """What the PyTorch toolkit exports before any runner starts (``_set_distributed_environment``)."""
    return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(master_port)}


def local_distribution_problem(job: dict[str, Any]) -> str | None:
    """Why local mode cannot run the execution input's ``job.distribution``, or None."""
    distribution = job.get("distribution") or {}
    if not isinstance(distribution, dict):
        return None  # ValidateInput names the field
    for key, value in distribution.items():
        if key != "torch_distributed" and isinstance(value, dict) and value.get("enabled", False):
            return (f"job.distribution.{key}: local mode runs torch_distributed (torchrun over gloo); {key} "
                    "needs SageMaker's GPU instances")
    return None
