"""The Lambda asset: wheels for the Lambda platform, cached, and complete on its own.

Completeness is proved the way Lambda loads code: a fresh interpreter with no site-packages and
only three directories on sys.path, in Lambda's order: the asset (/var/task), the layer
(/opt/python) and the runtime's boto3. This machine runs CPython 3.11 while the functions run
3.13, and compiled wheels (pydantic-core) are per Python version, so the load test builds the
same requirement list for 3.11 (same platform tags, same pinned versions, same code); the 3.13
asset that is deployed is checked for the 3.13 build of every compiled module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import lambda_asset
from infra.lambda_asset import (
    LambdaTarget,
    asset_requirements,
    build_dependencies,
    build_lambda_asset,
    layer_requirements,
)
from infra.stack import LAMBDA_MEMORY_MB

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDAS = REPO_ROOT / "lambdas"
HANDLERS = tuple(f"stabilizer_workflow.handlers.{name}" for name in ("train", "monitor", "watch"))
LOCAL = LambdaTarget(python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3")


@pytest.fixture(scope="module")
def deployed_asset() -> Path:
    return build_lambda_asset(LAMBDAS).path


def test_asset_bundles_pydantic_for_python_313_on_x86_64(deployed_asset):
    assert any(r.startswith("pydantic==") for r in asset_requirements())
    compiled = sorted(p.name for p in deployed_asset.rglob("*.so"))
    assert compiled, "pydantic-core ships a compiled module"
    assert all("cpython-313-x86_64-linux-gnu" in name for name in compiled), compiled
    assert (deployed_asset / "pydantic").is_dir()
    assert (deployed_asset / "pydantic_core").is_dir()


def test_asset_leaves_out_what_runtime_and_layer_provide(deployed_asset):
    top_level = {p.name for p in deployed_asset.iterdir()}
    assert not top_level & {"boto3", "botocore", "s3transfer", "urllib3", "aws_lambda_powertools"}
    assert not list(deployed_asset.rglob("__pycache__"))


def test_asset_carries_every_lambda_source_file(deployed_asset):
    sources = [p.relative_to(LAMBDAS) for p in LAMBDAS.rglob("*.py") if "__pycache__" not in p.parts
               and "tests" not in p.relative_to(LAMBDAS).parts]
    for relative in sources:
        assert (deployed_asset / relative).read_bytes() == (LAMBDAS / relative).read_bytes()


def test_second_build_is_served_from_the_cache(deployed_asset, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran although the asset was cached")

    monkeypatch.setattr(lambda_asset, "pip_install_wheels", no_pip)
    assert build_lambda_asset(LAMBDAS).path == deployed_asset


def test_a_source_change_makes_a_new_asset(tmp_path):
    source = tmp_path / "lambdas"
    source.mkdir()
    (source / "handler.py").write_text("VALUE = 1\n")
    first = build_lambda_asset(source, cache_root=tmp_path / "cache", requirements=[])
    (source / "handler.py").write_text("VALUE = 2\n")
    second = build_lambda_asset(source, cache_root=tmp_path / "cache", requirements=[])
    assert first.key != second.key
    assert (second.path / "handler.py").read_text() == "VALUE = 2\n"


def _runtime_dir(tmp_path: Path) -> Path:
    """Stand-in for the Lambda runtime's own packages: boto3 and its dependencies only."""
    import boto3

    site = Path(boto3.__file__).parent.parent
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    for name in RUNTIME_PACKAGES:
        (runtime / name).symlink_to(site / name)
    return runtime


def _load_in_lambda_layout(tmp_path: Path, code: str) -> dict:
    asset = build_lambda_asset(LAMBDAS, target=LOCAL).path
    layer = build_dependencies(layer_requirements(), LOCAL)
    script = (
        "import json, sys\n"
        f"{code}\n"
        # VmHWM is this process image's peak RSS; ru_maxrss would include the forking parent's.
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(json.dumps({'rss_mib': int(hwm.split()[1]) / 1024,"
        " 'modules': {n: getattr(m, '__file__', None) for n, m in sys.modules.items()}}))\n"
    )
    environment = {
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
        "BUCKET": "bucket", "TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:stabilizer",
        "SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/sagemaker",
        "TRAINING_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:x",
        "FRAMEWORK_IMAGES": json.dumps({"pytorch": {"2.8.0": {
            "cpu": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312",
            "gpu": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"}}}),
        "SOURCE_S3_URI": "s3://bucket/source/x/sourcedir.tar.gz",
        "TRAIN_DATA_S3_URI": "s3://bucket/data/train/", "TEST_DATA_S3_URI": "s3://bucket/data/test/",
        "JOB_NAME_PREFIX": "stabilizer", "DEFAULT_INSTANCE_TYPE": "ml.m5.xlarge",
        "DEBUGGER_RULES_ENABLED": "false", "POWERTOOLS_SERVICE_NAME": "stabilizer",
        "POWERTOOLS_TRACE_DISABLED": "true",
        # Lambda's order: the asset (/var/task), the layer (/opt/python), the runtime's boto3.
        "PYTHONPATH": os.pathsep.join([str(asset), str(layer), str(_runtime_dir(tmp_path))]),
    }
    # As on a cold start: nothing byte-compiled (the asset and the layer ship no .pyc), and -B
    # so that nothing is written into the shared cache. -s: no user site; -S: no site-packages at
    # all, only the stdlib after the PYTHONPATH above (the environment holds no other PYTHON* variable).
    for directory in (asset, layer):
        for cache in directory.rglob("__pycache__"):
            shutil.rmtree(cache)
    result = subprocess.run([sys.executable, "-s", "-S", "-B", "-c", script], env=environment,
                            capture_output=True, text=True, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["asset"], report["layer"] = str(asset), str(layer)
    return report


@pytest.mark.slow
def test_bundled_packages_load_from_the_asset_alone(tmp_path):
    report = _load_in_lambda_layout(tmp_path, "import pydantic, pydantic_core\npydantic.TypeAdapter(int)")
    assert report["modules"]["pydantic_core._pydantic_core"].startswith(report["asset"])
    loaded = {name: path for name, path in report["modules"].items() if path}
    stray = {n: p for n, p in loaded.items()
             if "site-packages" in p and not p.startswith((report["asset"], report["layer"]))}
    assert stray == {}


@pytest.mark.slow
def test_handlers_load_from_the_asset_alone(tmp_path):
    code = "\n".join(f"import {h}\nassert callable({h}.lambda_handler)" for h in HANDLERS)
    report = _load_in_lambda_layout(tmp_path, code)
    for handler in HANDLERS:
        assert report["modules"][handler].startswith(report["asset"])
    print(f"peak RSS after loading both handlers (cold, compiling): {report['rss_mib']:.1f} MiB")
    # Imports alone must leave at least half of the configured memory to the work.
    assert report["rss_mib"] < LAMBDA_MEMORY_MB / 2


@pytest.mark.slow
def test_asset_holds_no_sagemaker_sdk_and_picks_images_without_it(deployed_asset, tmp_path):
    # The SDK resolves images at synth time only; the functions read what synth baked in.
    top_level = {p.name.lower() for p in deployed_asset.iterdir()}
    assert not {name for name in top_level if name.startswith(("sagemaker", "smdebug"))}, top_level
    code = (
        "import json\n"
        "from stabilizer_workflow.handlers import monitor, train\n"
        "from stabilizer_workflow.launch.images import training_image_for\n"
        "from stabilizer_workflow.settings import TrainSettings\n"
        "import os\n"
        "settings = TrainSettings.from_env(os.environ)\n"
        "assert training_image_for('ml.g5.xlarge', {'framework': 'pytorch', 'version': '2.8'}, settings)"
        ".endswith(':2.8.0-gpu-py312')\n"
        "assert training_image_for('ml.m5.xlarge', None, settings).endswith(':x')\n"
    )
    report = _load_in_lambda_layout(tmp_path, code)
    assert not [name for name in report["modules"] if name.split(".")[0].startswith(("sagemaker", "smdebug"))]
def test_asset_carries_the_contract_package_as_files(deployed_asset):
    # ValidateInput checks rule lists with the job's own catalogue: the asset build copies the package.
    contract = REPO_ROOT / "model" / "stabilizer_contract"
    for source in contract.glob("*.py"):
        copied = deployed_asset / "stabilizer_contract" / source.name
        assert copied.is_file() and not copied.is_symlink()
        assert copied.read_bytes() == source.read_bytes()
        assert not re.search(r"^\s*(import|from) (numpy|torch)\b", copied.read_text(), re.M), source.name
