"""Synthesize the app once per context and read the template (helpers for tests/infra).

Each synth starts CDK's jsii runtime and takes seconds, so templates are module-level cached per
context. The Lambda asset and the source archive are cached on disk by content (see
infra/lambda_asset.py), so only the first synth on a machine runs pip.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import aws_cdk as cdk
from aws_cdk.assertions import Template

REPO_ROOT = Path(__file__).resolve().parents[2]


@cache
def synthesized(context_items: tuple[tuple[str, object], ...] = ()) -> tuple[Template, dict, Path]:
    import atexit
    import shutil
    import tempfile

    from app import build_app

    outdir = Path(tempfile.mkdtemp(prefix="stabilizer-synth-"))
    atexit.register(shutil.rmtree, outdir, ignore_errors=True)  # cached for the session, removed after it
    _, stack = build_app(cdk.App(context=dict(context_items), outdir=str(outdir)))
    template = Template.from_stack(stack)
    cdk.App.of(stack).synth()
    return template, template.to_json(), outdir


def synth(**context) -> tuple[Template, dict]:
    template, raw, _ = synthesized(tuple(sorted(context.items())))
    return template, raw


def policy_statements(raw: dict) -> list[tuple[str, dict]]:
    """(policy logical id, statement) for every identity policy in the template."""
    found = []
    for logical_id, resource in raw["Resources"].items():
        if resource["Type"] == "AWS::IAM::Policy":
            found += [(logical_id, s) for s in resource["Properties"]["PolicyDocument"]["Statement"]]
    return found


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def dumps(value) -> str:
    return json.dumps(value, sort_keys=True)
