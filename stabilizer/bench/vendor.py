"""Put the public scripts' upstream files in place from a clone of their repository.

A checkout holds only what is ours in `tests/public_scripts/` (tests/public_scripts/README.md); each script's
manifest names the repository, the commit, the paths and their git blob ids. Given a clone (any git directory
holding that commit), this writes every path of every script of that repository at its place in the script's
folder, byte for byte, with the repository's LICENSE at that commit, and checks each file's blob id:

    git clone https://github.com/pytorch/examples /tmp/examples
    python -m stabilizer.bench.vendor pytorch/examples=/tmp/examples karpathy/nanoGPT=/tmp/nanoGPT

A file whose blob id is not the manifest's is removed again and named; nothing of ours is touched.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from stabilizer.bench.corpus import PUBLIC_SCRIPTS_DIR, Upstream, git_blob_id, load_scripts


class VendorError(Exception):
    """A file could not be put in place: the commit or path is not in the clone, or its bytes are not the blob."""


def _show(git_dir: Path, commit: str, path: str) -> bytes:
    done = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
                          capture_output=True, check=False)
    if done.returncode:
        raise VendorError(f"{path} at {commit[:12]}: not in {git_dir} ({done.stderr.decode().strip()})")
    return done.stdout


def put_in_place(upstream: Upstream, directory: Path, git_dir: Path) -> list[str]:
    """Write ``upstream``'s files and LICENSE into ``directory`` from the clone at ``git_dir``; the local paths
    written. Raises VendorError, leaving no file of a wrong blob behind."""
    written = []
    for path in upstream.paths:
        target = directory / upstream.local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_show(git_dir, upstream.commit, path))
        if git_blob_id(target) != upstream.blobs[path]:
            target.unlink()
            raise VendorError(f"{path} at {upstream.commit[:12]}: its blob id is not the manifest's "
                              f"{upstream.blobs[path]} (upstream.blobs)")
        written.append(upstream.local(path))
    (directory / "LICENSE").write_bytes(_show(git_dir, upstream.commit, "LICENSE"))
    return [*written, "LICENSE"]


def _clone(value: str) -> tuple[str, Path]:
    repo, _, git_dir = value.partition("=")
    if not repo or "/" not in repo or not git_dir:
        raise argparse.ArgumentTypeError(f"expected owner/name=GIT_DIR, got {value!r}")
    path = Path(git_dir)
    return repo, path / ".git" if (path / ".git").is_dir() else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stabilizer.bench.vendor",
                                     description="put the public scripts' upstream files in place from clones")
    parser.add_argument("clones", nargs="+", type=_clone, metavar="OWNER/NAME=GIT_DIR",
                        help="a repository as the manifests name it, and a clone of it (its work tree or git dir)")
    parser.add_argument("--root", type=Path, default=PUBLIC_SCRIPTS_DIR, help="the public scripts' folder")
    args = parser.parse_args(argv)
    clones = dict(args.clones)
    every = load_scripts(args.root)
    scripts = [s for s in every if s.upstream.repo in clones]
    unknown = sorted(set(clones) - {s.upstream.repo for s in every})
    if unknown:
        print(f"no manifest names {', '.join(unknown)}", file=sys.stderr)
    failed = 0
    for script in scripts:
        try:
            written = put_in_place(script.upstream, script.directory, clones[script.upstream.repo])
            print(f"{script.name}: {', '.join(written)}")
        except VendorError as error:
            failed += 1
            print(f"{script.name}: {error}", file=sys.stderr)
    return 1 if failed or unknown or not scripts else 0


if __name__ == "__main__":
    sys.exit(main())
