"""cdk-nag (AwsSolutions), cfn-lint and the CDK CLI on the real app.

cdk-nag runs as a CDK validation plugin: an unacknowledged finding makes synth fail. The tests
here also prove the plugin is live (an unacknowledged finding does fail synth) and that the
acknowledgements and the findings match one to one, so no acknowledgement hides nothing or more
than it says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aws_cdk as cdk
import pytest

import infra.nag
from tests.infra.synth import REPO_ROOT


def test_synth_passes_aws_solutions_checks_with_no_unacknowledged_finding(default_outdir):
    report = json.loads((default_outdir / "validation-report.json").read_text())
    assert report["pluginReports"] == []
    assert (default_outdir / "Stabilizer.template.json").is_file()


def test_every_acknowledgement_answers_a_real_finding(tmp_path, monkeypatch):
    from app import build_app

    acknowledged: list[tuple[str, str, str]] = []

    def record(construct, *findings):
        acknowledged.extend((construct.node.path, rule, reason) for rule, reason in findings)

    monkeypatch.setattr(infra.nag, "acknowledge", record)
    app, _ = build_app(cdk.App(outdir=str(tmp_path)))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()

    report = json.loads((tmp_path / "validation-report.json").read_text())
    [plugin] = report["pluginReports"]
    assert plugin["pluginName"] == "AwsSolutions"
    findings = {(c["constructPath"], v["ruleName"]) for v in plugin["violations"]
                for c in v["violatingConstructs"]}

    def covers(ack, finding) -> bool:
        path, rule, _ = ack
        return finding[1] == rule and (finding[0] + "/").startswith(path + "/")

    unexplained = sorted(f for f in findings if not any(covers(a, f) for a in acknowledged))
    unused = sorted((p, r) for p, r, why in acknowledged if not any(covers((p, r, why), f) for f in findings))
    assert unexplained == []
    assert unused == []
    for path, rule, reason in acknowledged:
        assert len(reason) >= 60, f"{path} {rule}: the reason must say why, specifically"


def test_an_unacknowledged_finding_fails_synth(tmp_path):
    """Negative control: the plugin is live; a bucket without TLS enforcement breaks synth."""
    from aws_cdk import aws_s3 as s3

    from app import build_app

    app, stack = build_app(cdk.App(outdir=str(tmp_path)))
    s3.Bucket(stack, "CarelessBucket", block_public_access=s3.BlockPublicAccess.BLOCK_ALL)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for r in report["pluginReports"] for v in r["violations"]}
    assert "AwsSolutions-S10" in rules


@pytest.mark.slow
def test_cfn_lint_finds_nothing(default_outdir):
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    template = default_outdir / "Stabilizer.template.json"
    result = subprocess.run([str(cfn_lint), str(template)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.slow
def test_the_cdk_cli_takes_the_apps_cloud_assembly_and_cdk_json_the_apps_settings(default_outdir, tmp_path):
    """What `npx cdk synth` adds to the in-process synth, without synthesizing again (the whole run below is
    long): cdk.json runs app.py's `main` with settings that are the app's own defaults, so its template is
    the one cdk-nag and cfn-lint check here; and the pinned CLI, offline and with no AWS settings, reads the
    cloud assembly the app's aws-cdk-lib writes (a CLI older than the library refuses it)."""
    from infra.config import read_config

    class Context(dict):
        def try_get_context(self, key):
            return self.get(key)

    settings = json.loads((REPO_ROOT / "cdk.json").read_text())
    assert settings["app"] == "python3 app.py"
    assert read_config(Context(settings["context"])) == read_config(Context())
    cli = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    assert cli.exists(), "the pinned CDK CLI is missing: run `make setup` (it runs `npm ci`)"
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "CDK_DISABLE_CLI_TELEMETRY": "true"}
    result = subprocess.run([str(cli), "synth", "--app", str(default_outdir), "--quiet", "--no-notices"],
                            cwd=tmp_path, env=environment, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.long  # the CLI runs the app again (tens of seconds of CPU): make test checks its parts above
def test_cdk_cli_synth_offline_without_credentials_or_docker(tmp_path):
    """`npx cdk synth` as a newcomer runs it: pinned CLI, venv python, no AWS settings at all."""
    cli = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    assert cli.exists(), "the pinned CDK CLI is missing: run `make setup` (it runs `npm ci`)"
    environment = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "HOME": str(tmp_path),  # no ~/.aws: no profile, no credentials
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        # The Lambda asset cache stays shared, so this does not rebuild wheels.
        "STABILIZER_BUILD_CACHE": str(_cache_root()),
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
    }
    started = time.monotonic()
    result = subprocess.run(
        [str(cli), "synth", "--quiet", "--no-notices", "--output", str(tmp_path / "cdk.out")],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, check=False, timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    template = tmp_path / "cdk.out" / "Stabilizer.template.json"
    assert json.loads(template.read_text())["Resources"]
    print(f"cdk synth: {elapsed:.1f} s, template {template.stat().st_size} bytes")


def _cache_root() -> Path:
    from infra.lambda_asset import default_cache_root

    return default_cache_root()
