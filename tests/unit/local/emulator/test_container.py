"""The container contract one local training job runs under, read without starting a job."""

from __future__ import annotations

import json
from pathlib import Path

from stabilizer.local.emulator.container import Container, decode_hyperparameters, to_cmd_args, user_script_error


def test_hyperparameters_are_decoded_and_passed_as_the_toolkit_does():
    decoded = decode_hyperparameters({"lr": "0.1", "name": "elu", "flag": "true", "rules": "[1, 2]"})
    assert decoded == {"lr": 0.1, "name": "elu", "flag": True, "rules": [1, 2]}
    assert to_cmd_args(decoded) == ["--flag", "True", "--lr", "0.1", "--name", "elu", "--rules", "[1, 2]"]
    assert to_cmd_args({"capture": {"b": 1, "a": 2}}) == ["--capture", "a=2,b=1"]


def test_the_scripts_environment_speaks_of_the_job_directory_as_the_toolkit_would_of_opt_ml(tmp_path: Path):
    request = {
        "HyperParameters": {
            "sagemaker_program": json.dumps("fit.py"),
            "sagemaker_submit_directory": json.dumps("s3://bucket/source.tar.gz"),
            "sagemaker_stabilizer": json.dumps({"rules": ["ExplodingTensor"]}),
            "lr": "0.1",
        },
        "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": "s3://bucket/t/"}}}],
        "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints", "LocalPath": "/opt/ml/ckpt"},
        "Environment": {"STABILIZER_TENSOR_DIR": "/opt/ml/ckpt/tensors", "COLOUR": "blue"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1},
    }
    container = Container(tmp_path / "job", request)
    env = container.environment(container.hyperparameters, job_name="job", job_arn="arn:job", extra_env={})

    training_env = json.loads(env["SM_TRAINING_ENV"])
    for name in ("model_dir", "input_dir", "input_config_dir", "output_dir", "output_data_dir", "module_dir"):
        assert env[f"SM_{name.upper()}"] == training_env[name]
        assert Path(training_env[name]).is_relative_to(tmp_path / "job")
    assert env["SM_CHANNEL_TRAIN"] == str(tmp_path / "job" / "input" / "data" / "train")
    assert env["SM_MODULE_NAME"] == "fit" and env["SM_USER_ENTRY_POINT"] == "fit.py"
    # The script's own hyperparameters, decoded; framework ones stay out of its arguments.
    assert json.loads(env["SM_HPS"]) == {"lr": 0.1}
    assert json.loads(env["SM_USER_ARGS"]) == ["--lr", "0.1"]
    assert training_env["additional_framework_parameters"] == {"sagemaker_stabilizer": {"rules": ["ExplodingTensor"]}}
    # The request's container paths and the checkpoint directory live in the job directory.
    assert env["STABILIZER_TENSOR_DIR"] == str(tmp_path / "job" / "ckpt" / "tensors")
    assert env["STABILIZER_CHECKPOINT_DIR"] == str(tmp_path / "job" / "ckpt")
    assert env["COLOUR"] == "blue"


def test_packages_this_machine_adds_as_the_images_come_after_the_jobs_own_path(tmp_path: Path):
    request = {
        "HyperParameters": {"sagemaker_program": json.dumps("fit.py")},
        "Environment": {"PYTHONPATH": "/opt/ml/input/data/stabilizer:/opt/ml/input/data/stabilizer/autostart"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1},
    }
    container = Container(tmp_path / "job", request)
    env = container.environment(container.hyperparameters, job_name="job", job_arn="arn:job",
                                extra_env={"PYTHONPATH": "/standins"})
    library = tmp_path / "job" / "input" / "data" / "stabilizer"
    assert env["PYTHONPATH"].split(":") == [str(library), str(library / "autostart"), "/standins"]
    del request["Environment"]
    env = container.environment(container.hyperparameters, job_name="job", job_arn="arn:job",
                                extra_env={"PYTHONPATH": "/standins"})
    assert env["PYTHONPATH"] == "/standins"


def test_a_script_that_failed_gets_the_toolkits_reason_its_error_and_command():
    # sagemaker-training-toolkit (process.check_error, errors._CalledProcessError): the output from the first
    # line naming an error on, each line once, then the command.
    log = ["step=0 loss=2.3", "Traceback (most recent call last):", '  File "fit.py", line 9, in <module>',
           "    raise ValueError('the data is bad')", "ValueError: the data is bad", "ValueError: the data is bad"]
    command = ("/usr/bin/python3", "fit.py", "--lr", "1.6")
    assert user_script_error(1, log, command) == (
        'ExecuteUserScriptError:\nExitCode 1\nErrorMessage "raise ValueError(\'the data is bad\')\n'
        'ValueError: the data is bad"\nCommand "/usr/bin/python3 fit.py --lr 1.6"'
    )
    # argparse names no error class: the message is empty, the command still says what was passed.
    refused = ["usage: fit.py [-h] [--steps STEPS]", "fit.py: error: argument --steps: invalid int value: '60.0'"]
    assert user_script_error(2, refused, ("python", "fit.py", "--steps", "60.0")) == (
        'ExecuteUserScriptError:\nExitCode 2\nErrorMessage ""\nCommand "python fit.py --steps 60.0"'
    )
