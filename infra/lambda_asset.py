"""Build the Lambda code asset without Docker: the handlers plus wheels for the Lambda platform.

The deployed functions run python3.13 on x86_64 with the Powertools layer. The asset holds the
`lambdas/` sources (the `stabilizer_workflow` package), the `stabilizer_contract` package copied
from `model/` (the one part of the job side the workflow imports), and every third-party package
the handlers import that neither the runtime (boto3 and its dependencies) nor the layer
(Powertools) supplies. Those packages come from the `lambda` extra of pyproject.toml, pinned to the
versions installed here so that the deployed code runs with the versions the tests ran with, and
are installed by pip as wheels for the target
platform (`--platform`, `--python-version`, `--only-binary=:all:`), never compiled for this
machine's interpreter.

Builds are cached by content under a cache directory, so a second synth reuses them. pip needs
PyPI (or its wheel cache) the first time a requirement set is built; nothing here calls AWS.

This module must not import the handlers or anything from `lambdas/`: it only copies files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Distributions the python3.13 Lambda runtime already ships (boto3 and its dependency closure).
# They are dropped from the asset when pip pulls them in transitively, as the Powertools layer
# build drops them from the layer.
RUNTIME_PROVIDED = frozenset(
    {"boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3"}
)
# Distributions the official Powertools layer provides; the handlers get them from /opt/python.
LAYER_PROVIDED = frozenset({"aws-lambda-powertools"})

# Top-level import names of RUNTIME_PROVIDED, for removal after pip installs them transitively.
_RUNTIME_IMPORT_NAMES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3")


@dataclass(frozen=True)
class LambdaTarget:
    """The interpreter and platform the wheels are chosen for."""

    python_version: str = "3.13"
    # manylinux2014 (glibc 2.17) wheels run on every Lambda runtime; python3.13 runs on Amazon
    # Linux 2023 (glibc 2.34), so manylinux_2_28 wheels are accepted as well.
    platforms: tuple[str, ...] = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")


DEPLOYED_TARGET = LambdaTarget()


def default_cache_root() -> Path:
    """Where built assets are kept between synths (outside the work tree, shared by clones)."""
    override = os.environ.get("STABILIZER_BUILD_CACHE")
    if override:
        return Path(override)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "stabilizer" / "lambda-asset"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"cannot read a package name from requirement {requirement!r}")
    return _canonical(match.group(1))


def lambda_extra(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """The `lambda` extra of pyproject.toml: everything the deployed handlers import."""
    data = tomllib.loads(pyproject.read_text())
    try:
        return list(data["project"]["optional-dependencies"]["lambda"])
    except KeyError as missing:
        raise ValueError(f"{pyproject}: [project.optional-dependencies] has no 'lambda' extra") from missing


def asset_requirements(extra: list[str] | None = None) -> list[str]:
    """Requirements to bundle: the `lambda` extra minus what the runtime and the layer provide.

    Each is pinned to the version installed in this environment when there is one, so the
    asset carries the versions the tests ran with.
    """
    bundled = []
    for requirement in extra if extra is not None else lambda_extra():
        name = _requirement_name(requirement)
        if name in RUNTIME_PROVIDED or name in LAYER_PROVIDED:
            continue
        try:
            bundled.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            bundled.append(requirement.strip())
    return sorted(bundled)


def layer_requirements(extra: list[str] | None = None) -> list[str]:
    """The Powertools requirement of the `lambda` extra (what the layer stands in for)."""
    return [r.strip() for r in (extra if extra is not None else lambda_extra())
            if _requirement_name(r) in LAYER_PROVIDED]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def _source_files(source_dir: Path) -> list[Path]:
    files = []
    for path in sorted(source_dir.rglob("*")):
        relative = path.relative_to(source_dir)
        if path.is_dir() or "__pycache__" in relative.parts or path.suffix == ".pyc":
            continue
        if relative.parts[0] in {"tests", ".pytest_cache"}:
            continue
        files.append(path)
    return files


def _source_digest(source_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in _source_files(source_dir):
        digest.update(str(path.relative_to(source_dir)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:20]


def pip_install_wheels(requirements: list[str], target_dir: Path, target: LambdaTarget) -> None:
    """Install `requirements` as binary wheels for `target` into `target_dir` (no compilation)."""
    command = [
        sys.executable, "-m", "pip", "install",
        "--quiet", "--disable-pip-version-check", "--no-input", "--no-compile",
        "--target", str(target_dir),
        "--implementation", "cp",
        "--python-version", target.python_version,
        "--only-binary=:all:",
    ]
    for platform in target.platforms:
        command += ["--platform", platform]
    result = subprocess.run([*command, *requirements], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"pip could not install {requirements} as wheels for python {target.python_version} "
            f"on {', '.join(target.platforms)} (it needs PyPI or its wheel cache):\n{result.stderr}"
        )


def _drop_runtime_provided(directory: Path) -> None:
    for entry in directory.iterdir():
        name = entry.name
        dist = name.split("-")[0] if name.endswith((".dist-info", ".data")) else None
        if name in _RUNTIME_IMPORT_NAMES or (dist and _canonical(dist) in RUNTIME_PROVIDED):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for cache in directory.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


def _build_once(final: Path, build) -> Path:
    """Run `build(tmp)` unless `final` exists; publish with an atomic rename."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        tmp.rename(final)
    except OSError:
        # Another process published the same content first; theirs is identical.
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_dependencies(
    requirements: list[str], target: LambdaTarget = DEPLOYED_TARGET, cache_root: Path | None = None
) -> Path:
    """A cached directory holding `requirements` as wheels for `target`, runtime packages removed."""
    cache_root = cache_root or default_cache_root()
    key = _digest(json.dumps(requirements), target.python_version, *target.platforms)

    def build(tmp: Path) -> None:
        if requirements:
            pip_install_wheels(requirements, tmp, target)
        _drop_runtime_provided(tmp)

    return _build_once(cache_root / f"deps-py{target.python_version}-{key}", build)


@dataclass(frozen=True)
class BuiltAsset:
    path: Path
    # Content key of sources + dependencies: used as the CDK asset hash, so CDK does not re-hash.
    key: str


# Packages of the job side that the workflow imports, copied into the asset under their own name.
CONTRACT_PACKAGES = (REPO_ROOT / "model" / "stabilizer_contract",)


def build_lambda_asset(
    source_dir: Path = REPO_ROOT / "lambdas",
    target: LambdaTarget = DEPLOYED_TARGET,
    cache_root: Path | None = None,
    requirements: list[str] | None = None,
    packages: tuple[Path, ...] = CONTRACT_PACKAGES,
) -> BuiltAsset:
    """The Lambda asset directory: dependencies for `target` with the handler sources on top."""
    for directory in (source_dir, *packages):
        if not directory.is_dir():
            raise FileNotFoundError(f"the Lambda source directory {directory} does not exist")
    cache_root = cache_root or default_cache_root()
    requirements = asset_requirements() if requirements is None else requirements
    deps = build_dependencies(requirements, target, cache_root)
    key = _digest(deps.name, _source_digest(source_dir), *(f"{p.name}:{_source_digest(p)}" for p in packages))

    def build(tmp: Path) -> None:
        shutil.copytree(deps, tmp, dirs_exist_ok=True)
        sources = [(path, path.relative_to(source_dir)) for path in _source_files(source_dir)]
        for package in packages:
            sources += [(path, package.name / path.relative_to(package)) for path in _source_files(package)]
        for path, relative in sources:
            destination = tmp / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)

    return BuiltAsset(_build_once(cache_root / f"asset-{key}", build), key)


if __name__ == "__main__":
    # `python -m infra.lambda_asset`: fetch and cache the wheels the deployed asset bundles.
    print(build_dependencies(asset_requirements()))
