"""Builds the CreateTrainingJob request of one attempt, and its job name and S3 prefixes.

Pure: a state, the settings and an attempt number in, a request dict out. The request launches
the state's job as the user described it, plus what the workflow adds: the library channel and
the sentinel configuration (docs/contracts.md, section 8), checkpoints, tags. It must be valid
against botocore's SageMaker service model (tests check it with botocore's validator and the
model's own length and pattern limits). Contracts: hyperparameters in docs/contracts.md section
1, rule lists in section 3, the S3 layout in section 4.
"""

from __future__ import annotations

import json
from typing import Any

from stabilizer_contract.job import CHECKPOINT_DIR_VARIABLE, CHECKPOINT_LOCAL_PATH, CONFIG_HYPERPARAMETER
from stabilizer_workflow.errors import InvalidInput, MisconfiguredEnvironment, StateCorrupted
from stabilizer_workflow.execution import hang_settings
from stabilizer_workflow.execution.distribution import distribution_hyperparameters, distribution_problem
from stabilizer_workflow.execution.execution_input import Monitoring, RuleConfig
from stabilizer_workflow.execution.job import Job
from stabilizer_workflow.execution.rule_checks import ACTION_KEY, is_profiler_rule, runs_in_engine
from stabilizer_workflow.execution.service_limits import (
    DEBUGGER_COLLECTION_TEXT_MAX,
    DEBUGGER_COLLECTIONS_MAX,
    hyperparameter_value_problem,
)
from stabilizer_workflow.execution.state import WorkflowState
from stabilizer_workflow.remedies.in_job import batches_to_skip, corrupt_records_found, recovery_for
from stabilizer_workflow.settings import TrainSettings

JOB_NAME_MAX = 63
DEBUG_LOCAL_PATH = "/opt/ml/output/tensors"
RULE_INSTANCE_TYPE = "ml.t3.medium"

# The library reaches every job as an input channel (docs/contracts.md, section 8): SageMaker
# downloads it to /opt/ml/input/data/<channel>, and PYTHONPATH puts it (and the launcher's
# autostart directory) on the script's path.
LIBRARY_CHANNEL = "stabilizer"
LIBRARY_LOCAL_PATH = f"/opt/ml/input/data/{LIBRARY_CHANNEL}"
# The hyperparameter holding the sentinel's configuration. The training toolkit keeps
# `sagemaker_*` hyperparameters out of the script's arguments and SM_HPS.
# The library's launcher level starts from a `sitecustomize` module in this directory of the channel.
LAUNCHER_AUTOSTART = f"{LIBRARY_LOCAL_PATH}/stabilizer_sentinel/autostart"


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


def rule_image(settings: TrainSettings) -> str:
    """The `sagemaker-debugger-rules` image, resolved at synth time with the SageMaker Python SDK
    (`image_uris.retrieve("debugger", region)`, infra/training_image.py) and baked in."""
    if not settings.debugger_rule_image:
        raise MisconfiguredEnvironment(
            f"DEBUGGER_RULES_ENABLED is true but DEBUGGER_RULE_IMAGE is not set (the SageMaker Python SDK "
            f"knows no Debugger rule image for region {settings.region!r})"
        )
    return settings.debugger_rule_image


def _rules_json(rules: list[RuleConfig]) -> list[dict[str, Any]]:
    return [{"name": rule.name, "parameters": dict(rule.parameters)} for rule in rules]


def _engine_rules(monitoring: Monitoring) -> list[RuleConfig]:
    """Rules only Debugger runs (accepted only where it is enabled) go to Debugger alone."""
    return [rule for rule in monitoring.rules if runs_in_engine(rule.name, rule.parameters)]


def _capture_json(monitoring: Monitoring) -> dict[str, Any]:
    return {name: capture.model_dump(exclude_none=True) for name, capture in monitoring.capture.items()}


def sentinel_configuration(job: Job, monitoring: Monitoring, recovery: str = "relaunch",
                           skip_batches: list[str] | None = None, skip_nonfinite: bool = False) -> str:
    """The `sagemaker_stabilizer` value: the in-job library's whole configuration as JSON text.

    Shape (docs/contracts.md, section 8): rules, capture, action, integration, loss_regex (the
    launcher reads the loss from the log lines it matches; null when the job names no loss
    metric), knobs (role -> the job's hyperparameter name) and recovery (in_job or relaunch:
    stabilizer_workflow.remedies.in_job.recovery_for); skip_batches (only when an earlier attempt found a
    bad batch: their fingerprints, stabilizer_workflow.remedies.in_job.batches_to_skip);
    skip_nonfinite_batches (true only when an earlier attempt's bad batch held corrupt records:
    stabilizer_workflow.remedies.in_job.corrupt_records_found); objective (only when the job names one: its
    name, regex and type, read from the log where the loss cannot say whether the run learned). The library
    rejects other keys.
    """
    config = {
        "rules": _rules_json(_engine_rules(monitoring)),
        "capture": _capture_json(monitoring),
        "action": monitoring.sentinel_action,
        "integration": job.integration,
        "loss_regex": job.loss_regex(),
        "knobs": {role: knob.hyperparameter for role, knob in job.knobs.declared().items()},
        "recovery": recovery,
    }
    if job.objective is not None:
        config["objective"] = job.objective_config()
    if skip_batches:
        config["skip_batches"] = skip_batches
    if skip_nonfinite:
        config["skip_nonfinite_batches"] = True
    return json.dumps(config, separators=(",", ":"))


def configuration_problem(job: Job, monitoring: Monitoring) -> str | None:
    """Why the configuration cannot travel as one hyperparameter value, or None."""
    return hyperparameter_value_problem(
        "monitoring",
        CONFIG_HYPERPARAMETER,
        sentinel_configuration(job, monitoring),
        holding="the rules, capture settings and loss regex",
    )


def hyperparameters(state: WorkflowState, settings: TrainSettings) -> dict[str, str]:
    """The training job's hyperparameters, JSON-encoded as the SageMaker Python SDK sends them.

    The job's own hyperparameters (this attempt's recipe), then the framework container's
    `sagemaker_*` entries. The training toolkit JSON-decodes each value before passing it as
    `--name value`, so a string is sent as '"elu"' and a number as '0.1' (docs/contracts.md,
    section 4). `sagemaker_stabilizer` holds the configuration's JSON text, decoded once: the one
    way the sentinel configuration reaches every job, the reference `train.py` included (the
    library's `watch()` reads it; the toolkit keeps it out of the script's arguments).
    """
    job = state.job
    plain: dict[str, Any] = dict(state.run_spec)
    plain.update(
        {
            "sagemaker_program": job.entry_point,
            "sagemaker_submit_directory": job.source,
            "sagemaker_region": settings.region,
            "sagemaker_container_log_level": 20,
        }
    )
    encoded = {key: json.dumps(value) for key, value in plain.items()}
    encoded.update(distribution_hyperparameters(job.distribution, job.instance_type or ""))
    skip, recovery, nonfinite = batches_to_skip(state), recovery_for(state), corrupt_records_found(state)
    config = sentinel_configuration(job, state.monitoring, recovery, skip, nonfinite)
    # The input check left room for the configuration itself: the oldest bad batches give way, then the flag.
    while (skip or nonfinite) and hyperparameter_value_problem("monitoring", CONFIG_HYPERPARAMETER, config):
        skip, nonfinite = (skip[1:], nonfinite) if skip else (skip, False)
        config = sentinel_configuration(job, state.monitoring, recovery, skip, nonfinite)
    encoded[CONFIG_HYPERPARAMETER] = config
    return encoded


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


def debugger_rules(monitoring: Monitoring) -> list[RuleConfig]:
    """The rules only SageMaker Debugger runs (accepted only where it is enabled): what a job's
    Debugger configuration is for. The engine runs every other rule in the job, so a job whose
    rules it all runs carries no Debugger configuration at all (Debugger is closed to new
    customers since 2026-07-30; such an account refuses it)."""
    return [rule for rule in monitoring.rules if not runs_in_engine(rule.name, rule.parameters)]


def _debugger(monitoring: Monitoring, settings: TrainSettings, prefix: str) -> dict[str, Any]:
    """DebugHookConfig and DebugRuleConfigurations for the rules only Debugger runs, and
    ProfilerConfig and ProfilerRuleConfigurations for its profiler rules; {} when there are none."""
    rules = debugger_rules(monitoring)
    if not rules:
        return {}
    image = rule_image(settings)

    def configuration(rule: RuleConfig) -> dict[str, Any]:
        return {
            "RuleConfigurationName": rule.name,
            "RuleEvaluatorImage": image,
            "InstanceType": RULE_INSTANCE_TYPE,
            "VolumeSizeInGB": 0,
            # Without its actions (action_json): Debugger's rule job would run them as the execution
            # role, which may not stop jobs nor publish to an SMDebugRules topic; the monitor runs them.
            "RuleParameters": {"rule_to_invoke": rule.name,
                               **{k: v for k, v in rule.parameters.items() if k != ACTION_KEY}},
        }

    # Debugger runs its profiler rules (ProfilerRule) beside a profiler, not beside the debug hook.
    debug = [configuration(rule) for rule in rules if not is_profiler_rule(rule.name)]
    profiler = [configuration(rule) for rule in rules if is_profiler_rule(rule.name)]
    request: dict[str, Any] = {}
    if debug:
        request["DebugHookConfig"] = {
            "S3OutputPath": f"{prefix}/debug",
            "LocalPath": DEBUG_LOCAL_PATH,
            "CollectionConfigurations": [
                {"CollectionName": name, "CollectionParameters": parameters}
                for name, parameters, _ in hook_collections(monitoring)
            ],
        }
        request["DebugRuleConfigurations"] = debug
    if profiler:
        request["ProfilerConfig"] = {"S3OutputPath": f"{prefix}/profiler", "ProfilingIntervalInMilliseconds": 500}
        request["ProfilerRuleConfigurations"] = profiler
    return request


def hook_collections(monitoring: Monitoring) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """The debug hook's collections: (name, CollectionParameters, the input field behind each
    parameter), as the SDK's CollectionConfig sends them. The capture entries, plus each collection
    a Debugger rule reads (its `collection_names`) that the capture does not save."""
    collections: dict[str, Any] = dict(monitoring.capture)
    readers: dict[str, str] = {}
    for rule in debugger_rules(monitoring):
        for name in filter(None, (n.strip() for n in rule.parameters.get("collection_names", "").split(","))):
            # A rule reads a collection only if the hook saves it.
            collections.setdefault(name, None)
            readers.setdefault(name, f"rules ({rule.name}).collection_names")
    out = []
    for name, capture in sorted(collections.items()):
        if capture is None:
            out.append((name, {"save_interval": "10"}, {"save_interval": readers[name]}))
            continue
        if capture.save_interval is not None:
            parameters = {"save_interval": str(capture.save_interval)}
        else:
            parameters = {"save_steps": ",".join(str(s) for s in capture.save_steps or [])}
        regex = capture.include_regex  # Debugger's own keys, as the SDK's CollectionConfig sends them
        extra = {"include_regex": regex if isinstance(regex, str) else "|".join(regex or []),
                 "start_step": capture.start_step, "end_step": capture.end_step}
        parameters.update({key: str(value) for key, value in extra.items() if value not in (None, "")})
        out.append((name, parameters, {key: f"capture.{name}.{key}" for key in parameters}))
    return out


def hook_problems(monitoring: Monitoring, section: str) -> list[str]:
    """What of the debug hook's collections CreateTrainingJob would reject, each naming its input
    field under `section` (`monitoring` or `run_spec`); [] when the job sends no debug hook."""
    if not any(not is_profiler_rule(rule.name) for rule in debugger_rules(monitoring)):
        return []
    collections = hook_collections(monitoring)
    problems = []
    if len(collections) > DEBUGGER_COLLECTIONS_MAX:
        readers = sorted({source[key] for _, parameters, source in collections for key in parameters
                          if source[key].startswith("rules")})
        fields = " and ".join([f"{section}.capture", *(f"{section}.{reader}" for reader in readers)])
        problems.append(
            f"{fields}: {len(collections)} Debugger collections (the capture entries and the collections "
            f"Debugger rules read); SageMaker's DebugHookConfig takes at most {DEBUGGER_COLLECTIONS_MAX}"
        )
    for name, parameters, source in collections:
        if len(name) > DEBUGGER_COLLECTION_TEXT_MAX:
            problems.append(f"{section}.capture.{name[:40]}...: a collection name of {len(name)} characters; "
                            f"Debugger's CollectionName takes at most {DEBUGGER_COLLECTION_TEXT_MAX}")
        for key, value in parameters.items():
            if len(value) > DEBUGGER_COLLECTION_TEXT_MAX:
                problems.append(
                    f"{section}.{source[key]}: {len(value)} characters as Debugger's CollectionParameters "
                    f"{key!r} of collection {name!r}; SageMaker allows at most {DEBUGGER_COLLECTION_TEXT_MAX}"
                )
    return problems


def _resources(job: Job, instance_type: str, settings: TrainSettings) -> dict[str, Any]:
    resources: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": job.instance_count,
                                 "VolumeSizeInGB": 30}
    # Warm pools "cannot be used with spot instances" (SageMaker developer guide, managed warm pools).
    if settings.warm_pool_seconds and not job.use_spot_instances:
        # SageMaker managed warm pools: the next attempt (same role, instance type and count,
        # volume) starts on this job's instance instead of provisioning one.
        resources["KeepAlivePeriodInSeconds"] = settings.warm_pool_seconds
    return resources


def stopping_condition(job: Job, remaining_seconds: int) -> dict[str, int]:
    """MaxRuntimeInSeconds never past the execution's training budget, whatever the job asks for; a
    spot job's MaxWaitTimeInSeconds (waiting for capacity plus running), never under the runtime."""
    runtime = max(60, min(job.max_runtime_seconds, remaining_seconds))
    condition = {"MaxRuntimeInSeconds": runtime}
    if job.use_spot_instances and job.max_wait_seconds is not None:
        condition["MaxWaitTimeInSeconds"] = max(job.max_wait_seconds, runtime)
    return condition


def build_create_training_job(state: WorkflowState, settings: TrainSettings, attempt: int) -> dict[str, Any]:
    """The CreateTrainingJob request for attempt number `attempt` of this execution: the user's job
    (source, entry point, image, instances, hyperparameters, channels, metric definitions), plus
    what the workflow adds: the library channel, checkpoints, the sentinel configuration, tags."""
    job = state.job
    if job.instance_type is None or not isinstance(job.image, str):
        raise StateCorrupted("job: instance_type and image are not resolved (prepare fills them in)")
    name = job_name(settings.job_name_prefix, state.execution.short_id, attempt)
    prefix = attempt_prefix(settings.bucket, state.execution.name, attempt)
    remaining = state.limits.max_total_training_seconds - state.training_seconds()
    channels = [_channel(channel, uri) for channel, uri in job.channels.items()]
    problem = distribution_problem(job.distribution, job.instance_type)
    if problem:
        raise InvalidInput(problem)
    environment = {CHECKPOINT_DIR_VARIABLE: CHECKPOINT_LOCAL_PATH, **hang_settings.environment(job.hang)}
    if settings.library_s3_uri:
        channels.append(_channel(LIBRARY_CHANNEL, settings.library_s3_uri))
        environment["PYTHONPATH"] = f"{LIBRARY_LOCAL_PATH}:{LAUNCHER_AUTOSTART}"
    if state.resume_from:
        channels.append(_channel("resume", state.resume_from))
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "HyperParameters": hyperparameters(state, settings),
        "AlgorithmSpecification": {
            "TrainingImage": job.image,
            "TrainingInputMode": "File",
            "MetricDefinitions": [definition.model_dump() for definition in job.metric_definitions],
        },
        "RoleArn": settings.sagemaker_role_arn,
        "OutputDataConfig": {"S3OutputPath": f"{prefix}/output"},
        "ResourceConfig": _resources(job, job.instance_type, settings),
        "StoppingCondition": stopping_condition(job, remaining),
        "CheckpointConfig": {
            "S3Uri": checkpoint_uri(settings.bucket, state.execution.name, attempt),  # where the monitor reads
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        },
        "Environment": environment,
        "Tags": [
            {"Key": "stabilizer:execution", "Value": state.execution.name},
            {"Key": "stabilizer:attempt", "Value": str(attempt)},
            {"Key": "stabilizer:policy", "Value": state.policy},
        ],
    }
    if job.use_spot_instances:  # restarted from CheckpointConfig after an interruption
        request["EnableManagedSpotTraining"] = True
    if channels:  # InputDataConfig, when given, holds at least one channel
        request["InputDataConfig"] = channels
    if settings.debugger_rules_enabled:  # only where a rule needs Debugger (debugger_rules)
        request.update(_debugger(state.monitoring, settings, prefix))
    return request
