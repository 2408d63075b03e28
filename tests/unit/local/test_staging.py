"""A job of one's own in local mode: its directory and data checked before anything starts, the
CLI's key=value reaching its hyperparameters, and the upload to the local S3 as on AWS."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from stabilizer.cli import EXIT_USAGE, main
from stabilizer.inputs import InputProblemError, build_input, workflow_state_module
from stabilizer.local.staging import StagingError, localize, stage, upload_library

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def state_module():
    return workflow_state_module(ROOT / "lambdas")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """examples/mine/: input.json beside src/fit.py and data/points/x.npy."""
    root = tmp_path / "mine"
    (root / "src").mkdir(parents=True)
    (root / "src" / "fit.py").write_text("print('fit')\n")
    (root / "data" / "points").mkdir(parents=True)
    (root / "data" / "points" / "x.npy").write_bytes(b"x")
    return root


def job_input(**job_changes) -> dict:
    job = {
        "source": "src",
        "entry_point": "fit.py",
        "hyperparameters": {"lr": 0.5, "epochs": 3},
        "channels": {"points": "data/points"},
        "knobs": {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 1.0}},
        **job_changes,
    }
    return {"job": job}


def write(project: Path, data: dict) -> Path:
    path = project / "input.json"
    path.write_text(json.dumps(data))
    return path


def test_local_paths_are_relative_to_the_input_file(project: Path, state_module):
    built = build_input(state_module=state_module, input_file=write(project, job_input()), pairs=["lr=0.25"])
    assert built["job"]["source"] == str(project / "src")
    assert built["job"]["channels"] == {"points": str(project / "data" / "points")}
    # A bare key names the job's own hyperparameter; a dotted one reaches any of the job's fields.
    assert built["job"]["hyperparameters"] == {"lr": 0.25, "epochs": 3}
    again = build_input(
        state_module=state_module, input_file=write(project, job_input()), pairs=["job.hyperparameters.epochs=1"]
    )
    assert again["job"]["hyperparameters"]["epochs"] == 1


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"source": "nowhere"}, "job.source: no such directory or archive: "),
        ({"entry_point": "train.py"}, "job.entry_point: 'train.py' is not in "),
        ({"channels": {"points": "data/missing"}}, "job.channels.points: no such file or directory: "),
        ({"instance_count": 2}, "job.instance_count: local mode runs a job on one instance"),
    ],
)
def test_bad_local_paths_are_named_before_anything_starts(project: Path, state_module, changes, expected):
    with pytest.raises(InputProblemError) as caught:
        build_input(state_module=state_module, input_file=write(project, job_input(**changes)))
    assert str(caught.value).startswith(expected)


def test_the_cli_rejects_a_missing_entry_point_in_one_line_and_launches_nothing(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    runs = tmp_path / "runs"
    given = write(project, job_input(entry_point="train.py"))
    code = main(["run", "--local", "--run-dir", str(runs), "--input", str(given)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE
    assert not runs.exists()
    assert err == [f"stabilizer: job.entry_point: 'train.py' is not in {project / 'src'} (its scripts: fit.py)"]


def test_a_knob_on_a_missing_hyperparameter_is_rejected_by_the_cli_too(project: Path, state_module):
    bad = job_input(knobs={"learning_rate": {"hyperparameter": "learning_rate", "type": "float", "min": 0, "max": 1}})
    with pytest.raises(InputProblemError, match=r"job\.knobs\.learning_rate\.hyperparameter: 'learning_rate' is not"):
        build_input(state_module=state_module, input_file=write(project, bad))


def test_an_archive_source_is_checked_for_its_entry_point(tmp_path: Path):
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("./fit.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    ok = localize({"job": {"source": str(archive), "entry_point": "fit.py"}}, tmp_path)
    assert ok["job"]["source"] == str(archive)
    with pytest.raises(StagingError, match=r"job\.entry_point: 'main\.py' is not in the archive"):
        localize({"job": {"source": str(archive), "entry_point": "main.py"}}, tmp_path)


def test_stage_uploads_source_and_channels_and_leaves_s3_uris_alone(project: Path):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="local")
        given = job_input(
            source=str(project / "src"),
            channels={"points": str(project / "data" / "points"), "extra": "s3://elsewhere/extra/"},
        )
        staged = stage(given, s3, "local", "jobs/run-1")
        assert staged["job"]["source"] == "s3://local/jobs/run-1/source/sourcedir.tar.gz"
        assert staged["job"]["channels"] == {
            "points": "s3://local/jobs/run-1/channels/points/",
            "extra": "s3://elsewhere/extra/",
        }
        body = s3.get_object(Bucket="local", Key="jobs/run-1/source/sourcedir.tar.gz")["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
            assert archive.getnames() == ["fit.py"]
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="local", Prefix="jobs/run-1/channels/")["Contents"]]
        assert keys == ["jobs/run-1/channels/points/x.npy"]
        # The reference problem's input has no job: nothing to stage.
        assert stage({"policy": "original"}, s3, "local", "jobs/run-2") == {"policy": "original"}


def test_the_library_is_uploaded_as_the_stack_deploys_it():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="local")
        count = upload_library(s3, ROOT / "model", "local", "library")
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="local", Prefix="library/")["Contents"]}
        assert count == len(keys)
        assert "library/rule_engine/sentinel.py" in keys
        assert not any("__pycache__" in key for key in keys)
