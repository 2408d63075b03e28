"""A job of one's own in local mode: its directory and data checked before anything starts, the
CLI's key=value reaching its hyperparameters, and the upload to the local S3 as on AWS."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from stabilizer.cli.commands import EXIT_USAGE, main
from stabilizer.client.inputs import InputProblemError, build_input, execution_input_module
from stabilizer.local.engine.staging import StagingError, localize, stage, upload_library

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def state_module():
    return execution_input_module()


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
        ({"instance_count": 2, "distribution": {"pytorchddp": {"enabled": True}}},
         "job.distribution.pytorchddp: local mode runs torch_distributed (torchrun over gloo)"),
        # Not in CreateTrainingJob's enum of training instance types: SageMaker's ValidationException.
        ({"instance_type": "ml.m5.xlargee"}, "job.instance_type: SageMaker trains on no 'ml.m5.xlargee'"),
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


def test_an_instance_type_sagemaker_offers_passes_and_a_near_miss_names_it(project: Path, state_module):
    built = build_input(state_module=state_module, input_file=write(project, job_input(instance_type="ml.g5.xlarge")))
    assert built["job"]["instance_type"] == "ml.g5.xlarge"
    with pytest.raises(InputProblemError, match=r"did you mean ml\.m5\.xlarge"):
        build_input(state_module=state_module, input_file=write(project, job_input(instance_type="ml.m5.xlargee")))


@pytest.mark.parametrize(
    ("text", "pairs", "expected"),
    [
        # Python's json reads NaN and Infinity; no JSON number is one, and Step Functions refuses the input.
        ('{"job": {"source": "src", "entry_point": "fit.py", "hyperparameters": {"lr": 0.5, "epochs": NaN}}}', [],
         "stabilizer: job.hyperparameters.epochs: expected a finite number; NaN and Infinity are not JSON numbers"),
        (None, ["lr=Infinity"],
         "stabilizer: job.hyperparameters.lr: expected a finite number; NaN and Infinity are not JSON numbers"),
        (None, ["job.hyperparameters.note=null"],
         "stabilizer: job.hyperparameters.note: expected a boolean, an integer, a number, a string, a list or an "
         "object, got null"),
    ],
)
def test_a_value_no_json_number_or_hyperparameter_takes_is_named_and_nothing_launches(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text, pairs, expected
):
    given = write(project, job_input())
    if text is not None:
        given.write_text(text)
    runs = tmp_path / "runs"
    code = main(["run", "--local", "--run-dir", str(runs), "--input", str(given), *pairs])
    assert code == EXIT_USAGE
    assert not runs.exists()
    assert capsys.readouterr().err.strip().splitlines() == [expected]


@pytest.mark.parametrize("name", ["my run", "n" * 81, "run[1]"])
def test_an_execution_name_aws_would_refuse_is_named_and_nothing_launches(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name
):
    runs = tmp_path / "runs"
    code = main(["run", "--local", "--run-dir", str(runs), "--input", str(write(project, job_input())), "--name", name])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE
    assert not runs.exists()
    assert len(err) == 1 and err[0].startswith(f"stabilizer: --name: {name!r}: "), err


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
        assert "library/stabilizer_sentinel/detection/sentinel.py" in keys
        assert not any("__pycache__" in key for key in keys)


# --- what of the source goes to the job (stabilizer.source.sourcedir) -------------------------------------


def staged_members(given: dict, leave_out=()) -> list[str]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="local")
        staged = stage(given, s3, "local", "jobs/run-1", **({"leave_out": leave_out} if leave_out else {}))
        body = s3.get_object(Bucket="local", Key=staged["job"]["source"].split("/", 3)[3])["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        return sorted(m.name for m in archive.getmembers() if m.isfile())


def test_a_source_folder_named_data_or_tests_reaches_the_job(project: Path):
    src = project / "src"
    for name in ("data/corpus.txt", "tests/test_fit.py", "tests/data/golden.json"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("{}")
    assert staged_members(job_input(source=str(src), channels={})) == [
        "data/corpus.txt", "fit.py", "tests/data/golden.json", "tests/test_fit.py"]


def test_runs_git_environments_and_caches_stay_out_of_a_source_that_holds_them(project: Path):
    # `"source": "."` beside the default ./runs: earlier runs, the repository, a venv, caches.
    files = {"runs/local-1/jobs/ckpt.pt": "0" * 4096, ".git/HEAD": "ref\n", "env-3.11/pyvenv.cfg": "home\n",
             "env-3.11/lib/torch.py": "x", "__pycache__/fit.pyc": "x", ".mypy_cache/x.json": "x",
             ".ruff_cache/x": "x", ".pytest_cache/v": "x", "nb/.ipynb_checkpoints/a.ipynb": "x", "nb/a.ipynb": "{}"}
    for name, content in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(content)
    given = job_input(source=str(project), entry_point="src/fit.py", channels={})
    kept = staged_members(given, leave_out=[project / "runs"])
    assert kept == ["data/points/x.npy", "nb/a.ipynb", "src/fit.py"]


def test_what_stabilizerignore_names_stays_out_of_the_source(project: Path):
    src = project / "src"
    (src / "scratch").mkdir()
    (src / "scratch" / "big.bin").write_bytes(b"\0" * 100)
    (src / "notes.tmp").write_text("x")
    (src / "keep.tmp").write_text("x")
    (src / ".stabilizerignore").write_text("# not for the job\nscratch/\n*.tmp\n!keep.tmp\n")
    assert staged_members(job_input(source=str(src), channels={})) == [".stabilizerignore", "fit.py", "keep.tmp"]


class NoEngine:
    """Stands in for LocalEngine: records whether the CLI got as far as starting one, then stages the
    job as the engine does (to the local S3) and stops there as a Ctrl-C would."""

    started: list[bytes] = []

    def __init__(self, run_dir, data_dir, **_: object) -> None:
        self.run_dir = run_dir

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, execution_input, **_: object):
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            s3.create_bucket(Bucket="local")
            staged = stage(execution_input, s3, "local", "jobs/run-1")
            key = staged["job"]["source"].split("/", 3)[3]
            NoEngine.started.append(s3.get_object(Bucket="local", Key=key)["Body"].read())
        raise KeyboardInterrupt


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    import stabilizer.local.engine.engine

    monkeypatch.setattr(stabilizer.local.engine.engine, "LocalEngine", NoEngine)
    NoEngine.started = []
    digits = tmp_path / "digits"
    for channel in ("train", "test"):
        (digits / channel).mkdir(parents=True)
        for name in ("x.npy", "y.npy"):
            (digits / channel / name).write_bytes(b"")
    return ["--data-dir", str(digits)]


def test_the_cli_prints_the_archive_before_launching_and_earlier_runs_stay_out(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_engine: list[str]
):
    monkeypatch.chdir(project)
    (project / "fit.py").write_text("print('fit')\n")
    old_run = project / "runs" / "local-earlier" / "jobs" / "job-1" / "checkpoints"
    old_run.mkdir(parents=True)
    (old_run / "ckpt.pt").write_bytes(b"\0" * 50_000)  # a run from before runs were marked
    given = write(project, job_input(source=".", channels={"points": "data/points"}))
    code = main(["run", "--local", "--plain", "--name", "now", *no_engine, "--input", str(given)])
    out = capsys.readouterr().out
    assert code == 130  # the stand-in engine stops as Ctrl-C would, after staging
    [archive] = NoEngine.started
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert names == ["data/points/x.npy", "fit.py", "input.json", "src/fit.py"]
    [line] = [line for line in out.splitlines() if line.startswith("source: ")]
    assert line.startswith(f"source: . -> sourcedir.tar.gz, 4 files, {len(archive)} B (")
    assert line.endswith("; left out: runs/ (run directory)")
    assert (project / "runs" / ".stabilizer-run").is_file()


def test_the_cli_refuses_a_source_over_the_limit_in_one_line_and_launches_nothing(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    no_engine: list[str],
):
    from stabilizer.source import sourcedir

    monkeypatch.setattr(sourcedir, "MAX_ARCHIVE_BYTES", 64 * 1024)
    (project / "src" / "corpus").mkdir()
    (project / "src" / "corpus" / "words.bin").write_bytes(os.urandom(100_000))
    runs = tmp_path / "runs"
    given = write(project, job_input())
    code = main(["run", "--local", "--run-dir", str(runs), *no_engine, "--input", str(given)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE
    assert not runs.exists() and NoEngine.started == []
    assert len(err) == 1
    assert err[0].startswith(
        f"stabilizer: job.source: {project / 'src'} packs to more than 64.0 KiB, the limit for a source archive "
        "(2 files, 97.7 KiB unpacked); biggest entries: corpus/ 97.7 KiB, fit.py 13 B.")
