"""The reference job: the ResNet of docs/contracts.md section 1 as a job with its knobs declared.

`{}` and the older `run_spec` input form run this job. It is an ordinary `Job`: the deployment's
own source archive (`model/`), `train.py`, the reference hyperparameters, the deployment's data
channels and the metric definitions that read `train.py`'s log lines. Nothing else in the
workflow treats it differently, except that its script also reads the sentinel settings from its
own hyperparameters (stabilizer_workflow.requests).
"""

from __future__ import annotations

from stabilizer_workflow.execution_input import RunSpec
from stabilizer_workflow.job import Job, Knob, Knobs, MetricDefinition
from stabilizer_workflow.settings import TrainSettings

ENTRY_POINT = "train.py"
LOSS_METRIC = "train:loss"

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

# The reference script's hyperparameters that remedies may change. Bounds are those the
# `run_spec` section already enforces, so every recipe it accepts stays valid; the policies'
# own limits (stabilizer_workflow.policy) keep remedies far inside them.
KNOBS = Knobs(
    learning_rate=Knob(hyperparameter="learning_rate", type="float", min=1e-12, max=10),
    warmup_learning_rate=Knob(hyperparameter="warmup_learning_rate", type="float", min=1e-12, max=10),
    normalization=Knob(hyperparameter="add_batch_norm", type="int", min=0, max=1),
    grad_clip=Knob(hyperparameter="grad_clip", type="float", min=0, max=1e6),
    batch_size=Knob(hyperparameter="batch_size", type="int", min=1, max=8192),
    # ELU first: it passes gradient for negative inputs where ReLU units die.
    activation=Knob(hyperparameter="activation", type="choice", values=["elu", "relu"]),
)


def reference_job(spec: RunSpec, settings: TrainSettings) -> Job:
    """The reference job tuned by a `run_spec` section (all defaults for `{}`)."""
    return Job(
        source=settings.source_s3_uri,
        entry_point=ENTRY_POINT,
        instance_type=spec.instance_type,
        hyperparameters=spec.hyperparameters(),
        channels={"train": settings.train_data_s3_uri, "test": settings.test_data_s3_uri},
        metric_definitions=[MetricDefinition(**definition) for definition in METRIC_DEFINITIONS],
        loss_metric=LOSS_METRIC,
        max_runtime_seconds=spec.max_runtime_seconds,
        knobs=KNOBS,
    )


def is_reference(job: Job, settings: TrainSettings) -> bool:
    """Whether this job runs the deployment's own `model/` source."""
    return job.source == settings.source_s3_uri and job.entry_point == ENTRY_POINT
