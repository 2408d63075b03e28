"""The SageMaker training container contract, kept on this machine for one local training job.

A framework container (script mode, as sagemaker-training-toolkit runs it) sets up the script's
world before it starts and collects what it leaves behind. Locally:

- a job directory stands for ``/opt/ml``: ``input/config/*.json``, ``input/data/<channel>``
  (downloaded from S3 before the script starts), ``code`` (the extracted source archive),
  ``model``, ``output/failure``, ``output/data`` and the checkpoint directory;
- the ``SM_*`` environment, and the hyperparameters decoded and passed as ``--name value``
  exactly as the training toolkit does (values that parse as JSON are decoded first);
- checkpoints restored from ``CheckpointConfig.S3Uri`` before the start and mirrored back to it,
  deletions included, whenever ``sync_checkpoints`` is called;
- a channel with no data or a missing entry point is a ``ContainerError``: the script is not
  started;
- a job of several instances has one container per host (``algo-1`` .. ``algo-N``), each with its
  own directory, ``resourceconfig.json`` and ``SM_CURRENT_HOST``; how the entry point starts on a
  host (torchrun or the script itself) is ``stabilizer.local.emulator.runners``'s;
- after the script: ``model.tar.gz`` and ``output.tar.gz`` uploaded under the output path, and the
  failure reason read from the failure file, or, where the script left none, the toolkit's for a script
  that failed (its exit code, its output from the first line naming an error, its command).

This module knows the container, not the service: when each step happens and the statuses a caller
sees belong to ``stabilizer.local.emulator.training_job``, the API to ``stabilizer.local.emulator.sagemaker``.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stabilizer.local.emulator import runners
from stabilizer.local.emulator.s3files import DirectorySync, download_prefix, join_uri, parse_s3_uri

OPT_ML = "/opt/ml"
DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"
HOST = "algo-1"
LOG_LEVEL = 20

# The hyperparameters the training toolkit consumes itself (sagemaker-training-toolkit,
# sagemaker_training/params.py, SAGEMAKER_HYPERPARAMETERS); any other `sagemaker_*` one, such as
# `sagemaker_stabilizer`, is an "additional framework parameter", kept out of the script's arguments.
TOOLKIT_HYPERPARAMETERS = frozenset(
    {
        "sagemaker_program",
        "sagemaker_submit_directory",
        "sagemaker_enable_cloudwatch_metrics",
        "sagemaker_region",
        "sagemaker_container_log_level",
        "sagemaker_job_name",
        "default_user_module_name",
        "_tuning_objective_metric",
        "sagemaker_s3_output",
    }
)


class ContainerError(Exception):
    """The container cannot start the script (a channel, the source); the message is the job's reason."""


def decode_hyperparameters(raw: dict[str, str]) -> dict[str, Any]:
    """The training toolkit's reading of hyperparameters.json: each value JSON-decoded when it can be."""
    decoded: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            decoded[key] = json.loads(value)
        except (ValueError, TypeError):
            decoded[key] = value
    return decoded


def user_hyperparameters(hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """The script's own hyperparameters: every one but the framework's ``sagemaker_*``."""
    return {k: v for k, v in hyperparameters.items() if not k.startswith("sagemaker_")}


def _arg_value(value: Any) -> str:
    # The toolkit's to_cmd_args: mappings become k=v pairs, everything else str(); a JSON list
    # therefore reaches the script as its Python repr. The script reads SM_HPS for exact values.
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    return str(value)


def to_cmd_args(hyperparameters: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key in sorted(hyperparameters):
        args += [f"--{key}" if len(key) > 1 else f"-{key}", _arg_value(hyperparameters[key])]
    return args


def _env_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def framework_value(value: Any) -> str | None:
    """A framework hyperparameter as the SDK writes it: a JSON-encoded string, read back plain."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else value
    return str(value)


@dataclass
class Container:
    """One job's container: its ``/opt/ml`` as a directory on this machine, and what the toolkit
    does there before the script starts and after it ended."""

    job_dir: Path
    request: dict[str, Any]
    checkpoint_sync: DirectorySync | None = None
    host: str = HOST
    hosts: tuple[str, ...] = (HOST,)
    num_gpus: int = 0  # local mode trains on this machine's CPU
    master_port: int = runners.MASTER_PORT_ON_SAGEMAKER
    command: tuple[str, ...] = ()  # the entry point's command line, once started

    # Paths inside the job directory, each standing for its /opt/ml counterpart.
    def opt_ml(self, path: str) -> Path:
        """Map a container path under /opt/ml to the job directory."""
        if path == OPT_ML or path.startswith(OPT_ML + "/"):
            return self.job_dir / path[len(OPT_ML) :].lstrip("/")
        return self.job_dir / path.lstrip("/")

    @property
    def log_path(self) -> Path:
        """The script's stdout and stderr (CloudWatch's place)."""
        return self.job_dir / "logs" / "training.log"

    @property
    def checkpoint_dir(self) -> Path:
        local = self.request.get("CheckpointConfig", {}).get("LocalPath") or DEFAULT_CHECKPOINT_PATH
        return self.opt_ml(local)

    @property
    def failure_file(self) -> Path:
        return self.job_dir / "output" / "failure"

    @property
    def hyperparameters(self) -> dict[str, Any]:
        return decode_hyperparameters(self.request.get("HyperParameters", {}))

    @property
    def program(self) -> str | None:
        """The entry point the framework runs (``sagemaker_program``)."""
        return framework_value(self.request.get("HyperParameters", {}).get("sagemaker_program"))

    # ------------------------------------------------------------------------ before the script
    def lay_out(self) -> None:
        """The directories of /opt/ml, empty."""
        for sub in ("input/config", "input/data", "model", "output/data", "code", "logs"):
            self.opt_ml(sub).mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)

    def provision(self, s3: Any) -> None:
        """Write the config files, download the channels, restore the checkpoints and extract the
        source; raises ``ContainerError`` where the script cannot start."""
        request = self.request
        hyperparameters = request.get("HyperParameters", {})
        channels = {c["ChannelName"]: c for c in request.get("InputDataConfig", [])}
        self._write_config(hyperparameters, channels)
        for name, channel in channels.items():
            source = channel.get("DataSource", {}).get("S3DataSource")
            if source is None:
                raise ContainerError(f"channel {name}: only S3DataSource is supported in local mode")
            if download_prefix(s3, source["S3Uri"], self.opt_ml(f"input/data/{name}")) == 0:
                raise ContainerError(
                    f'ClientError: No S3 objects found under S3 URL "{source["S3Uri"]}" given in '
                    f"input data source. Please ensure that the bucket exists in the selected region, "
                    f"that objects exist under that S3 prefix, and that the role has access to it."
                )
        checkpoint = request.get("CheckpointConfig")
        if checkpoint:
            # SageMaker restores the checkpoint prefix into the local path before the script starts.
            download_prefix(s3, checkpoint["S3Uri"], self.checkpoint_dir)
            self.checkpoint_sync = DirectorySync(s3, self.checkpoint_dir, checkpoint["S3Uri"])
            self.checkpoint_sync.sync()  # files just downloaded are already there
        submit = framework_value(hyperparameters.get("sagemaker_submit_directory"))
        program = self.program
        refused = runners.refusal(self.hyperparameters)
        try:
            runners.processes_per_host(self.hyperparameters, self.num_gpus)
        except runners.RunnerError as error:
            refused = refused or str(error)
        if refused:
            raise ContainerError(refused)
        if not submit or not program:
            raise ContainerError(
                "ClientError: the hyperparameters sagemaker_program and sagemaker_submit_directory "
                "are required by the framework container"
            )
        _extract_source(s3, submit, self.opt_ml("code"))
        if not (self.opt_ml("code") / program).is_file():
            raise ContainerError(f"ClientError: entry point {program} not found in {submit}")

    def _write_config(self, hyperparameters: dict[str, str], channels: dict[str, dict[str, Any]]) -> None:
        _write_json(self.opt_ml("input/config/hyperparameters.json"), hyperparameters)
        _write_json(
            self.opt_ml("input/config/inputdataconfig.json"),
            {
                name: {
                    "TrainingInputMode": c.get("InputMode", "File"),
                    "S3DistributionType": c["DataSource"]["S3DataSource"].get(
                        "S3DataDistributionType", "FullyReplicated"
                    ),
                    "RecordWrapperType": c.get("RecordWrapperType", "None"),
                    **({"ContentType": c["ContentType"]} if "ContentType" in c else {}),
                }
                for name, c in channels.items()
                if "S3DataSource" in c.get("DataSource", {})
            },
        )
        _write_json(
            self.opt_ml("input/config/resourceconfig.json"),
            {
                "current_host": self.host,
                "hosts": list(self.hosts),
                "current_instance_type": self.request["ResourceConfig"].get("InstanceType", "local"),
                "current_group_name": "homogeneousCluster",
                "network_interface_name": "eth0",
            },
        )

    # ------------------------------------------------------------------------ the script
    def start(self, python: str, *, job_name: str, job_arn: str, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the entry point as the toolkit does: ``python <program> --name value ...`` (or through
        torchrun, stabilizer.local.emulator.runners) in the code directory, its output to the log."""
        hyperparameters = self.hyperparameters
        command = runners.command(python, str(self.program), to_cmd_args(user_hyperparameters(hyperparameters)),
                                  hyperparameters, hosts=list(self.hosts), host=self.host,
                                  num_gpus=self.num_gpus, master_port=self.master_port)
        self.command = tuple(command)
        with self.log_path.open("wb") as log:
            return subprocess.Popen(
                command,
                cwd=self.opt_ml("code"),
                env=self.environment(hyperparameters, job_name=job_name, job_arn=job_arn, extra_env=extra_env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: Ctrl-C at the terminal reaches the engine, which interrupts the
                # job itself (LocalSageMaker.interrupt_all).
                start_new_session=True,
            )

    def environment(
        self, hyperparameters: dict[str, Any], *, job_name: str, job_arn: str, extra_env: dict[str, str]
    ) -> dict[str, str]:
        """The script's environment: this machine's (less any ``SM_*`` and PYTHONPATH), the toolkit's
        ``SM_*`` variables, and the request's ``Environment`` with its container paths mapped here."""
        channels = [c["ChannelName"] for c in self.request.get("InputDataConfig", [])]
        program = self.program or "train.py"
        user_hps = user_hyperparameters(hyperparameters)
        training_env = self._training_env(job_name, hyperparameters, channels, program)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SM_")}
        env.update(extra_env)
        env.update(runners.master_environment(self.master_port))
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "TRAINING_JOB_NAME": job_name,
                "TRAINING_JOB_ARN": job_arn,
                # The toolkit exports each entry of its environment as SM_<NAME>.
                **{f"SM_{key.upper()}": _env_value(training_env[key]) for key in _EXPORTED_AS_SM},
                "SM_CHANNELS": json.dumps(sorted(channels)),
                "SM_HPS": json.dumps(user_hps, sort_keys=True),
                "SM_USER_ARGS": json.dumps(to_cmd_args(user_hps)),
                "STABILIZER_CHECKPOINT_DIR": str(self.checkpoint_dir),
                "STABILIZER_FAILURE_FILE": str(self.failure_file),
                "STABILIZER_TENSOR_DIR": str(self.checkpoint_dir / "tensors"),
            }
        )
        for name in channels:
            env[f"SM_CHANNEL_{name.upper()}"] = str(self.opt_ml(f"input/data/{name}"))
        env["SM_TRAINING_ENV"] = json.dumps(training_env)
        for key, value in user_hps.items():
            env[f"SM_HP_{key.upper()}"] = _env_value(value)
        for key, value in self.request.get("Environment", {}).items():
            # The request's environment speaks of container paths; they live in the job directory.
            env[key] = value.replace(OPT_ML, str(self.job_dir)) if OPT_ML in value else value
        if extra_env.get("PYTHONPATH"):
            # This machine stands for the image: packages it adds come after the job's own path, as an
            # image's installed packages come after the PYTHONPATH a job sets.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.request.get("Environment", {}).get("PYTHONPATH") and env["PYTHONPATH"],
                            extra_env["PYTHONPATH"]) if p)
        return env

    def _training_env(
        self, job_name: str, hyperparameters: dict[str, Any], channels: list[str], program: str
    ) -> dict[str, Any]:
        """The toolkit's SM_TRAINING_ENV: one JSON object with the job's whole environment."""
        return {
            "job_name": job_name,
            "current_host": self.host,
            "hosts": list(self.hosts),
            "master_hostname": self.hosts[0],
            "network_interface_name": "eth0",
            "num_gpus": self.num_gpus,
            "num_cpus": os.cpu_count() or 1,
            "module_name": program.removesuffix(".py"),
            "user_entry_point": program,
            "module_dir": str(self.opt_ml("code")),
            "model_dir": str(self.opt_ml("model")),
            "input_dir": str(self.opt_ml("input")),
            "input_config_dir": str(self.opt_ml("input/config")),
            "output_dir": str(self.opt_ml("output")),
            "output_data_dir": str(self.opt_ml("output/data")),
            "channel_input_dirs": {name: str(self.opt_ml(f"input/data/{name}")) for name in channels},
            "hyperparameters": user_hyperparameters(hyperparameters),
            "additional_framework_parameters": {
                k: v
                for k, v in hyperparameters.items()
                if k.startswith("sagemaker_") and k not in TOOLKIT_HYPERPARAMETERS
            },
            "log_level": LOG_LEVEL,
        }

    def sync_checkpoints(self) -> None:
        """Mirror the checkpoint directory to ``CheckpointConfig.S3Uri`` (nothing without one)."""
        if self.checkpoint_sync is not None:
            self.checkpoint_sync.sync()

    # ------------------------------------------------------------------------ after the script
    def upload_outputs(self, s3: Any, job_name: str) -> str:
        """``model.tar.gz`` (and ``output.tar.gz`` when the script wrote output data) under the
        output path; returns the model's URI."""
        base = join_uri(self.request["OutputDataConfig"]["S3OutputPath"], job_name, "output")
        model_uri = join_uri(base, "model.tar.gz")
        _upload_tar(s3, self.opt_ml("model"), model_uri)
        data_dir = self.opt_ml("output/data")
        if data_dir.is_dir() and any(data_dir.iterdir()):
            _upload_tar(s3, data_dir, join_uri(base, "output.tar.gz"))
        return model_uri

    def failure_reason(self, exit_code: int | None) -> str:
        """What the script wrote to the failure file, else what the toolkit writes there for a script that
        failed, as SageMaker words it (the service keeps its first 1,024 characters)."""
        text = ""
        if self.failure_file.is_file():
            text = self.failure_file.read_text(errors="replace").strip()
        if not text:
            text = user_script_error(exit_code, self.log_lines(), self.command)
        return f"AlgorithmError: {text}"

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []


# The toolkit's names of errors (sagemaker_training's _PYTHON_ERRORS_, Python's built-in ones, and _MPI_ERRORS_):
# the first line of the script's output that holds one starts the ErrorMessage of its ExecuteUserScriptError.
TOOLKIT_ERROR_NAMES = tuple(sorted({name for name in dir(builtins) if name.endswith("Error")}
                                   | {"Exception", "mpirun.real", "ORTE"}))


def user_script_error(exit_code: int | None, lines: list[str], command: tuple[str, ...]) -> str:
    """What sagemaker-training-toolkit writes to the failure file when the entry point exits non-zero
    (``errors.ExecuteUserScriptError``, from ``process.check_error``): the exit code, the script's output
    from its first line naming an error on (each line once, in order), and the command it ran."""
    message: list[str] = []
    for line in lines:
        if message or any(name in line for name in TOOLKIT_ERROR_NAMES):
            message.append(line.strip(" :\n"))
    message = list(dict.fromkeys(message))
    return (f'ExecuteUserScriptError:\nExitCode {exit_code}\nErrorMessage "{chr(10).join(message)}"\n'
            f'Command "{" ".join(command)}"')


# The entries of SM_TRAINING_ENV that the toolkit also exports one by one as SM_<NAME>.
_EXPORTED_AS_SM = (
    "current_host",
    "hosts",
    "num_gpus",
    "num_cpus",
    "module_name",
    "user_entry_point",
    "module_dir",
    "model_dir",
    "input_dir",
    "input_config_dir",
    "output_dir",
    "output_data_dir",
    "log_level",
)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def _extract_source(s3: Any, uri: str, dest: Path) -> None:
    bucket, key = parse_s3_uri(uri)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        archive.extractall(dest, filter="data")


def _upload_tar(s3: Any, directory: Path, uri: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())
