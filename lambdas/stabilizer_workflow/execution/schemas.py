"""Writes the JSON Schema files of the state payload and the execution input into `schemas/`.

    python -m stabilizer_workflow.execution.schemas            # from the repository root: rewrite the files
    python -m stabilizer_workflow.execution.schemas --check    # exit 1 if the files are out of date

The files are generated from the pydantic models, never edited by hand; a unit test fails when
they drift. `execution-input.example.json` is what `{}` means (the reference job's recipe, every
field with its default); `execution-input.job-example.json` describes a job of your own, with
knobs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from stabilizer_workflow.execution.execution_input import ExecutionInput, Limits, RunSpec
from stabilizer_workflow.execution.state import WorkflowState

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# A job of your own: a plain PyTorch loop whose hyperparameters have its own names, two knobs.
JOB_EXAMPLE = {
    "policy": "default",
    "job": {
        "source": "s3://my-bucket/jobs/mlp/sourcedir.tar.gz",
        "entry_point": "fit.py",
        "integration": "library",
        "image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-cpu-py311-ubuntu22.04-sagemaker",
        "instance_type": "ml.m5.xlarge",
        "instance_count": 1,
        "hyperparameters": {"lr": 0.5, "epochs": 3, "clip": 0.0, "hidden": 64},
        "channels": {"training": "s3://my-bucket/jobs/mlp/data/"},
        "metric_definitions": [{"Name": "train:loss", "Regex": "loss=([0-9.eE+-]+|nan|inf)"}],
        "loss_metric": "train:loss",
        "max_runtime_seconds": 3600,
        "knobs": {
            "learning_rate": {"hyperparameter": "lr", "type": "float", "min": 1e-5, "max": 1.0},
            "grad_clip": {"hyperparameter": "clip", "type": "float", "min": 0.0, "max": 10.0},
        },
    },
    "monitoring": {"sentinel_action": "stop"},
}


def _schema(model: type, title: str, description: str) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    return {"$schema": SCHEMA_DIALECT, **schema, "title": title, "description": description}


def documents() -> dict[str, str]:
    state = _schema(
        WorkflowState,
        "stabilizer state payload",
        "The state the Step Functions execution carries between the train and monitor Lambdas "
        "(docs/contracts.md, section 4).",
    )
    given = _schema(
        ExecutionInput,
        "stabilizer execution input",
        "Input of one execution. Every field is optional; {} runs the reference problem. Unknown "
        "keys and wrong types are rejected.",
    )
    example = ExecutionInput(run_spec=RunSpec()).model_dump(mode="json", exclude_none=True)
    job_example = ExecutionInput.model_validate(JOB_EXAMPLE).model_dump(mode="json", exclude_none=True)
    job_example["limits"] = {"max_num_retraining": Limits().max_num_retraining}
    return {
        "state.schema.json": json.dumps(state, indent=2, sort_keys=True) + "\n",
        "execution-input.schema.json": json.dumps(given, indent=2, sort_keys=True) + "\n",
        "execution-input.example.json": json.dumps(example, indent=2) + "\n",
        "execution-input.job-example.json": json.dumps(job_example, indent=2) + "\n",
    }


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[3] / "schemas"
    stale = []
    for name, text in documents().items():
        path = root / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            root.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m stabilizer_workflow.execution.schemas", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
