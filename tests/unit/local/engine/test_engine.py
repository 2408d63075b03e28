"""The local engine on a small stand-in project: a real ASL interpreter, in-process handlers, and
training jobs as real subprocesses of a stand-in script. The project's own definition and
handlers are exercised end to end in tests/e2e."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from stabilizer.local.engine.deployment import EngineError, Project, fill_placeholders
from stabilizer.local.engine.engine import LocalEngine

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def project() -> Project:
    root = FIXTURES / "project"
    return Project(
        root=root,
        definition=root / "statemachine" / "loop.asl.json",
        lambdas=root / "lambdas",
        model=FIXTURES / "fake_model",
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    for channel, n in (("train", 8), ("test", 4)):
        directory = tmp_path / "data" / channel
        directory.mkdir(parents=True)
        np.save(directory / "x.npy", np.zeros((n, 32, 32, 3), dtype=np.float32))
        np.save(directory / "y.npy", np.arange(n) % 10)
    return tmp_path / "data"


@pytest.mark.slow
def test_rule_stop_then_relaunch_succeeds_through_the_interpreter(tmp_path: Path, project: Project, data_dir: Path):
    events = []
    with LocalEngine(tmp_path / "run", data_dir, project=project) as engine:
        record = engine.run({"poll_seconds": 1}, name="exec-1", observer=events.append)
        history = engine.history(record.execution_arn)

    assert record.status == "SUCCEEDED"
    # Each attempt is watched until it ends: one round of the loop, or more when the machine is slow.
    watched = r"(WaitForProgress Check Decide )+"
    assert re.fullmatch(f"Prepare Launch {watched}Launch {watched}Succeeded", " ".join(record.states)), record.states
    assert [a.status for a in record.attempts] == ["Failed", "Completed"]
    assert record.attempts[0].failure_reason.startswith("AlgorithmError: RuleStop")
    assert record.attempts[0].findings["findings"][0]["rule"] == "ExplodingTensor"
    assert record.attempts[0].explosion() == (1, "ExplodingTensor")
    assert [p.step for p in record.attempts[1].metrics] == [0, 1, 2]
    assert [n.body["decision"] for n in record.notifications] == ["relaunch", "end"]
    assert {e.kind for e in events} >= {"state", "job", "metric", "notification", "finding"}
    assert history[0]["type"] == "ExecutionStarted"
    # The handlers' own output went to lambdas.log, not the terminal.
    assert "prepared" in (tmp_path / "run" / "lambdas.log").read_text()


def test_invalid_input_fails_the_execution_by_name_and_launches_nothing(
    tmp_path: Path, project: Project, data_dir: Path
):
    with LocalEngine(tmp_path / "run", data_dir, project=project) as engine:
        record = engine.run({"nonsense": 1}, name="exec-bad")
        assert engine.sagemaker is not None and engine.sagemaker.jobs == {}
    assert record.status == "FAILED"
    assert record.error == "InvalidInput"
    assert [(i.function_name, i.error_type) for i in engine.lambdas.invocations] == [
        ("stabilizer-train", "InvalidInput")
    ]
    assert "unknown key 'nonsense'" in json.loads(record.cause)["errorMessage"]


def test_unknown_placeholder_is_named():
    with pytest.raises(EngineError, match="SomethingNew"):
        fill_placeholders('{"a": "${SomethingNew}", "b": "${Known}"}', {"Known": "x"})


def test_missing_data_is_reported_before_anything_starts(tmp_path: Path, project: Project):
    with pytest.raises(EngineError, match="no data for the train channel"):
        LocalEngine(tmp_path / "run", tmp_path / "nowhere", project=project).__enter__()


@pytest.mark.slow  # its Launch starts a training job, whose process may start before the stop
def test_closing_stops_executions_still_running(tmp_path: Path, project: Project, data_dir: Path):
    sfn_status = "RUNNING"
    with LocalEngine(tmp_path / "run", data_dir, project=project) as engine:
        arn = engine.start_execution({"poll_seconds": 30, "mode": "hang"}, name="exec-left")
        deadline = time.monotonic() + 30
        entered: list[str] = []
        while "WaitForProgress" not in entered:
            assert time.monotonic() < deadline, "the execution never reached its first wait"
            time.sleep(0.05)
            entered = [e.get("stateEnteredEventDetails", {}).get("name") for e in engine.history(arn)]
        assert engine.stop_running_executions() == [arn]
        # The interpreter's thread reflects the stop as it leaves its current state.
        while sfn_status == "RUNNING":
            assert time.monotonic() < deadline, "the execution did not stop"
            time.sleep(0.05)
            sfn_status = engine.client("stepfunctions").describe_execution(executionArn=arn)["status"]
        assert engine.stop_running_executions() == []
    assert sfn_status == "ABORTED"


def test_the_projects_placeholders_come_from_the_one_map_cdk_reads_too(tmp_path: Path):
    from stabilizer.local.engine.deployment import LocalSettings, placeholder_values
    from stabilizer.local.engine.lambda_seam import LocalLambdas

    real = Project.discover(Path(__file__).resolve().parents[4])
    values = placeholder_values(real.placeholder_map, LocalSettings(), LocalLambdas("us-east-1", "123456789012"))
    filled = fill_placeholders(real.definition.read_text(), values)
    assert "${" not in filled and "arn:aws:states:::lambda:invoke" in filled
    assert values["WatchFunctionArn"].endswith(":function:stabilizer-watch")

    # A key the engine has no local value for is named, not guessed from the placeholder's name.
    with pytest.raises(EngineError, match="no local value for bucket_name"):
        placeholder_values({"BucketName": "bucket_name"}, LocalSettings(), LocalLambdas("us-east-1", "1"))
    # A definition without its map beside it cannot start.
    (tmp_path / "statemachine").mkdir()
    (tmp_path / "statemachine" / "x.asl.json").write_text("{}")
    orphan = Project(tmp_path, tmp_path / "statemachine" / "x.asl.json", real.lambdas, real.model)
    with pytest.raises(EngineError, match="no placeholder map"):
        orphan.placeholder_map  # noqa: B018 - the property raises
