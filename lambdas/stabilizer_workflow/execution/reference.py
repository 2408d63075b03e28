"""The reference job: the ResNet of docs/contracts.md section 1 as a job with its knobs declared.

`{}` and the older `run_spec` input form run this job. It is an ordinary `Job`: the deployment's
own source archive (`model/`), `train.py`, the reference hyperparameters, the deployment's data
channels and the metric definitions that read `train.py`'s log lines. Nothing else in the
workflow treats it differently, except that its script also reads the sentinel settings from its
own hyperparameters (stabilizer_workflow.launch.requests).
"""

from __future__ import annotations

from stabilizer_contract.reference_recipe import RECIPE
from stabilizer_workflow.execution.execution_input import RunSpec
from stabilizer_workflow.execution.job import Job, Knob, Knobs, MetricDefinition
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

# A rate above the recipe's open low bound of 0 (a remedy never turns a rate to nothing).
SMALLEST_RATE = 1e-12


def _knob(hyperparameter: str, kind: str) -> Knob:
    """A knob on the reference script's hyperparameter, within the recipe's bounds
    (stabilizer_contract.reference_recipe), which the `run_spec` section enforces too."""
    recipe = RECIPE[hyperparameter]
    if recipe.choices is not None:
        return Knob(hyperparameter=hyperparameter, type="choice", values=list(recipe.choices))
    low = SMALLEST_RATE if recipe.low_open else recipe.low
    return Knob(hyperparameter=hyperparameter, type=kind, min=low, max=recipe.high)


# The reference script's hyperparameters that remedies may change, so every recipe a remedy makes
# is one the `run_spec` section accepts; the policies' own limits (stabilizer_workflow.remedies.policy)
# keep remedies far inside them. The activation's choices are in the recipe's order: ELU first,
# as it passes gradient for negative inputs where ReLU units die.
KNOBS = Knobs(
    learning_rate=_knob("learning_rate", "float"),
    warmup_learning_rate=_knob("warmup_learning_rate", "float"),
    normalization=_knob("add_batch_norm", "int"),
    grad_clip=_knob("grad_clip", "float"),
    batch_size=_knob("batch_size", "int"),
    activation=_knob("activation", "choice"),
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
