"""A SageMaker Python SDK training job, as it is, becomes the execution input's `job`.

A notebook user who already has an estimator (``sagemaker.pytorch.PyTorch``,
``sagemaker.estimator.Estimator``) or a ``sagemaker.modules.train.ModelTrainer`` hands it to the
client with the data it would pass to ``fit()``/``train()``, plus the knobs (the SDK has no such
concept)::

    client.start(job=estimator, inputs={"train": "s3://bucket/train"}, knobs={...})

`job_from_sdk` reads the object's own attributes (never calling AWS, creating no session) and
returns the `job` section of docs/contracts.md: source, entry_point, image, instance_type,
instance_count, hyperparameters, channels, metric_definitions, max_runtime_seconds, managed spot
training (use_spot_instances, max_wait_seconds, checkpoint_s3_uri), knobs. The
source is packed as the SDK packs it (`sagemaker.utils.create_tar_file` over the source
directory's entries, or the lone entry point, plus `dependencies`); `upload_local_files` puts a
local source and local channels in the stack's bucket for a run on AWS, as the SDK's
``tar_and_upload_dir`` and ``upload_data`` would.

What the workflow owns is not taken from the object: role, job name, output and checkpoint
locations, tags. What the job section cannot express is refused with an error naming the SDK
attribute (distributed training, a ModelTrainer `command`, non-empty `environment`,
file-system channels, SDK local mode's ``instance_type="local"``), rather than run as
a different job than the one described.

Works with the SDK v2 (2.257+); ModelTrainer objects of v3 (``sagemaker.train``) have the same
attributes and convert too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stabilizer.client.debugger import DebuggerConfigError, has_debugger_config, monitoring_from_estimator
from stabilizer.client.sdk_distribution import distribution_fields
from stabilizer.client.sdk_errors import SdkJobError
from stabilizer.client.sourcedir import ARCHIVE_NAME, Packed, SourceError, SourcePlan, pack, plan_source

RESERVED_PREFIX = "sagemaker_"
# What the SDK's ModelTrainer leaves out of a source upload by default (SourceCode.ignore_patterns).
_MODEL_TRAINER_IGNORED = {".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints"}


def _given(value: Any) -> bool:
    """sagemaker-core shapes mark unset fields with an `Unassigned` object instead of None."""
    return value is not None and type(value).__name__ != "Unassigned"


def _is_s3(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("s3://")


def _decode(value: Any) -> Any:
    """A hyperparameter value as the training toolkit hands it to the script: JSON-decoded when it is JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _is_model_trainer(definition: Any) -> bool:
    return all(hasattr(definition, name) for name in ("source_code", "compute", "training_image"))


def _is_estimator(definition: Any) -> bool:
    return all(hasattr(definition, name) for name in ("entry_point", "instance_type", "hyperparameters"))


# --- source ---------------------------------------------------------------------------------------


def _plan(directory: Path | None, *, extra: Sequence[Path] = (), ignore_patterns: Sequence[str] = ()) -> SourcePlan:
    try:
        return plan_source(directory, extra=extra, ignore_patterns=ignore_patterns)
    except SourceError as error:
        raise SdkJobError(str(error)) from None


def _packed(plan: SourcePlan, shown_as: str) -> Packed:
    try:
        return pack(plan, shown_as=shown_as)
    except SourceError as error:
        raise SdkJobError(str(error)) from None


def pack_source(plan: SourcePlan, cache: Path | None = None, shown_as: str = "the source") -> str:
    """`sourcedir.tar.gz` of `plan` (stabilizer.client.sourcedir), written where the content's hash says.

    The same source packs to the same path (and, on AWS, the same key). The SDK's own
    ``create_tar_file`` is not used: it packs links, `.git`, virtual environments and earlier runs
    alike; what is left out, and the size limit, are `stabilizer.client.sourcedir`'s.
    """
    packed = _packed(plan, shown_as)
    home = (cache or Path(tempfile.gettempdir()) / "stabilizer-sources") / packed.digest[:16]
    home.mkdir(parents=True, exist_ok=True)
    target = home / ARCHIVE_NAME
    if not target.is_file():
        scratch = home / f".{ARCHIVE_NAME}.{os.getpid()}"
        scratch.write_bytes(packed.data)
        scratch.replace(target)
    return str(target)


def _estimator_source(estimator: Any, rule_files: Sequence[Path] = ()) -> tuple[str, str]:
    """(source, entry point) the way `Framework._stage_user_code_in_s3` packs them; `rule_files`
    (a folder of custom rule files, stabilizer.client.debugger) go in beside the dependencies."""
    entry_point, source_dir = estimator.entry_point, estimator.source_dir
    dependencies = [*(getattr(estimator, "dependencies", None) or []), *rule_files]
    if not isinstance(entry_point, str) or not entry_point:
        raise SdkJobError("entry_point: the estimator has no entry point; stabilizer runs script-mode jobs")
    if _is_s3(source_dir):
        if dependencies:
            raise SdkJobError("dependencies: cannot be added to a source_dir that is already in S3")
        return source_dir, entry_point
    if source_dir:
        directory = Path(source_dir).expanduser().resolve()
        if not (directory / entry_point).is_file():
            raise SdkJobError(f"entry_point: {entry_point!r} is not in source_dir {directory}")
        if not dependencies:
            return str(directory), entry_point  # local mode packs the directory, and so does the AWS upload
        # source_dir's entries and each dependency at the archive root (`tar_and_upload_dir`).
        extra = [Path(d).expanduser() for d in dependencies]
        return pack_source(_plan(directory, extra=extra), shown_as=str(directory)), entry_point
    script = Path(entry_point).expanduser().resolve()
    if not script.is_file():
        raise SdkJobError(f"entry_point: no such file {script}")
    # No source_dir: the SDK uploads the entry point alone (with any dependencies).
    extra = [script, *(Path(d).expanduser() for d in dependencies)]
    return pack_source(_plan(None, extra=extra), shown_as=str(script)), script.name


def _trainer_source(trainer: Any) -> tuple[str, str]:
    code = trainer.source_code
    if not _given(code):
        raise SdkJobError("source_code: the ModelTrainer has none; stabilizer runs a script of yours")
    if _given(getattr(code, "command", None)):
        raise SdkJobError(
            "source_code.command: stabilizer runs an entry script (source_code.entry_script) through the "
            "container's training toolkit, not an arbitrary command"
        )
    entry, source_dir = getattr(code, "entry_script", None), getattr(code, "source_dir", None)
    if not _given(entry) or not _given(source_dir):
        raise SdkJobError("source_code: give both source_dir and entry_script")
    requirements = getattr(code, "requirements", None)
    if _given(requirements) and requirements != "requirements.txt":
        raise SdkJobError(
            f"source_code.requirements: the training toolkit installs requirements.txt at the source root; "
            f"rename {requirements!r} to requirements.txt"
        )
    if _is_s3(source_dir) or str(source_dir).endswith(".tar.gz"):
        return str(source_dir), entry
    directory = Path(source_dir).expanduser().resolve()
    # ModelTrainer copies source_dir with shutil.ignore_patterns(*ignore_patterns): each pattern
    # matched against every name at every depth, which is what a gitignore line without a "/" does.
    patterns = [str(p) for p in (getattr(code, "ignore_patterns", None) or _MODEL_TRAINER_IGNORED)]
    trimmed = _plan(directory, ignore_patterns=patterns)
    if [e.name for e in trimmed.files] == [e.name for e in _plan(directory).files]:
        return str(directory), entry  # the patterns leave nothing out: the directory as it is
    return pack_source(trimmed, shown_as=str(directory)), entry


# --- channels -------------------------------------------------------------------------------------


def _location(name: str, source: Any) -> str:
    if isinstance(source, str):
        return source.removeprefix("file://")
    config = getattr(source, "config", None)  # sagemaker.inputs.TrainingInput
    if isinstance(config, dict):
        data = config.get("DataSource", {})
        if "S3DataSource" in data:
            return data["S3DataSource"]["S3Uri"]
        raise SdkJobError(f"inputs.{name}: only S3 or local channels are supported, not {sorted(data)}")
    s3 = getattr(source, "s3_data_source", None)  # sagemaker-core DataSource
    if _given(s3):
        source = s3
    uri = getattr(source, "s3_uri", None)  # S3DataSource
    if _given(uri):
        return uri
    raise SdkJobError(f"inputs.{name}: only S3 or local channels are supported, not {type(source).__name__}")


def _estimator_channels(inputs: Any) -> dict[str, str]:
    if inputs is None:
        return {}
    if isinstance(inputs, str) or hasattr(inputs, "config"):
        return {"training": _location("training", inputs)}  # what fit() names a lone input
    if isinstance(inputs, dict):
        return {name: _location(name, source) for name, source in inputs.items()}
    raise SdkJobError(f"inputs: expected what fit() takes (a URI, a TrainingInput or a dict), got {inputs!r}")


def _trainer_channels(channels: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for channel in channels or []:
        name = channel.channel_name
        found[name] = _location(name, channel.data_source)
    return found


# --- the two kinds of definition --------------------------------------------------------------------


def _instance_type(value: Any, attribute: str) -> str:
    if not isinstance(value, str) or not value.startswith("ml."):
        raise SdkJobError(
            f"{attribute}: {value!r} is not a SageMaker instance type; stabilizer's local mode needs no "
            "Docker, so give the type the job runs on in AWS, such as 'ml.m5.xlarge'"
        )
    return value


def _estimator_image(estimator: Any, region: str | None) -> str | dict[str, str]:
    if estimator.image_uri:
        return estimator.image_uri
    framework = getattr(type(estimator), "_framework_name", None)
    version = getattr(estimator, "framework_version", None)
    if not framework or not version:
        raise SdkJobError("image_uri: the estimator names no image and no framework version")
    if region:
        # The very URI fit() would use in this region (the SDK's image URI lookup).
        return estimator.training_image_uri(region=region)
    spec = {"framework": framework, "version": version}
    if getattr(estimator, "py_version", None):
        spec["python_version"] = estimator.py_version
    return spec


def _from_estimator(estimator: Any, inputs: Any, region: str | None, rule_files: Sequence[Path] = ()) -> dict[str, Any]:
    if getattr(estimator, "environment", None):
        raise SdkJobError(
            "environment: stabilizer's job section sets no environment variables; pass them as hyperparameters"
        )
    source, entry_point = _estimator_source(estimator, rule_files)
    hyperparameters = {
        str(name): _decode(value)
        for name, value in (estimator.hyperparameters() or {}).items()
        if not str(name).startswith(RESERVED_PREFIX)
    }
    return {
        "source": source,
        "entry_point": entry_point,
        "image": _estimator_image(estimator, region),
        "instance_type": _instance_type(estimator.instance_type, "instance_type"),
        "instance_count": int(estimator.instance_count or 1),
        **distribution_fields(estimator, SdkJobError),  # torch_distributed, pytorchddp; others refused
        "hyperparameters": hyperparameters,
        "channels": _estimator_channels(inputs),
        "metric_definitions": [
            {"Name": d["Name"], "Regex": d["Regex"]} for d in (estimator.metric_definitions or [])
        ],
        "max_runtime_seconds": int(estimator.max_run),
        **_spot_fields(bool(getattr(estimator, "use_spot_instances", False)), getattr(estimator, "max_wait", None),
                       getattr(estimator, "checkpoint_s3_uri", None)),
    }


def _spot_fields(spot: bool, max_wait: Any, checkpoint_s3_uri: Any) -> dict[str, Any]:
    """Managed spot training, as the job section takes it: use_spot_instances, max_wait_seconds and the
    SDK's checkpoint_s3_uri (accepted; the workflow checkpoints each attempt under its execution)."""
    fields: dict[str, Any] = {}
    if spot:
        fields["use_spot_instances"] = True
    if _given(max_wait):
        fields["max_wait_seconds"] = int(max_wait)
    if _given(checkpoint_s3_uri):
        fields["checkpoint_s3_uri"] = str(checkpoint_s3_uri)
    return fields


def _from_model_trainer(trainer: Any, inputs: Any) -> dict[str, Any]:
    if _given(getattr(trainer, "distributed", None)):
        raise SdkJobError("distributed: distributed training is not supported by stabilizer's job section yet")
    if _given(getattr(trainer, "algorithm_name", None)):
        raise SdkJobError("algorithm_name: stabilizer runs your script, not a marketplace algorithm")
    if getattr(trainer, "environment", None):
        raise SdkJobError(
            "environment: stabilizer's job section sets no environment variables; pass them as hyperparameters"
        )
    if not _given(trainer.training_image):
        raise SdkJobError("training_image: the ModelTrainer names no image")
    source, entry_point = _trainer_source(trainer)
    compute = trainer.compute
    spot = _given(getattr(compute, "enable_managed_spot_training", None)) and bool(compute.enable_managed_spot_training)
    stopping = trainer.stopping_condition
    runtime = stopping.max_runtime_in_seconds if _given(stopping) else None
    max_wait = getattr(stopping, "max_wait_time_in_seconds", None) if _given(stopping) else None
    checkpoints = getattr(trainer, "checkpoint_config", None)
    checkpoint_uri = getattr(checkpoints, "s3_uri", None) if _given(checkpoints) else None
    hyperparameters = trainer.hyperparameters if isinstance(trainer.hyperparameters, dict) else {}
    channels = _trainer_channels(trainer.input_data_config)
    channels.update(_trainer_channels(inputs))  # train(input_data_config=...) adds to the trainer's
    # ModelTrainer keeps with_metric_definitions(...) in a private attribute and exposes no getter.
    metrics = getattr(trainer, "_metric_definitions", None) or []
    return {
        "source": source,
        "entry_point": entry_point,
        "image": trainer.training_image,
        "instance_type": _instance_type(compute.instance_type, "compute.instance_type"),
        "instance_count": int(compute.instance_count or 1),
        "hyperparameters": {str(k): v for k, v in hyperparameters.items()},
        "channels": channels,
        "metric_definitions": [{"Name": m.name, "Regex": m.regex} for m in metrics],
        "max_runtime_seconds": int(runtime if _given(runtime) else 3600),
        **_spot_fields(spot, max_wait, checkpoint_uri),
    }


def job_from_sdk(
    definition: Any,
    inputs: Any = None,
    *,
    knobs: dict[str, Any] | None = None,
    region: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The execution input's `job` for an SDK estimator or ModelTrainer.

    `inputs` is what you would pass to ``fit()`` (estimator) or ``train(input_data_config=...)``
    (ModelTrainer). `knobs` declares which hyperparameters remedies may change. `region`, when
    the job runs on AWS, turns a framework version into the exact image URI ``fit()`` would use;
    without it the image stays ``{"framework", "version"}`` for the deployment to resolve.
    `options` are other job fields (``loss_metric``, ``integration``) passed through as given.
    """
    return _describe(definition, inputs, knobs=knobs, region=region, **options)[0]


def _describe(definition: Any, inputs: Any = None, *, knobs: dict[str, Any] | None = None, region: str | None = None,
              **options: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The `job`, and the `monitoring` of an estimator's Debugger configuration (None without one)."""
    monitoring = None
    if _is_model_trainer(definition):
        job = _from_model_trainer(definition, inputs)
    elif _is_estimator(definition):
        if not has_debugger_config(definition):
            job = _from_estimator(definition, inputs, region)
        else:
            job, monitoring = _with_debugger(definition, inputs, region)
    else:
        raise SdkJobError(
            f"job: expected a SageMaker Python SDK estimator or ModelTrainer, got {type(definition).__name__}"
        )
    job["knobs"] = dict(knobs or {})
    job.update(options)
    return job, monitoring


def _with_debugger(estimator: Any, inputs: Any, region: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """An estimator with `rules` or `debugger_hook_config`: its custom rule files go into its source."""
    local = isinstance(estimator.source_dir, str) and not _is_s3(estimator.source_dir)
    try:
        translated = monitoring_from_estimator(estimator, Path(estimator.source_dir).expanduser() if local else None)
    except DebuggerConfigError as error:
        raise SdkJobError(str(error)) from None
    if not translated.custom_rule_files:
        return _from_estimator(estimator, inputs, region), translated.monitoring()
    if _is_s3(estimator.source_dir):
        raise SdkJobError("rules: a custom rule's file is packed with the source, which is already in S3")
    with tempfile.TemporaryDirectory() as scratch:
        for inside, local in translated.custom_rule_files.items():
            target = Path(scratch, inside)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target)
        folders = sorted({Path(scratch, inside.split("/")[0]) for inside in translated.custom_rule_files})
        return _from_estimator(estimator, inputs, region, folders), translated.monitoring()


def execution_input_for(
    execution_input: dict[str, Any] | None,
    job: Any,
    inputs: Any = None,
    *,
    knobs: dict[str, Any] | None = None,
    region: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """`execution_input` (policy, limits, monitoring, ...) with its `job` from `job`.

    `job` is an SDK estimator or ModelTrainer, or already a `job` dict (then `knobs` and
    `options` are added to it).
    """
    result = dict(execution_input or {})
    if job is None:
        if inputs is not None or knobs is not None or options:
            raise SdkJobError("job: inputs, knobs and job options need a job")
        return result
    if "job" in result:
        raise SdkJobError("job: given twice, in the execution input and as job=")
    if isinstance(job, dict):
        described = {**job, **options}
        if knobs is not None:
            described["knobs"] = knobs
        if inputs is not None:
            raise SdkJobError("inputs: a job dict carries its channels itself (job['channels'])")
    else:
        described, monitoring = _describe(job, inputs, knobs=knobs, region=region, **options)
        if monitoring is not None:  # the estimator's Debugger rules and hook (stabilizer.client.debugger)
            given = dict(result.get("monitoring") or {})
            twice = sorted(set(given) & set(monitoring))
            if twice:
                raise SdkJobError(f"monitoring.{twice[0]}: given twice, in the execution input and by the "
                                  f"estimator's Debugger configuration")
            result["monitoring"] = {**given, **monitoring}
    result["job"] = described
    return result
