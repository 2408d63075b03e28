"""Builds the CreateTrainingJob request of one attempt, and its job name and S3 prefixes.

Pure: a state, the settings and an attempt number in, a request dict out. The request must be
valid against botocore's SageMaker service model (tests check it with botocore's validator and
the model's own length and pattern limits). Contracts: hyperparameters in docs/contracts.md
section 1, rule lists in section 3, the S3 layout in section 4.
"""

from __future__ import annotations

import json
from typing import Any

from workflow.errors import MisconfiguredEnvironment, StateCorrupted
from workflow.settings import TrainSettings
from workflow.state import RuleConfig, RunSpec, WorkflowState

JOB_NAME_MAX = 63
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
DEBUG_LOCAL_PATH = "/opt/ml/output/tensors"
RULE_INSTANCE_TYPE = "ml.t3.medium"

# Accounts that own the `sagemaker-debugger-rules` image, per region (SageMaker Debugger docs,
# "Docker images for Debugger rules"; the same table as the SageMaker Python SDK's).
DEBUGGER_RULE_ACCOUNTS = {
    "us-east-1": "503895931360",
    "us-east-2": "915447279597",
    "us-west-1": "685455198987",
    "us-west-2": "895741380848",
    "ca-central-1": "519511493484",
    "eu-west-1": "929884845733",
    "eu-west-2": "250201462417",
    "eu-west-3": "447278800020",
    "eu-central-1": "482524230118",
    "eu-north-1": "314864569078",
    "ap-northeast-1": "430734990657",
    "ap-northeast-2": "578805364391",
    "ap-southeast-1": "972752614525",
    "ap-southeast-2": "184798709955",
    "ap-south-1": "904829902805",
    "sa-east-1": "818342061345",
    "ap-east-1": "199566480951",
    "me-south-1": "986000313247",
}

# Regexes over the training log lines of docs/contracts.md section 1. `step=\d+ epoch=` anchors
# the training line so that "test_loss=" never feeds the training loss.
METRIC_DEFINITIONS = [
    {"Name": "train:step", "Regex": r"step=(\d+) epoch="},
    {"Name": "train:loss", "Regex": r"step=\d+ epoch=\d+ loss=(\S+)"},
    {"Name": "train:lr", "Regex": r"step=\d+ epoch=\d+ loss=\S+ lr=(\S+)"},
    {"Name": "train:grad_norm", "Regex": r"grad_norm=(\S+)"},
    {"Name": "test:loss", "Regex": r"test_loss=(\S+)"},
    {"Name": "test:accuracy", "Regex": r"test_accuracy=(\S+)"},
]


def job_name(prefix: str, short_id: str, attempt: int) -> str:
    """`<prefix>-<execution short id>-<attempt>`: unique per attempt without any clock.

    Two launches in the same second differ by execution or attempt number, and a retried launch
    of the same attempt reuses its name, so SageMaker's name uniqueness makes launch idempotent.
    """
    name = f"{prefix}-{short_id}-{attempt}"
    if len(name) > JOB_NAME_MAX:
        raise MisconfiguredEnvironment(f"JOB_NAME_PREFIX is too long for job name {name!r}")
    return name


def attempt_prefix(bucket: str, execution_name: str, attempt: int) -> str:
    return f"s3://{bucket}/executions/{execution_name}/attempt-{attempt}"


def checkpoint_uri(bucket: str, execution_name: str, attempt: int) -> str:
    return f"{attempt_prefix(bucket, execution_name, attempt)}/checkpoints"


def rule_image(region: str) -> str:
    account = DEBUGGER_RULE_ACCOUNTS.get(region)
    if account is None:
        raise MisconfiguredEnvironment(
            f"DEBUGGER_RULES_ENABLED is true but region {region!r} has no known Debugger rule image; "
            f"known: {', '.join(sorted(DEBUGGER_RULE_ACCOUNTS))}"
        )
    return f"{account}.dkr.ecr.{region}.amazonaws.com/sagemaker-debugger-rules:latest"


def _rules_json(rules: list[RuleConfig]) -> list[dict[str, Any]]:
    return [{"name": rule.name, "parameters": dict(rule.parameters)} for rule in rules]


def _capture_json(spec: RunSpec) -> dict[str, Any]:
    return {name: capture.model_dump(exclude_none=True) for name, capture in spec.capture.items()}


def hyperparameters(spec: RunSpec, settings: TrainSettings) -> dict[str, str]:
    """The training job's hyperparameters, JSON-encoded as the SageMaker Python SDK sends them.

    The container's training toolkit JSON-decodes each value before passing it as `--name value`,
    so a string is sent as '"elu"', a number as '0.1', and the JSON-valued `sentinel_rules` and
    `capture` as a JSON string holding their JSON text (docs/contracts.md, section 4).
    """
    plain: dict[str, Any] = {
        "warmup_learning_rate": spec.warmup_learning_rate,
        "learning_rate": spec.learning_rate,
        "warmup_epochs": spec.warmup_epochs,
        "add_batch_norm": spec.add_batch_norm,
        "num_epochs": spec.num_epochs,
        "batch_size": spec.batch_size,
        "depth": spec.depth,
        "activation": spec.activation,
        "grad_clip": spec.grad_clip,
        "seed": spec.seed,
        "checkpoint_every": spec.checkpoint_every,
        "max_steps": spec.max_steps,
        "sentinel_rules": json.dumps(_rules_json(spec.rules), separators=(",", ":")),
        "sentinel_action": spec.sentinel_action,
        "capture": json.dumps(_capture_json(spec), separators=(",", ":")),
        "sagemaker_program": "train.py",
        "sagemaker_submit_directory": settings.source_s3_uri,
        "sagemaker_region": settings.region,
        "sagemaker_container_log_level": 20,
    }
    return {key: json.dumps(value) for key, value in plain.items()}


def _channel(name: str, uri: str) -> dict[str, Any]:
    return {
        "ChannelName": name,
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": uri,
                "S3DataDistributionType": "FullyReplicated",
            }
        },
        "InputMode": "File",
    }


def _debugger(spec: RunSpec, settings: TrainSettings, prefix: str) -> dict[str, Any]:
    """DebugHookConfig and DebugRuleConfigurations from the same rule list as the sentinel."""
    collections = {name: capture for name, capture in spec.capture.items()}
    for rule in spec.rules:
        for name in filter(None, rule.parameters.get("collection_names", "").split(",")):
            # A rule reads a collection only if the hook saves it.
            collections.setdefault(name.strip(), None)
    configurations = []
    for name, capture in sorted(collections.items()):
        if capture is None:
            parameters = {"save_interval": "10"}
        elif capture.save_interval is not None:
            parameters = {"save_interval": str(capture.save_interval)}
        else:
            parameters = {"save_steps": ",".join(str(s) for s in capture.save_steps or [])}
        configurations.append({"CollectionName": name, "CollectionParameters": parameters})
    image = rule_image(settings.region)
    rules = [
        {
            "RuleConfigurationName": rule.name,
            "RuleEvaluatorImage": image,
            "InstanceType": RULE_INSTANCE_TYPE,
            "VolumeSizeInGB": 0,
            "RuleParameters": {"rule_to_invoke": rule.name, **rule.parameters},
        }
        for rule in spec.rules
    ]
    return {
        "DebugHookConfig": {
            "S3OutputPath": f"{prefix}/debug",
            "LocalPath": DEBUG_LOCAL_PATH,
            "CollectionConfigurations": configurations,
        },
        "DebugRuleConfigurations": rules,
    }


def _resources(instance_type: str, settings: TrainSettings) -> dict[str, Any]:
    resources: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": 1, "VolumeSizeInGB": 30}
    if settings.warm_pool_seconds:
        # SageMaker managed warm pools: the next attempt (same role, instance type and count,
        # volume) starts on this job's instance instead of provisioning one.
        resources["KeepAlivePeriodInSeconds"] = settings.warm_pool_seconds
    return resources


def build_create_training_job(state: WorkflowState, settings: TrainSettings, attempt: int) -> dict[str, Any]:
    """The CreateTrainingJob request for attempt number `attempt` of this execution."""
    spec = state.run_spec
    if spec.instance_type is None:
        raise StateCorrupted("run_spec.instance_type: not set (prepare fills it in)")
    name = job_name(settings.job_name_prefix, state.execution.short_id, attempt)
    prefix = attempt_prefix(settings.bucket, state.execution.name, attempt)
    # Never run past the execution's training budget, whatever the recipe asks for.
    remaining = state.limits.max_total_training_seconds - state.training_seconds()
    channels = [_channel("train", settings.train_data_s3_uri), _channel("test", settings.test_data_s3_uri)]
    if state.resume_from:
        channels.append(_channel("resume", state.resume_from))
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "HyperParameters": hyperparameters(spec, settings),
        "AlgorithmSpecification": {
            "TrainingImage": settings.training_image_uri,
            "TrainingInputMode": "File",
            "MetricDefinitions": METRIC_DEFINITIONS,
        },
        "RoleArn": settings.sagemaker_role_arn,
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": f"{prefix}/output"},
        "ResourceConfig": _resources(spec.instance_type, settings),
        "StoppingCondition": {"MaxRuntimeInSeconds": max(60, min(spec.max_runtime_seconds, remaining))},
        "CheckpointConfig": {
            "S3Uri": checkpoint_uri(settings.bucket, state.execution.name, attempt),  # where the monitor reads
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        },
        "Environment": {"STABILIZER_CHECKPOINT_DIR": CHECKPOINT_LOCAL_PATH},
        "Tags": [
            {"Key": "stabilizer:execution", "Value": state.execution.name},
            {"Key": "stabilizer:attempt", "Value": str(attempt)},
            {"Key": "stabilizer:policy", "Value": state.policy},
        ],
    }
    if settings.debugger_rules_enabled:
        request.update(_debugger(spec, settings, prefix))
    return request
