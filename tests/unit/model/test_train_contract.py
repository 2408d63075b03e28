"""model/train.py under the SageMaker script-mode contract, run as a real process."""

import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.helpers import MODEL_DIR, TRAIN_SCRIPT, model_module, run_train, step_lines

_recipe = model_module("recipe")
Config, HyperparameterError, parse_config = _recipe.Config, _recipe.HyperparameterError, _recipe.parse_config


@pytest.mark.slow
def test_help_documents_every_hyperparameter():
    result = subprocess.run([sys.executable, str(TRAIN_SCRIPT), "--help"], capture_output=True, text=True,
                            cwd=MODEL_DIR, check=True)
    for name in Config.__dataclass_fields__:
        assert f"--{name}" in result.stdout
    assert "--dry-run" in result.stdout


def test_hyperparameters_come_from_sm_hps_and_the_command_line_wins():
    environ = {"SM_HPS": json.dumps({"learning_rate": "0.05", "add_batch_norm": "1", "batch_size": "64",
                                     "sagemaker_program": "train.py"})}
    config, dry_run = parse_config(["--batch_size", "32", "--sagemaker_region", "us-east-1"], environ)
    assert (config.learning_rate, config.add_batch_norm, config.batch_size, dry_run) == (0.05, True, 32, False)


def test_defaults_are_the_reference_recipe():
    config, _ = parse_config([], {})
    assert (config.warmup_learning_rate, config.learning_rate, config.warmup_epochs) == (0.1, 0.1, 1)
    assert (config.add_batch_norm, config.batch_size, config.depth, config.activation) == (False, 128, 20, "elu")
    assert config.grad_clip == 0


@pytest.mark.parametrize("argv,message", [
    (["--learning_rat", "0.1"], "unknown hyperparameter --learning_rat"),
    (["--add_batch_norm", "maybe"], "expected 0/1 or true/false"),
    (["--sentinel_rules", "{}"], "expected a JSON list"),
    (["--batch_size", "0"], "--batch_size must be at least 1"),
])
def test_bad_hyperparameters_are_rejected_naming_the_field(argv, message):
    with pytest.raises(HyperparameterError) as raised:
        parse_config(argv, {})
    assert message in str(raised.value)


@pytest.mark.slow
def test_a_bad_hyperparameter_exits_2_with_the_reason_in_the_failure_file(job_dirs, digits_channels):
    result = run_train(["--learning_rate", "fast"], job_dirs.env(digits_channels))
    assert result.returncode == 2
    reason = job_dirs.failure.read_text()
    assert reason.startswith("HyperparameterError: argument --learning_rate") and "fast" in reason


@pytest.mark.slow
def test_a_dry_run_writes_the_model_and_a_checkpoint_and_logs_lines_a_metric_definition_reads(job_dirs,
                                                                                             digits_channels):
    import re

    result = run_train(["--dry-run", "--log_every", "1"], job_dirs.env(digits_channels))
    assert result.returncode == 0, result.stderr
    assert len(step_lines(result.stdout)) == 3
    assert (job_dirs.model / "model.pt").is_file()
    assert json.loads((job_dirs.model / "config.json").read_text())["depth"] == 20
    checkpoints = sorted(job_dirs.checkpoints.glob("checkpoint-*.pt"))
    assert [c.name for c in checkpoints] == ["checkpoint-00000003.pt"]
    pattern = re.compile(r"step=(\d+) .*loss=(\S+) lr=(\S+) grad_norm=(\S+)")
    matches = [pattern.search(line) for line in result.stdout.splitlines() if line.startswith("step=")]
    assert [m.group(1) for m in matches] == ["0", "1", "2"]
    assert all(math.isfinite(float(m.group(2))) for m in matches)
    assert re.search(r"eval epoch=1 test_loss=\S+ test_accuracy=[\d.]+", result.stdout)


@pytest.mark.long  # make test reads a one-hot channel back in process (test_data.py)
def test_one_hot_labels_are_accepted(job_dirs, tmp_path, digits_channels):
    _data = model_module("data")
    read_channel, write_channel = _data.read_channel, _data.write_channel

    x, y = read_channel(digits_channels["train"])
    one_hot = np.eye(10, dtype=np.float32)[y[:64]]
    channel = write_channel(tmp_path / "onehot", x[:64], one_hot)
    result = run_train(["--dry-run"], job_dirs.env({"train": channel, "test": channel}))
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.long
def test_resume_continues_exactly_where_an_uninterrupted_run_would(tmp_path, digits_channels):
    from tests.helpers import JobDirs

    args = ["--add_batch_norm", "1", "--checkpoint_every", "4", "--log_every", "1", "--batch_size", "64"]
    straight = JobDirs(tmp_path / "straight")
    uninterrupted = run_train([*args, "--max_steps", "8"], straight.env(digits_channels))
    interrupted = JobDirs(tmp_path / "interrupted")
    first = run_train([*args, "--max_steps", "4"], interrupted.env(digits_channels))
    second = run_train([*args, "--max_steps", "8"], interrupted.env(digits_channels))
    assert uninterrupted.returncode == first.returncode == second.returncode == 0
    assert "resumed from" in second.stdout and "at step 4" in second.stdout
    expected = [row for row in step_lines(uninterrupted.stdout) if int(row["step"]) >= 4]
    assert step_lines(second.stdout) == expected
    assert len(expected) == 4


@pytest.mark.long  # make test's Ctrl-C run (test_local_mode.py) checks train.py's checkpoint at SIGTERM
def test_sigterm_checkpoints_and_exits_zero(job_dirs, digits_channels):
    env = job_dirs.env(digits_channels)
    process = subprocess.Popen([sys.executable, str(TRAIN_SCRIPT), "--num_epochs", "50", "--log_every", "1",
                                "--add_batch_norm", "1", "--checkpoint_every", "1000"],
                               cwd=MODEL_DIR, env=env, stdout=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("step=2 "):
            break
    process.send_signal(signal.SIGTERM)
    rest = process.communicate(timeout=30)[0]  # a stop that hangs fails here
    assert process.returncode == 0
    assert "stopped by SIGTERM" in rest
    # The checkpoint holds exactly the state after the last step taken: nothing lost on stop.
    last_step = max(int(row["step"]) for row in step_lines(rest)) if step_lines(rest) else 2
    checkpoint = max(job_dirs.checkpoints.glob("checkpoint-*.pt"))
    assert torch.load(checkpoint, weights_only=True)["next_step"] == last_step + 1
    assert not (job_dirs.model / "model.pt").exists()


@pytest.mark.slow
def test_a_crash_writes_a_one_line_reason_and_exits_non_zero(job_dirs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_train([], job_dirs.env({"train": empty, "test": empty}))
    assert result.returncode == 1
    reason = job_dirs.failure.read_text()
    assert reason.count("\n") == 1
    assert reason.startswith("FileNotFoundError:") and "x.npy" in reason
