"""A SageMaker Python SDK job definition, as a notebook user writes it, becomes the execution input's
`job` (stabilizer.client.sdk), and the client starts an execution of it: locally as it is, on AWS with its
local source and data uploaded to the stack's bucket. No AWS call is made: every test runs inside
moto, with a SageMaker session built on it."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from stabilizer.client.sdk import SdkJobError, execution_input_for, job_from_sdk
from tests.unit.client.test_aws_client import ARN, BUCKET, MACHINE, REGION, WHEN, stack_outputs_client

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
sagemaker = pytest.importorskip("sagemaker")

ROLE = "arn:aws:iam::123456789012:role/sagemaker-execution"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312"
LOSS = {"Name": "train:loss", "Regex": r"mse=(\S+)"}
KNOBS = {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 10.0}}
SCRIPT = "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr', type=float)\n"


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A SageMaker session on moto: building estimators and trainers touches no real account."""
    for key, value in {"AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield sagemaker.session.Session(boto_session=boto3.Session(region_name=REGION))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    directory = tmp_path / "my_project"
    directory.mkdir()
    (directory / "fit.py").write_text(SCRIPT)
    (directory / "utils.py").write_text("HELPER = 1\n")
    return directory


@pytest.fixture
def points(tmp_path: Path) -> Path:
    directory = tmp_path / "points"
    directory.mkdir()
    (directory / "x.npy").write_bytes(b"x" * 64)
    return directory


def pytorch_estimator(session: Any, source: Path, **extra: Any) -> Any:
    from sagemaker.pytorch import PyTorch

    return PyTorch(
        entry_point="fit.py",
        source_dir=str(source),
        role=ROLE,
        framework_version="2.8.0",
        py_version="py312",
        instance_type="ml.g5.xlarge",
        instance_count=1,
        hyperparameters={"lr": 1.6, "steps": 60, "optimizer": "sgd", "layers": [64, 32]},
        metric_definitions=[LOSS],
        max_run=1800,
        sagemaker_session=session,
        **extra,
    )


def model_trainer(session: Any, source: Path, points: Path, **source_extra: Any) -> Any:
    from sagemaker.modules import Session
    from sagemaker.modules.configs import (
        Compute,
        InputData,
        MetricDefinition,
        OutputDataConfig,
        SourceCode,
        StoppingCondition,
    )
    from sagemaker.modules.train import ModelTrainer

    return ModelTrainer(
        training_image=IMAGE,
        source_code=SourceCode(source_dir=str(source), entry_script="fit.py", **source_extra),
        compute=Compute(instance_type="ml.m5.xlarge", instance_count=1),
        hyperparameters={"lr": 1.6, "steps": 60},
        input_data_config=[InputData(channel_name="points", data_source=str(points))],
        stopping_condition=StoppingCondition(max_runtime_in_seconds=1200),
        role=ROLE,
        # ModelTrainer takes its own Session class (sagemaker.modules.Session), built on the same boto session.
        sagemaker_session=Session(boto_session=session.boto_session),
        output_data_config=OutputDataConfig(s3_output_path=f"s3://{BUCKET}/sdk-output"),
    ).with_metric_definitions([MetricDefinition(name="train:loss", regex=r"mse=(\S+)")])


def members(archive: str | bytes) -> list[str]:
    fileobj = io.BytesIO(archive) if isinstance(archive, bytes) else open(archive, "rb")  # noqa: SIM115
    with fileobj, tarfile.open(fileobj=fileobj, mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers() if m.isfile())


# ------------------------------------------------------------------------------------ conversion
def test_a_pytorch_estimator_becomes_the_same_job(session, source, points):
    estimator = pytorch_estimator(session, source)
    job = job_from_sdk(estimator, {"points": f"file://{points}"}, knobs=KNOBS)
    assert job == {
        "source": str(source),
        "entry_point": "fit.py",
        "image": {"framework": "pytorch", "version": "2.8.0", "python_version": "py312"},
        "instance_type": "ml.g5.xlarge",
        "instance_count": 1,
        "hyperparameters": {"lr": 1.6, "steps": 60, "optimizer": "sgd", "layers": [64, 32]},
        "channels": {"points": str(points)},
        "metric_definitions": [LOSS],
        "max_runtime_seconds": 1800,
        "knobs": KNOBS,
    }


def test_on_aws_the_image_is_the_one_fit_would_use_in_that_region(session, source):
    estimator = pytorch_estimator(session, source)
    job = job_from_sdk(estimator, region="eu-west-1")
    assert job["image"] == estimator.training_image_uri(region="eu-west-1")
    assert job["image"] == "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"


def test_a_generic_estimator_with_a_lone_entry_point_is_packed_as_the_sdk_packs_it(session, source):
    from sagemaker.estimator import Estimator
    from sagemaker.inputs import TrainingInput

    estimator = Estimator(
        image_uri=IMAGE, role=ROLE, instance_type="ml.c5.xlarge", instance_count=1,
        entry_point=str(source / "fit.py"), hyperparameters={"lr": "0.5", "name": "run"},
        sagemaker_session=session,
    )
    job = job_from_sdk(estimator, TrainingInput(f"s3://{BUCKET}/data/train"))
    assert job["image"] == IMAGE
    assert job["entry_point"] == "fit.py"
    # Without source_dir the SDK uploads the entry point alone: utils.py stays behind.
    assert job["source"].endswith("sourcedir.tar.gz")
    assert members(job["source"]) == ["fit.py"]
    # The training toolkit JSON-decodes each value before the script sees it; so does the job.
    assert job["hyperparameters"] == {"lr": 0.5, "name": "run"}
    assert job["channels"] == {"training": f"s3://{BUCKET}/data/train"}
    assert job["max_runtime_seconds"] == 86400  # the SDK's default max_run
    assert job["metric_definitions"] == []


def test_a_model_trainer_becomes_the_same_job(session, source, points):
    trainer = model_trainer(session, source, points)
    job = job_from_sdk(trainer, knobs=KNOBS, loss_metric="train:loss")
    assert job == {
        "source": str(source),
        "entry_point": "fit.py",
        "image": IMAGE,
        "instance_type": "ml.m5.xlarge",
        "instance_count": 1,
        "hyperparameters": {"lr": 1.6, "steps": 60},
        "channels": {"points": str(points)},
        "metric_definitions": [LOSS],
        "max_runtime_seconds": 1200,
        "knobs": KNOBS,
        "loss_metric": "train:loss",
    }


def test_a_model_trainer_on_spot_keeps_its_spot_settings(session, source, points):
    from sagemaker.modules.configs import CheckpointConfig, Compute, StoppingCondition

    trainer = model_trainer(session, source, points)
    trainer.compute = Compute(instance_type="ml.m5.xlarge", instance_count=1, enable_managed_spot_training=True)
    trainer.stopping_condition = StoppingCondition(max_runtime_in_seconds=1200, max_wait_time_in_seconds=3600)
    trainer.checkpoint_config = CheckpointConfig(s3_uri=f"s3://{BUCKET}/ckpt")
    job = job_from_sdk(trainer, knobs=KNOBS, loss_metric="train:loss")
    assert (job["use_spot_instances"], job["max_runtime_seconds"], job["max_wait_seconds"]) == (True, 1200, 3600)
    assert job["checkpoint_s3_uri"] == f"s3://{BUCKET}/ckpt"


def test_a_model_trainer_source_leaves_out_what_its_ignore_patterns_name_at_every_depth(session, source, points):
    # ModelTrainer copies source_dir with shutil.ignore_patterns: every name at every depth.
    (source / ".env").write_text("TOKEN=secret\n")
    (source / "pkg").mkdir()
    (source / "pkg" / "model.py").write_text("M = 1\n")
    (source / "pkg" / ".DS_Store").write_bytes(b"\0")
    job = job_from_sdk(model_trainer(session, source, points))
    assert members(job["source"]) == ["fit.py", "pkg/model.py", "utils.py"]
    own = job_from_sdk(model_trainer(session, source, points, ignore_patterns=["*.py"]))
    assert members(own["source"]) == [".env", "pkg/.DS_Store"]  # the trainer's own patterns replace the defaults


@pytest.mark.parametrize(
    ("make", "attribute"),
    [
        (lambda s, src, pts: pytorch_estimator(s, src, distribution={"mpi": {"enabled": True}}),
         r"distribution\.mpi"),
        (lambda s, src, pts: pytorch_estimator(s, src, environment={"NCCL_DEBUG": "INFO"}), "environment"),
        (lambda s, src, pts: model_trainer(s, src, pts, command="python fit.py --fast"), "source_code.command"),
    ],
)
def test_what_the_job_cannot_express_is_refused_naming_the_sdk_attribute(session, source, points, make, attribute):
    with pytest.raises(SdkJobError, match=f"^{attribute}: "):
        job_from_sdk(make(session, source, points))


def test_sdk_local_mode_instance_types_are_refused(session, source):
    from sagemaker.estimator import Estimator

    estimator = Estimator(image_uri=IMAGE, role=ROLE, instance_type="ml.m5.xlarge", instance_count=1,
                          entry_point="fit.py", source_dir=str(source), sagemaker_session=session)
    estimator.instance_type = "local"
    with pytest.raises(SdkJobError, match=r"^instance_type: 'local' is not a SageMaker instance type"):
        job_from_sdk(estimator)


def test_the_execution_input_keeps_its_other_sections(session, source):
    given = {"policy": "original", "limits": {"max_num_retraining": 3}}
    result = execution_input_for(given, pytorch_estimator(session, source), knobs=KNOBS)
    assert result["policy"] == "original" and result["limits"] == {"max_num_retraining": 3}
    assert result["job"]["knobs"] == KNOBS
    assert given == {"policy": "original", "limits": {"max_num_retraining": 3}}  # not changed in place
    with pytest.raises(SdkJobError, match=r"^job: given twice"):
        execution_input_for({"job": {}}, pytorch_estimator(session, source))


def test_the_converted_job_is_a_valid_execution_input(session, source, points):
    job_model = pytest.importorskip("stabilizer_workflow.execution.job", reason="the execution input's job model")
    for definition in (pytorch_estimator(session, source), model_trainer(session, source, points)):
        job = job_from_sdk(definition, knobs=KNOBS, loss_metric="train:loss")
        assert job_model.Job.model_validate(job).knobs.learning_rate.hyperparameter == "lr"


# ------------------------------------------------------------------------------------ the clients
def test_the_aws_client_uploads_the_source_and_data_and_starts_the_job(session, source, points):
    from stabilizer.client.aws_client import AwsClient

    client = AwsClient("Stabilizer", region_name=REGION, cloudformation=stack_outputs_client())
    sent: list[dict[str, Any]] = []
    client.sfn = boto3.client("stepfunctions", region_name=REGION)
    client.sfn.meta.events.register("before-parameter-build.sfn.StartExecution",
                                    lambda params, **_: sent.append(json.loads(params["input"])))
    with Stubber(client.sfn) as stubber:
        stubber.add_response("start_execution", {"executionArn": ARN, "startDate": WHEN})
        arn = client.start({"policy": "default"}, name="sdk-1", job=pytorch_estimator(session, source),
                           inputs={"points": str(points)}, knobs=KNOBS)
    assert arn == ARN
    [execution_input] = sent
    job = execution_input["job"]
    assert execution_input["policy"] == "default"
    assert job["image"] == "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"
    assert job["source"].startswith(f"s3://{BUCKET}/source/jobs/") and job["source"].endswith("/sourcedir.tar.gz")
    s3 = boto3.client("s3", region_name=REGION)
    key = job["source"].split("/", 3)[3]
    assert members(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()) == ["fit.py", "utils.py"]
    channel = job["channels"]["points"]
    assert channel.startswith(f"s3://{BUCKET}/data/jobs/") and channel.endswith("/points/")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=channel.split("/", 3)[3])["Contents"]
    assert [o["Key"].rsplit("/", 1)[1] for o in listed] == ["x.npy"]
    assert job["knobs"] == KNOBS and job["hyperparameters"]["lr"] == 1.6
    assert MACHINE in client.state_machine_arn


def test_the_local_client_hands_the_job_to_the_engine_as_it_is(session, source, points):
    from stabilizer.client.local_client import LocalClient

    class Engine:
        """Stands in for LocalEngine at the one call under test: what input the execution gets."""

        settings = type("Settings", (), {"bucket": BUCKET, "instance_type": "ml.m5.xlarge"})()
        state_machine_arn = MACHINE
        started: list[dict[str, Any]] = []

        def client(self, service: str) -> Any:
            return boto3.client(service, region_name=REGION)

        def start_execution(self, execution_input: dict[str, Any], name: str | None) -> str:
            self.started.append(execution_input)
            return f"{ARN}-{len(self.started)}"

        def follow(self, *args: Any, **kwargs: Any) -> None:
            return None

    engine = Engine()
    client = LocalClient(engine)
    client.start(job=model_trainer(session, source, points), knobs=KNOBS)
    [given] = engine.started
    # Locally the source and channels stay where they are; the engine stages them itself.
    assert given["job"]["source"] == str(source)
    assert given["job"]["channels"] == {"points": str(points)}
    assert given["job"]["image"] == IMAGE
    # A framework estimator's image is the SDK's URI for the local engine's region, as fit() would name it.
    client.start(job=pytorch_estimator(session, source), inputs={"points": str(points)}, knobs=KNOBS)
    assert engine.started[1]["job"]["image"] == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312")
    # So is a job dict's {framework, version}, for the instance type the job runs on.
    client.start(job={"source": str(source), "entry_point": "fit.py", "image": {"framework": "pytorch",
                      "version": "2.7"}})
    assert engine.started[2]["job"]["image"] == (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.7-cpu-py312")  # the SDK keeps the alias


def test_the_aws_upload_carries_what_the_sdk_would_less_runs_git_and_environments(session, source):
    from stabilizer.client.sdk_aws import upload_local_files
    from stabilizer.source.sourcedir import mark_run_directory

    for name, content in {"data/corpus.txt": "words\n", "tests/test_fit.py": "", ".git/HEAD": "ref: main\n",
                          "env/pyvenv.cfg": "home = /usr/bin\n", "runs/old/ckpt.pt": "0" * 1000}.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(content)
    mark_run_directory(source / "runs")
    said: list[str] = []
    s3 = boto3.client("s3", region_name=REGION)
    job = upload_local_files({"source": str(source), "entry_point": "fit.py"}, s3, BUCKET, say=said.append)
    body = s3.get_object(Bucket=BUCKET, Key=job["source"].split("/", 3)[3])["Body"].read()
    # A script's ./data and ./tests go up, as the SDK's tar_and_upload_dir sends the whole source_dir.
    assert members(body) == ["data/corpus.txt", "fit.py", "tests/test_fit.py", "utils.py"]
    [line] = said
    assert line.startswith(f"uploading source: {source} -> sourcedir.tar.gz, 4 files, {len(body)} B (")
    assert line.endswith("left out: .git/ (git), env/ (virtual environment), runs/ (run directory)")


def test_the_aws_upload_refuses_a_source_over_the_limit_before_uploading_anything(session, source, monkeypatch):
    from stabilizer.client.sdk_aws import upload_local_files
    from stabilizer.source import sourcedir

    monkeypatch.setattr(sourcedir, "MAX_ARCHIVE_BYTES", 4096)
    (source / "data").mkdir()
    (source / "data" / "corpus.bin").write_bytes(os.urandom(20_000))
    s3 = boto3.client("s3", region_name=REGION)
    refused = r"^job\.source: .* packs to more than 4\.0 KiB.*biggest entries: data/ 19\.5 KiB"
    with pytest.raises(SdkJobError, match=refused):
        upload_local_files({"source": str(source), "entry_point": "fit.py"}, s3, BUCKET, say=lambda _: None)
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="source/")
