"""A job of one's own: the `job` input, its knobs, remedies through knobs, its request, and the
checks at ValidateInput that reject bad input before anything is launched."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import boto3
import pytest
from moto import mock_aws

from stabilizer_contract.catalogue import CATALOGUE
from stabilizer_workflow.errors import InvalidInput, MisconfiguredEnvironment
from stabilizer_workflow.evidence.observation import observe
from stabilizer_workflow.execution.execution_input import parse_execution_input
from stabilizer_workflow.execution.state import Finding
from stabilizer_workflow.launch import attempts as launching
from stabilizer_workflow.launch import requests
from stabilizer_workflow.launch.images import check_image_fits_instance, image_accelerator
from stabilizer_workflow.launch.sources import SourceArchives
from stabilizer_workflow.monitoring import monitor
from stabilizer_workflow.remedies import policy
from stabilizer_workflow.settings import TrainSettings
from tests.unit.workflow.conftest import ENV, EXECUTION, T0, describe, sentinel_findings
from tests.unit.workflow.launch.test_requests import assert_valid

CPU_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-cpu-py311-ubuntu22.04-sagemaker"
GPU_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
SOURCE = "s3://user-bucket/jobs/regression/sourcedir.tar.gz"


@pytest.fixture
def job_settings() -> TrainSettings:
    # The user's job lives in their own bucket, which this deployment grants (data_buckets).
    return TrainSettings.from_env(
        {**ENV, "LIBRARY_S3_URI": "s3://stabilizer-bucket/library/", "DATA_BUCKETS": "user-bucket"}
    )


def job(**changes: Any) -> dict[str, Any]:
    """A user's regression script: its own names for everything, two knobs."""
    base = {
        "source": SOURCE,
        "entry_point": "fit.py",
        "image": GPU_IMAGE,
        "instance_type": "ml.g5.xlarge",
        "hyperparameters": {"lr": 1.6, "steps": 60, "clip": 0.0, "seed": 0},
        "channels": {"points": "s3://user-bucket/jobs/regression/points/"},
        "metric_definitions": [{"Name": "train:loss", "Regex": r"mse=(\S+)"}],
        "loss_metric": "train:loss",
        "knobs": {
            "learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 10.0},
            "grad_clip": {"hyperparameter": "clip", "type": "float", "min": 0.0, "max": 10.0},
        },
    }
    return {**base, **changes}


def prepared(settings: TrainSettings, raw_job: dict[str, Any], **top: Any):
    return launching.prepare({"job": raw_job, **top}, EXECUTION, settings)


def problem(settings: TrainSettings, raw: dict[str, Any], sources: Any = None) -> str:
    with pytest.raises(InvalidInput) as caught:
        launching.prepare(raw, EXECUTION, settings, sources)
    return str(caught.value)


# --- the input model ---------------------------------------------------------------------------


def test_a_job_input_becomes_the_state_job_and_the_first_recipe(job_settings):
    state = prepared(job_settings, job())
    assert state.run_spec == {"lr": 1.6, "steps": 60, "clip": 0.0, "seed": 0}
    assert state.job.entry_point == "fit.py"
    assert state.job.instance_type == "ml.g5.xlarge"
    assert state.job.image == GPU_IMAGE
    assert set(state.job.knobs.declared()) == {"learning_rate", "grad_clip"}
    # Default monitoring applies to a job too: the finite check's rule is always there.
    assert [rule.name for rule in state.monitoring.rules] == ["ExplodingTensor", "VanishingGradient"]


def test_image_and_instance_default_to_the_deployment(job_settings):
    state = prepared(job_settings, job(image=None, instance_type=None))
    assert (state.job.image, state.job.instance_type) == (ENV["TRAINING_IMAGE_URI"], ENV["DEFAULT_INSTANCE_TYPE"])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"job": {"entry_point": "fit.py"}}, "job.source: Field required"),
        ({"job": job(source="")}, "job.source: String should have at least 1 character"),
        (
            {"job": job(source="/home/me/regression")},
            "job.source: expected the s3:// URI of a source archive (sourcedir.tar.gz), got '/home/me/regression'",
        ),
        ({"job": job(entry_point="../fit.py")}, "job.entry_point: expected a path relative to the source"),
        (
            {
                "job": job(
                    knobs={"learning_rate": {"hyperparameter": "learning_rate", "type": "float", "min": 0, "max": 1}}
                )
            },
            "job.knobs.learning_rate.hyperparameter: 'learning_rate' is not one of the job's hyperparameters "
            "(clip, lr, seed, steps)",
        ),
        (
            {"job": job(knobs={"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-4, "max": 1.0}})},
            "job.knobs.learning_rate: hyperparameters.lr 1.6 is outside the knob's bounds [0.0001, 1]",
        ),
        (
            {"job": job(knobs={"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 2.0, "max": 1.0}})},
            "job.knobs.learning_rate: min 2 is above max 1",
        ),
        (
            {"job": job(knobs={"learning_rate": {"hyperparameter": "lr", "type": "float", "min": -1.0, "max": 10.0}})},
            "job.knobs.learning_rate: min -1 is below 0, the least a learning rate can be",
        ),
        (
            {"job": job(knobs={"batch_size": {"hyperparameter": "seed", "type": "int", "min": 0, "max": 64}})},
            "job.knobs.batch_size: min 0 is below 1, the least a batch size can be",
        ),
        (
            {"job": job(knobs={"learning_rate": {"hyperparameter": "lr", "type": "float"}})},
            "job.knobs.learning_rate: a float knob needs both min and max",
        ),
        (
            {"job": job(knobs={"lr_decay": {"hyperparameter": "lr", "type": "float", "min": 0, "max": 2}})},
            "job.knobs.lr_decay: unknown knob role; the roles are learning_rate, warmup_learning_rate, "
            "warmup_length, normalization, grad_clip, batch_size, activation",
        ),
        (
            {"job": job(knobs={"normalization": {"hyperparameter": "lr", "type": "float", "min": 0, "max": 2}})},
            "job.knobs.normalization: a normalization knob is of type bool or int, not float",
        ),
        (
            {"job": job(knobs={"normalization": {"hyperparameter": "steps", "type": "int", "min": 0, "max": 60}})},
            "job.knobs.normalization: an int switch has min 0 and max 1",
        ),
        (
            {"job": job(knobs={"activation": {"hyperparameter": "seed", "type": "choice", "values": ["relu", "elu"]}})},
            "job.knobs.activation: hyperparameters.seed 0 is not one of the knob's values ['relu', 'elu']",
        ),
        (
            {"job": job(hyperparameters={"act": "relu", "lr": 1.6}, knobs={
                "activation": {"hyperparameter": "act", "type": "choice", "values": ["g" * 255, "relu"]}})},
            "job.knobs.activation: each value is at most 256 characters as JSON (a remedy sends it as the "
            "hyperparameter, and the state keeps it for every attempt); 257 given",
        ),
        (  # counted as sent: json.dumps escapes each character outside ASCII (this one in 12 characters)
            {"job": job(hyperparameters={"act": "relu", "lr": 1.6}, knobs={
                "activation": {"hyperparameter": "act", "type": "choice", "values": ["\U0001d11e" * 22, "relu"]}})},
            "job.knobs.activation: each value is at most 256 characters as JSON",
        ),
        (
            {"job": job(hyperparameters={"sagemaker_program": "x.py"}, knobs={})},
            "job.hyperparameters.sagemaker_program",
        ),
        ({"job": job(channels={"stabilizer": "s3://b/k/"})}, "job.channels.stabilizer: the workflow adds this channel"),
        (
            {"job": job(channels={"points": "s3://user-bucket/" + "k" * 1008})},
            "job.channels.points: a location of 1,025 characters; SageMaker takes an S3 URI of at most 1,024",
        ),
        (
            {"job": job(loss_metric="loss")},
            "job.loss_metric: 'loss' is not the Name of any metric_definitions entry (train:loss)",
        ),
        (
            {"job": job(objective={"MetricName": "reward", "Type": "Maximize"})},
            "job.objective.MetricName: 'reward' is not the Name of any metric_definitions entry (train:loss)",
        ),
        ({"job": job(objective={"MetricName": "train:loss", "Type": "Max"})}, "job.objective.Type"),
        ({"job": job(objective={"MetricName": "train:loss"})}, "job.objective.Type"),
        (
            {"job": job(metric_definitions=[{"Name": "train:loss", "Regex": "mse=\\S+"}])},
            "job.metric_definitions.0.Regex: needs one capture group",
        ),
        ({"job": job(), "run_spec": {"num_epochs": 1}}, "run_spec: tunes the reference job only"),
        (
            {"run_spec": {"rules": []}, "monitoring": {"rules": []}},
            "run_spec.rules: given twice; give it once, in monitoring.rules",
        ),
        (
            {"job": job(image=CPU_IMAGE)},
            f"job.image: {CPU_IMAGE} is a CPU image but ml.g5.xlarge is a GPU instance",
        ),
        (
            {"job": job(instance_type="ml.m5.xlarge")},
            f"job.image: {GPU_IMAGE} is a GPU image but ml.m5.xlarge has no NVIDIA GPU",
        ),
        (
            {"job": job(image=None, instance_type="ml.m5.2xlarge")},
            "job.instance_type: 763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-gpu-py311 is a "
            "GPU image but ml.m5.2xlarge has no NVIDIA GPU (the deployment's training image)",
        ),
    ],
)
def test_bad_job_input_is_rejected_naming_the_field(job_settings, raw, expected):
    assert expected in problem(job_settings, raw)


def test_the_channel_bound_is_sagemakers():
    import botocore.session

    from stabilizer_workflow.execution.job import MAX_URI_CHARS

    assert botocore.session.get_session().get_service_model("sagemaker").shape_for("S3Uri").metadata["max"] == \
        MAX_URI_CHARS


def test_the_older_form_names_its_own_instance_field(settings):
    text = problem(settings, {"run_spec": {"instance_type": "ml.c5.xlarge"}})
    assert text.startswith("run_spec.instance_type: ")
    assert "is a GPU image but ml.c5.xlarge has no NVIDIA GPU" in text


def test_a_job_needs_the_library_location_in_the_deployment(settings):
    with pytest.raises(MisconfiguredEnvironment, match="LIBRARY_S3_URI"):
        prepared(settings, job())


def test_image_by_framework_and_version_needs_the_lookup_or_says_so(job_settings):
    text = problem(job_settings, {"job": job(image={"framework": "pytorch", "version": "2.5.1"})})
    assert text.startswith("job.image.framework: ")


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        (GPU_IMAGE, "gpu"),
        (CPU_IMAGE, "cpu"),
        ("123.dkr.ecr.us-east-1.amazonaws.com/mine:cu121-torch2", "gpu"),
        ("123.dkr.ecr.us-east-1.amazonaws.com/mine:latest", None),
        ("123.dkr.ecr.us-east-1.amazonaws.com/mine", None),
    ],
)
def test_image_tags_say_what_they_run_on(uri, kind):
    assert image_accelerator(uri) == kind


def test_an_image_whose_tag_says_nothing_is_not_rejected():
    check_image_fits_instance("ml.p4d.24xlarge", "123.dkr.ecr.us-east-1.amazonaws.com/mine:latest")
    with pytest.raises(InvalidInput, match=r"job\.image"):
        check_image_fits_instance("ml.trn1.2xlarge", GPU_IMAGE)


# --- the entry point in the archive (S3 at the AWS edge) ---------------------------------------


def _archive(*names: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in names:
            data = b"print('hello')\n"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="user-bucket")
        yield client


def test_the_entry_point_is_found_in_the_archive(job_settings, s3):
    s3.put_object(Bucket="user-bucket", Key="jobs/regression/sourcedir.tar.gz", Body=_archive("./fit.py", "util.py"))
    state = launching.prepare({"job": job()}, EXECUTION, job_settings, SourceArchives(s3))
    assert state.job.entry_point == "fit.py"


def test_an_entry_point_missing_from_the_archive_is_rejected_before_launch(job_settings, s3):
    s3.put_object(Bucket="user-bucket", Key="jobs/regression/sourcedir.tar.gz", Body=_archive("train.py", "util.py"))
    text = problem(job_settings, {"job": job()}, SourceArchives(s3))
    assert text == (f"job.entry_point: 'fit.py' is not in {SOURCE}; its top-level scripts: train.py, util.py")


def test_a_custom_rule_s_file_must_be_in_the_archive_and_reaches_the_job(job_settings, s3):
    s3.put_object(Bucket="user-bucket", Key="jobs/regression/sourcedir.tar.gz",
                  Body=_archive("fit.py", "stabilizer_custom_rules/check.py"))
    rule = {"name": "CheckAccuracy", "parameters": {"source_s3_uri": "stabilizer_custom_rules/check.py",
                                                    "rule_to_invoke": "CheckAccuracy", "threshold": "0.05"}}
    given = {"job": job(), "monitoring": {"rules": [rule]}}
    state = launching.prepare(given, EXECUTION, job_settings, SourceArchives(s3))
    request = requests.build_create_training_job(state, job_settings, 1)
    assert json.loads(request["HyperParameters"]["sagemaker_stabilizer"])["rules"] == [rule]  # the engine runs it
    missing = {**rule, "parameters": {**rule["parameters"], "source_s3_uri": "rules/other.py"}}
    assert problem(job_settings, {"job": job(), "monitoring": {"rules": [missing]}}, SourceArchives(s3)) == (
        f"monitoring.rules (CheckAccuracy).source_s3_uri: 'rules/other.py' is not in {SOURCE}")


def test_a_missing_archive_or_one_that_is_not_a_tar_is_named(job_settings, s3):
    assert problem(job_settings, {"job": job()}, SourceArchives(s3)) == f"job.source: no object at {SOURCE}"
    s3.put_object(Bucket="user-bucket", Key="jobs/regression/sourcedir.tar.gz", Body=b"not a tar")
    assert problem(job_settings, {"job": job()}, SourceArchives(s3)).startswith(f"job.source: {SOURCE} is not a tar")


def test_the_reference_job_never_reads_an_archive(settings):
    class Refuses:
        def members(self, uri: str):
            raise AssertionError(f"read {uri}")

    assert launching.prepare({}, EXECUTION, settings, Refuses()).job.entry_point == "train.py"


# --- the request -------------------------------------------------------------------------------


def test_the_request_launches_the_users_job_with_the_library(job_settings):
    state = launching.launch(prepared(job_settings, job(instance_count=2)), job_settings, T0).state
    request = requests.build_create_training_job(state, job_settings, 1)
    assert_valid(request)
    hps = request["HyperParameters"]
    assert {key: json.loads(value) for key, value in hps.items() if not key.startswith("sagemaker_")} == {
        "lr": 1.6,
        "steps": 60,
        "clip": 0.0,
        "seed": 0,
    }
    # The reference script's own sentinel settings never reach somebody else's script.
    assert "sentinel_rules" not in hps and "capture" not in hps
    assert json.loads(hps["sagemaker_program"]) == "fit.py"
    assert json.loads(hps["sagemaker_submit_directory"]) == SOURCE
    config = json.loads(hps["sagemaker_stabilizer"])
    assert config["knobs"] == {"learning_rate": "lr", "grad_clip": "clip"}
    assert config["loss_regex"] == r"mse=(\S+)"
    assert config["integration"] == "auto"
    assert [rule["name"] for rule in config["rules"]] == ["ExplodingTensor", "VanishingGradient"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}
    assert channels == {
        "points": "s3://user-bucket/jobs/regression/points/",
        "stabilizer": "s3://stabilizer-bucket/library/",
    }
    assert request["Environment"]["PYTHONPATH"] == (
        "/opt/ml/input/data/stabilizer:/opt/ml/input/data/stabilizer/stabilizer_sentinel/autostart"
    )
    assert request["AlgorithmSpecification"]["TrainingImage"] == GPU_IMAGE
    assert request["AlgorithmSpecification"]["MetricDefinitions"] == [{"Name": "train:loss", "Regex": r"mse=(\S+)"}]
    assert request["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 2


def test_a_jobs_objective_reaches_the_library_with_its_metric_definitions_regex(job_settings):
    reward = {"Name": "train:reward", "Regex": r"Average reward: (\S+)"}
    given = job(metric_definitions=[{"Name": "train:loss", "Regex": r"mse=(\S+)"}, reward],
                objective={"MetricName": "train:reward", "Type": "Maximize"})
    state = launching.launch(prepared(job_settings, given), job_settings, T0).state
    request = requests.build_create_training_job(state, job_settings, 1)
    assert_valid(request)
    config = json.loads(request["HyperParameters"]["sagemaker_stabilizer"])
    assert config["objective"] == {"name": "train:reward", "regex": r"Average reward: (\S+)", "type": "Maximize"}
    # and the library reads it as it was sent
    from stabilizer_sentinel.job_config import parse_config

    assert parse_config(request["HyperParameters"]["sagemaker_stabilizer"]).objective == config["objective"]
    # A job that names none sends none (the library rejects keys it does not know).
    plain = launching.launch(prepared(job_settings, job()), job_settings, T0).state
    assert "objective" not in json.loads(requests.build_create_training_job(plain, job_settings, 1)[
        "HyperParameters"]["sagemaker_stabilizer"])


def test_the_reference_request_also_carries_the_configuration(job_settings):
    state = launching.prepare({}, EXECUTION, job_settings)
    request = requests.build_create_training_job(state, job_settings, 1)
    assert_valid(request)
    hps = request["HyperParameters"]
    assert json.loads(hps["sagemaker_program"]) == "train.py"
    # The reference script reads the configuration as every job does, from sagemaker_stabilizer alone.
    assert not {"sentinel_rules", "capture", "sentinel_action"} & set(hps)
    config = json.loads(hps["sagemaker_stabilizer"])
    assert [rule["name"] for rule in config["rules"]] == [rule.name for rule in state.monitoring.rules]
    assert config["action"] == state.monitoring.sentinel_action
    assert config["knobs"]["normalization"] == "add_batch_norm"
    assert config["loss_regex"] == r"step=\d+ epoch=\d+ loss=(\S+)"


def test_a_configuration_too_long_for_one_hyperparameter_is_rejected(job_settings):
    # Every engine rule that selects by tensor_regex, each with a 250-character pattern, and ten
    # captured collections with long names: each part is valid, together they do not fit one
    # hyperparameter value.
    selecting = [
        name for name, entry in CATALOGUE.items()
        if entry.runs_in == "engine" and not entry.one_of and "tensor_regex" in entry.param_index
    ]
    rules = [{"name": name, "parameters": {"tensor_regex": "x" * 250}} for name in selecting]
    capture = {f"collection_{index:02d}_{'c' * 80}": {"save_interval": 10} for index in range(10)}
    text = problem(job_settings, {"job": job(), "monitoring": {"rules": rules, "capture": capture}})
    assert text.startswith("monitoring: the rules, capture settings and loss regex take ")
    assert "SageMaker allows at most 2,500" in text


# --- remedies through knobs --------------------------------------------------------------------


def _exploded(settings: TrainSettings, raw_job: dict[str, Any], policy_name: str = "default", phase=None):
    state = launching.launch(prepared(settings, raw_job, policy=policy_name), settings, T0).state
    return state, Finding(rule="ExplodingTensor", step=40, phase=phase, message="fired")


def test_an_explosion_lowers_the_declared_learning_rate_under_the_users_name(job_settings):
    state, finding = _exploded(job_settings, job())
    plan = policy.plan(state, finding, [])
    assert plan.decision.remedy == "lower_lr"
    # The finding reports no stable rate: a quarter of the failing one.
    assert plan.decision.changes == {"lr": [1.6, pytest.approx(0.4)]}
    assert plan.run_spec == {"lr": pytest.approx(0.4), "steps": 60, "clip": 0.0, "seed": 0}
    assert plan.counters == ("num_learning_rate_adjustments",)


def test_a_remedy_never_leaves_the_knobs_bounds(job_settings):
    knobs = {"learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1.0, "max": 2.0}}
    state, finding = _exploded(job_settings, job(knobs=knobs))
    plan = policy.plan(state, finding, [])  # 0.4 would be below min 1.0: the knob's min, once
    assert plan.run_spec["lr"] == 1.0
    state.attempts[-1].run_spec = plan.run_spec
    plan = policy.plan(state, finding, [])
    assert (plan.decision.action, plan.decision.outcome) == ("end", "gave_up")
    assert "used up" in plan.decision.reason


def test_clipping_goes_through_the_grad_clip_knob_once_the_learning_rate_is_at_its_floor(job_settings):
    state, finding = _exploded(job_settings, job(hyperparameters={"lr": 0.02, "steps": 60, "clip": 0.0, "seed": 0}))
    plan = policy.plan(state, finding, [])
    assert plan.decision.changes == {"lr": [0.02, 0.005]}
    state.attempts[-1].run_spec = {"lr": 1e-4, "steps": 60, "clip": 0.0, "seed": 0}
    plan = policy.plan(state, finding, [])  # the knob's min (above the ladder's floor, 2e-5): no lower
    assert plan.decision.remedy == "clip_gradients"
    assert plan.decision.changes == {"clip": [0.0, 1.0]}


def test_a_warmup_explosion_without_a_warmup_knob_lowers_the_learning_rate(job_settings):
    state, finding = _exploded(job_settings, job(), phase="warmup")
    assert policy.plan(state, finding, []).decision.changes == {"lr": [1.6, pytest.approx(0.4)]}


def test_with_no_declared_knob_the_decision_names_the_knob_to_declare(job_settings):
    state, finding = _exploded(job_settings, job(knobs={}))
    plan = policy.plan(state, finding, [])
    assert (plan.decision.action, plan.decision.outcome) == ("end", "gave_up")
    assert plan.decision.reason.startswith(
        "ExplodingTensor at step 40: no declared knob can remedy ExplodingTensor; declare a `learning_rate` knob"
    )
    assert "a person must choose the next recipe" in plan.decision.reason


def test_the_original_policy_also_acts_only_through_knobs(job_settings):
    state, finding = _exploded(job_settings, job(knobs={}), policy_name="original")
    assert "declare a `learning_rate` knob" in policy.plan(state, finding, []).decision.reason
    state, finding = _exploded(job_settings, job(), policy_name="original")
    plan = policy.plan(state, finding, [])
    assert plan.decision.remedy == "lower_lr"  # no warm-up or normalisation knob: LR x0.9
    assert plan.decision.changes == {"lr": [1.6, pytest.approx(1.44)]}


def test_a_choice_knob_moves_only_toward_the_preferred_value(job_settings):
    raw = job(
        hyperparameters={"lr": 0.1, "act": "relu"},
        knobs={"activation": {"hyperparameter": "act", "type": "choice", "values": ["gelu", "relu"]}},
    )
    state = launching.launch(prepared(job_settings, raw), job_settings, T0).state
    plan = policy.plan(state, Finding(rule="VanishingGradient", step=9, phase="main"), [])
    assert plan.decision.changes == {"act": ["relu", "gelu"]}
    state.attempts[-1].run_spec = {"lr": 0.1, "act": "gelu"}
    assert policy.plan(state, Finding(rule="VanishingGradient", step=9, phase="main"), []).decision.action == "end"


def test_a_job_without_knobs_is_stopped_and_ends_for_a_person(job_settings):
    """Through the monitor: the finding stops the job; with no knob to turn, the explosion stands:
    the attempt ends as diverged with the reason."""
    state = launching.launch(prepared(job_settings, job(knobs={})), job_settings, T0).state
    seen = observe(describe(state, "InProgress"), findings=sentinel_findings(step=40, phase="main"))
    running = monitor.check(state, seen, T0)
    assert running.effects.stop_job == state.attempts[-1].job_name
    seen = observe(describe(running.state, "Stopped"), findings=sentinel_findings(step=40, phase="main"))
    ended = monitor.check(running.state, seen, T0)
    assert (ended.state.outcome, ended.state.next_action) == ("diverged", "end")
    assert "declare a `learning_rate` knob" in ended.state.reason
    note = ended.effects.notification
    assert note is not None and note.event_type == "diverged"
    assert "no declared knob can remedy" in note.subject
    assert "declare a `learning_rate` knob" in note.body
    assert "Final recipe: lr=1.6, steps=60, clip=0, seed=0" in note.body


def test_job_hyperparameters_keep_their_types(job_settings):
    given = parse_execution_input(
        {"job": job(hyperparameters={"lr": 1, "name": "x", "on": True, "layers": [1, 2]}, knobs={})}
    )
    assert given.job.hyperparameters == {"lr": 1, "name": "x", "on": True, "layers": [1, 2]}
    assert type(given.job.hyperparameters["lr"]) is int


def test_a_run_spec_value_the_reference_knobs_refuse_is_named_not_a_crash(settings):
    # 1e-15 is a positive rate (the run_spec accepts it) below the learning-rate knob's 1e-12.
    text = problem(settings, {"run_spec": {"learning_rate": 1e-15}})
    assert text.startswith("run_spec: ") and "learning_rate" in text and "1e-12" in text


def test_a_job_is_watched_by_default_through_auto(job_settings):
    state = prepared(job_settings, job())
    assert state.job.integration == "auto"


@pytest.mark.parametrize("integration", ["auto", "launcher"])
def test_a_job_without_a_loss_metric_is_accepted_and_its_integration_reaches_the_job(job_settings, integration):
    state = launching.launch(
        prepared(job_settings, job(integration=integration, loss_metric=None)), job_settings, T0
    ).state
    request = requests.build_create_training_job(state, job_settings, 1)
    config = json.loads(request["HyperParameters"]["sagemaker_stabilizer"])
    assert config["integration"] == integration
    assert config["loss_regex"] is None
