"""The command line: help for every subcommand, and bad input reported in one line with nothing
launched (no run directory, no engine). The input model is the workflow domain's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabilizer.cli.commands import EXIT_USAGE, build_parser, main
from stabilizer.client.inputs import InputProblemError, build_input, execution_input_module
from tests.helpers import SAMPLE_DEPLOYMENT_FIELDS, SAMPLE_INPUT

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def state_module():
    return execution_input_module()


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_every_command_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "usage: stabilizer" in text
    if argv[0] == "run":
        for option in (
            "--local",
            "--input",
            "--policy",
            "--run-dir",
            "--data-dir",
            "--plain",
            "--verbose",
            "key=value",
        ):
            assert option in text
        assert "exit status: 0 succeeded or stopped early, 3 unwatched or unverified, 2 diverged" in text


def run_bad(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    runs = tmp_path / "runs"
    code = main(["run", "--local", "--run-dir", str(runs), *argv])
    captured = capsys.readouterr()
    assert code == EXIT_USAGE
    assert not runs.exists(), "nothing may be launched for bad input"
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_missing_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    line = run_bad(["--input", str(tmp_path / "nope.json")], tmp_path, capsys)
    assert line == f"stabilizer: input file not found: {tmp_path / 'nope.json'}"


def test_malformed_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "bad.json"
    bad.write_text('{"policy": "original",\n "run_spec": {')
    line = run_bad(["--input", str(bad)], tmp_path, capsys)
    assert line.startswith(f"stabilizer: input file {bad} is not valid JSON: ")
    assert "line 2 column" in line


def test_input_file_that_is_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    assert "must hold a JSON object, not a list" in run_bad(["--input", str(bad)], tmp_path, capsys)


def test_unknown_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    line = run_bad(["num_epoch=1"], tmp_path, capsys)
    assert line.startswith("stabilizer: unknown key 'num_epoch'; known keys: ")
    assert "num_epochs" in line


def test_wrong_type_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    line = run_bad(["num_epochs=three"], tmp_path, capsys)
    assert line.startswith("stabilizer: run_spec.num_epochs: ")
    assert "'three'" in line


def test_out_of_range_value_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert run_bad(["add_batch_norm=2"], tmp_path, capsys).startswith("stabilizer: run_spec.add_batch_norm: ")


def test_unknown_field_in_the_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "extra.json"
    bad.write_text(json.dumps({"run_spec": {"learning_rat": 0.1}}))
    line = run_bad(["--input", str(bad)], tmp_path, capsys)
    assert line.startswith("stabilizer: run_spec.learning_rat: unknown field")


def test_not_a_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert run_bad(["num_epochs"], tmp_path, capsys) == "stabilizer: expected key=value, got 'num_epochs'"


def test_run_without_local_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["run"]) == EXIT_USAGE
    assert "run needs --local" in capsys.readouterr().err


def test_bad_option_exits_with_the_usage_status(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--policy", "clever"])
    assert exit_.value.code == EXIT_USAGE
    assert "invalid choice: 'clever'" in capsys.readouterr().err


def test_pairs_file_and_policy_combine_into_the_execution_input(tmp_path: Path, state_module):
    given = tmp_path / "input.json"
    given.write_text(json.dumps({"policy": "default", "run_spec": {"num_epochs": 2}}))
    built = build_input(
        state_module=state_module,
        input_file=given,
        pairs=["learning_rate=0.05", "limits.max_num_retraining=3", "activation=relu", "wait_seconds=5"],
        policy="original",
        defaults={"wait_seconds": 2},
    )
    assert built == {
        "policy": "original",
        "wait_seconds": 5,
        "run_spec": {"num_epochs": 2, "learning_rate": 0.05, "activation": "relu"},
        "limits": {"max_num_retraining": 3},
    }
    with pytest.raises(InputProblemError, match=r"unknown key 'limits\.nope'"):
        build_input(state_module=state_module, pairs=["limits.nope=1"])




def test_the_sample_input_file_gets_one_message_with_every_fields_new_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    given = tmp_path / "sample.json"
    given.write_text(json.dumps(SAMPLE_INPUT))
    runs = tmp_path / "runs"
    assert main(["run", "--local", "--run-dir", str(runs), "--input", str(given)]) == EXIT_USAGE
    assert not runs.exists(), "nothing may be launched"
    err = capsys.readouterr().err
    assert err.startswith("stabilizer: input: this is the original sample's flat input")
    assert "unknown field" not in err
    for field in SAMPLE_INPUT:
        assert f"\n  {field}: " in err
    assert "  region: a deployment setting" in err


def test_the_sample_input_without_deployment_settings_is_read_as_meant(tmp_path: Path, state_module):
    given = tmp_path / "sample.json"
    given.write_text(
        json.dumps({k: v for k, v in SAMPLE_INPUT.items() if k not in SAMPLE_DEPLOYMENT_FIELDS})
    )
    built = build_input(
        state_module=state_module,
        input_file=given,
        pairs=["init_warmup_learning_rate=0.05", "max_num_retraining=3"],
        defaults={"wait_seconds": 1, "limits": {"max_monitor_transitions": 3600}},
    )
    assert built["run_spec"]["warmup_learning_rate"] == 0.05  # the pair wins over the file, as for any key
    assert built["run_spec"]["learning_rate"] == 0.1
    assert built["run_spec"]["capture"]["gradients"] == {"save_interval": 100}
    # The file's value is kept; the local default only fills what was not given.
    assert built["limits"] == {"max_num_retraining": 3, "max_monitor_transitions": 300}
    assert "init_warmup_learning_rate" not in built


# --- the header a run starts with ---------------------------------------------------------------


def run_header(state_module, input_file: Path | None = None, pairs: list[str] = (), verbose: bool = False):
    from stabilizer.cli.commands import LOCAL_DEFAULTS, header

    execution_input = build_input(state_module=state_module, input_file=input_file, pairs=list(pairs),
                                  defaults=LOCAL_DEFAULTS)
    return execution_input, header("run-1", Path("runs/run-1"), execution_input, state_module, verbose=verbose)


def test_the_header_says_what_runs_what_watches_it_and_the_limits_in_two_lines(state_module):
    _, text = run_header(state_module, pairs=["num_epochs=1", "max_steps=20", "max_num_retraining=3"])
    assert text.splitlines() == [
        "execution run-1: the reference ResNet with num_epochs=1 max_steps=20; policy default",
        "rules ExplodingTensor, VanishingGradient and the sentinel's own Diverging and NotLearning (stop when one "
        "fires); at most 3 relaunches, 1500 checks 2 s apart, 4 h of training",
        "run directory: runs/run-1",
    ]


def test_the_header_names_the_sentinels_own_checks_whatever_the_rule_list(state_module):
    """The finite check, Diverging and NotLearning run whatever the list says (docs/rules.md); an entry
    under the last two names sets their thresholds and adds no rule."""
    rules = '[{"name":"VanishingGradient"},{"name":"NotLearning","parameters":{"patience":"500"}}]'
    _, text = run_header(state_module, pairs=[f"rules={rules}"])
    assert text.splitlines()[1].startswith(
        "rules VanishingGradient and the sentinel's own finite check, Diverging and NotLearning (stop when one fires)")
    _, text = run_header(state_module, pairs=["rules=[]"])
    assert text.splitlines()[1].startswith(
        "the sentinel's own finite check, Diverging and NotLearning (stop when one fires)")


def test_the_header_names_a_jobs_entry_point_and_source_not_its_whole_input(state_module):
    example = ROOT / "examples" / "mlp-diabetes" / "input.json"
    _, text = run_header(state_module, input_file=example)
    first, second, _ = text.splitlines()
    source = example.parent.resolve()
    shown = source.relative_to(Path.cwd()) if source.is_relative_to(Path.cwd()) else source
    assert first == f"execution run-1: job train.py from {shown} through the launcher; policy default"
    assert second.startswith("rules ExplodingTensor, VanishingGradient and the sentinel's own Diverging and "
                             "NotLearning (stop when one fires); at most 10 relaunches")
    assert "step_size" not in text and "metric_definitions" not in text


def test_verbose_adds_the_whole_execution_input_after_the_header(state_module):
    example = ROOT / "examples" / "mlp-diabetes" / "input.json"
    execution_input, text = run_header(state_module, input_file=example, verbose=True)
    summary, _, whole = text.partition("run directory: runs/run-1\n")
    assert summary.count("\n") == 2
    assert whole.startswith("input: ")
    assert json.loads(whole.removeprefix("input: ")) == execution_input
    assert '"step_size": 1.2' in whole
