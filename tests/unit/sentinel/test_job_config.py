"""The sagemaker_stabilizer configuration: where it is read from, how it is decoded, how it fails."""

from __future__ import annotations

import json

import pytest

from stabilizer_sentinel.job_config import (
    DEFAULT_LOSS_REGEX,
    StabilizerConfigError,
    load_config,
    parse_config,
)
from tests.helpers import JobDirs, run_train

CONFIG = {"rules": [{"name": "VanishingGradient"}], "action": "notify", "integration": "launcher",
          "loss_regex": r"train_loss=(\S+)", "knobs": {"learning_rate": {"hyperparameter": "lr"}}}


def test_it_is_read_from_the_jobs_hyperparameters_json_as_the_sdk_encodes_it(tmp_path):
    config_dir = tmp_path / "input" / "config"
    config_dir.mkdir(parents=True)
    # The SDK sends json.dumps(value): an object becomes its JSON text; text becomes quoted text.
    for encoded in (json.dumps(CONFIG), json.dumps(json.dumps(CONFIG))):
        (config_dir / "hyperparameters.json").write_text(json.dumps({"lr": "0.1", "sagemaker_stabilizer": encoded}))
        config = load_config({"SM_INPUT_CONFIG_DIR": str(config_dir)})
        assert (config.rules, config.action, config.integration) == (CONFIG["rules"], "notify", "launcher")
        assert config.knobs == CONFIG["knobs"]


def test_a_job_without_it_gets_the_finite_check_and_stop(tmp_path):
    config = load_config({"SM_INPUT_CONFIG_DIR": str(tmp_path)})
    assert config.effective_rules == [{"name": "ExplodingTensor"}]
    assert (config.effective_action, config.effective_loss_regex) == ("stop", DEFAULT_LOSS_REGEX)


def test_the_job_wins_over_the_scripts_defaults_field_by_field():
    config = parse_config(json.dumps({"action": "notify"})).with_defaults(
        rules=[{"name": "LossNotDecreasing"}], action="stop")
    assert (config.rules, config.action) == ([{"name": "LossNotDecreasing"}], "notify")


def test_the_default_loss_regex_reads_loss_but_not_validation_losses():
    import re

    pattern = re.compile(DEFAULT_LOSS_REGEX)
    assert pattern.search("step=3 epoch=0 loss=2.31 lr=0.1").group(1) == "2.31"
    assert pattern.search("Epoch 1 | loss: nan").group(1) == "nan"
    assert pattern.search("eval epoch=1 test_loss=0.61 val_loss=0.7") is None
    assert pattern.search("epoch 2 loss 0.93").group(1) == "0.93"
    assert pattern.search("step 3 loss = 1.5e-3").group(1) == "1.5e-3"
    # A term named by a number is not the loss: stop 87's harm hunt, a multi-task script printing "loss1 2.31 loss2
    # 0.81" read as a loss of 1 at every step, and its run, whose weights moved, called Diverging.
    assert pattern.search("step 0 loss1 2.314777 loss2 0.805836") is None


@pytest.mark.parametrize("raw,field", [
    ('{"action": "halt"}', "sagemaker_stabilizer.action"),
    ('{"integration": "magic"}', "sagemaker_stabilizer.integration"),
    ('{"rules": {"name": "ExplodingTensor"}}', "sagemaker_stabilizer.rules"),
    ('{"loss_regex": "loss=\\\\S+"}', "sagemaker_stabilizer.loss_regex"),
    ('{"skip_batches": "ae34d7886d4ea499"}', "sagemaker_stabilizer.skip_batches"),
    ('{"skip_batches": ["batch 61"]}', "sagemaker_stabilizer.skip_batches"),
    ('{"skip_batches": ["ae34d7886d4ea499\\n"]}', "sagemaker_stabilizer.skip_batches"),
    ('{"skip_nonfinite_batches": "yes"}', "sagemaker_stabilizer.skip_nonfinite_batches"),
    ('{"skip_nonfinite_batches": 1}', "sagemaker_stabilizer.skip_nonfinite_batches"),
    ('{"objective": {"name": "reward", "regex": "reward (\\\\S+)"}}', "sagemaker_stabilizer.objective"),
    ('{"objective": {"name": "reward", "regex": "reward (\\\\S+)", "type": "Max"}}',
     "sagemaker_stabilizer.objective.type"),
    ('{"objective": {"name": "reward", "regex": "reward \\\\S+", "type": "Maximize"}}',
     "sagemaker_stabilizer.objective.regex"),
    ('{"objective": {"name": "", "regex": "reward (\\\\S+)", "type": "Maximize"}}',
     "sagemaker_stabilizer.objective.name"),
    ('{"rule": []}', "unknown keys ['rule']"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_configuration_is_rejected_naming_the_field(raw, field):
    with pytest.raises(StabilizerConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_config(raw)


@pytest.mark.slow
def test_train_py_takes_its_monitoring_from_the_configuration_before_its_own_hyperparameters(tmp_path,
                                                                                              digits_channels):
    job = JobDirs(tmp_path / "job")
    config_dir = tmp_path / "job" / "input" / "config"
    config_dir.mkdir(parents=True)
    capture = {"losses": {"save_interval": 1}}
    (config_dir / "hyperparameters.json").write_text(json.dumps({"sagemaker_stabilizer": json.dumps(
        {"capture": capture})}))
    result = run_train(["--dry-run", "--capture", "{}"], job.env(digits_channels, SM_INPUT_CONFIG_DIR=str(config_dir)))
    assert result.returncode == 0, result.stdout + result.stderr
    from stabilizer_sentinel import create_trial

    assert create_trial(job.checkpoints / "tensors").tensor("losses/loss").steps() == [0, 1, 2]

    (config_dir / "hyperparameters.json").write_text(json.dumps({"sagemaker_stabilizer": '{"action": "halt"}'}))
    bad = run_train(["--dry-run"], job.env(digits_channels, SM_INPUT_CONFIG_DIR=str(config_dir)))
    assert bad.returncode == 2
    assert job.failure.read_text().startswith("HyperparameterError: sagemaker_stabilizer.action")
