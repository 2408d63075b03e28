#!/usr/bin/env python3
"""The CDK app: reads the deployment settings, builds the Lambda asset, adds the stack and cdk-nag.

Run through the CDK CLI (`npx cdk synth`, `npx cdk deploy`) from the repository root with the
project's virtual environment active. Synth needs no AWS credentials and no Docker; the first
synth of a requirement set needs PyPI (or pip's cache) to fetch the Lambda wheels.
"""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.config import read_config
from infra.lambda_asset import REPO_ROOT, build_lambda_asset
from infra.stack import StabilizerStack


def build_app(app: cdk.App | None = None) -> tuple[cdk.App, StabilizerStack]:
    """The app with its one stack and the AwsSolutions checks; shared by `main` and the tests."""
    app = app or cdk.App()
    config = read_config(app.node)
    stack = StabilizerStack(
        app,
        app.node.try_get_context("stack_name") or "Stabilizer",
        description="stabilizer: detect exploding, vanishing and stalled training, stop, notify, relaunch.",
        config=config,
        lambda_asset=build_lambda_asset(REPO_ROOT / "lambdas"),
        training_source_dir=REPO_ROOT / "model",
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


def main() -> None:
    app, _ = build_app()
    app.synth()


if __name__ == "__main__":
    main()
