"""Build a wheel from the checkout and install it into a fresh virtualenv outside the repository.

Offline: the wheel is built with the setuptools of the interpreter running the tests (no build
isolation, no index), and installed with `--no-deps`. The environment's third-party packages
(torch, boto3, ...) come from this interpreter's site-packages through a `.pth` file, placed after
the fresh environment's own: what the wheel installed is found first, and nothing of the checkout
is on the path (no PYTHONPATH, working directory outside the repository).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_tree(names: list[str], destination: Path) -> Path:
    """The working tree's files under `names` (tracked, or new and not ignored) copied to `destination`: a
    build writes beside its sources, so it runs on a copy."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *names],
                            cwd=ROOT, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def build_wheel(source: Path, out: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(source)],
        capture_output=True, text=True, check=False, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [wheel] = out.glob("*.whl")
    return wheel


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


@dataclass(frozen=True)
class FreshEnvironment:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def environ(self, **extra: str) -> dict[str, str]:
        """This process's environment less PYTHONPATH (the checkout) and the virtualenv it runs in."""
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", "")])
        env.update(OMP_NUM_THREADS="1", **extra)
        return env

    def run(self, command: list[str], cwd: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=cwd, env=self.environ(**extra), capture_output=True, text=True,
                              timeout=timeout, check=False)


def fresh_environment(where: Path, wheel: Path) -> FreshEnvironment:
    """A virtualenv at `where` with `wheel` installed (no dependencies) and this interpreter's packages behind it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    environment = FreshEnvironment(where)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(environment.python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, check=False, timeout=300, env=environment.environ(),
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (environment.bin / "python").is_file() and list(Path(where).glob("lib/python*/site-packages/*.dist-info"))
    purelib = subprocess.run([str(environment.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "zz_shared_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return environment
