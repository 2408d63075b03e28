"""The public-scripts corpus says where each script came from, and its files are still upstream's.

Every `tests/public_scripts/<project>__<script>/` folder names its upstream (`upstream` in
`manifest.json`: repository, 40-hex commit, root, paths, git blob ids, licence) and holds nothing of
ours but the manifest, the data maker and the SageMaker entry point (tests/public_scripts/README.md).
Each vendored file is recomputed as a git blob here, so a hand edit of an upstream file fails.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

CORPUS = ROOT / "tests" / "public_scripts"
FOLDERS = sorted(p for p in CORPUS.iterdir() if p.is_dir() and "__" in p.name) if CORPUS.is_dir() else []
OURS = {"manifest.json", "make_data.py", "sagemaker_entry.py"}
LICENCES = {"MIT", "BSD-3-Clause", "Apache-2.0"}
# What the scripts and their data makers leave behind when run in place; never vendored.
GENERATED = ("__pycache__",)


def git_blob_id(path: Path) -> str:
    """`git hash-object PATH`: the id git gives the file's bytes."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def upstream(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["upstream"]


def local_path(folder: Path, root: str, path: str) -> Path:
    return folder / (path[len(root):].lstrip("/") if root else path)


def test_the_blob_id_is_gits():
    # git's id of the empty file and of "hello\n", as `git hash-object` prints them.
    assert hashlib.sha1(b"blob 0\0").hexdigest() == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert hashlib.sha1(b"blob 6\0hello\n").hexdigest() == "ce013625030ba8dba906f756967f9e9ca394464a"


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_the_manifest_names_its_upstream(folder: Path):
    assert re.fullmatch(r"[a-z0-9_]+__[a-z0-9_]+", folder.name), "folders are <project>__<script>"
    source = upstream(folder)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", source["repo"])
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    assert source["licence"] in LICENCES
    root, paths = source["root"], source["paths"]
    assert paths and len(set(paths)) == len(paths)
    for path in paths:
        assert not root or path.startswith(root.rstrip("/") + "/"), f"{path} is not under root {root!r}"
    assert set(source["blobs"]) == set(paths), "one blob id per vendored path"
    assert all(re.fullmatch(r"[0-9a-f]{40}", blob) for blob in source["blobs"].values())


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_what_the_manifest_runs_is_in_the_folder(folder: Path):
    manifest = json.loads((folder / "manifest.json").read_text())
    source = manifest["upstream"]
    vendored = {local_path(folder, source["root"], p).relative_to(folder).as_posix() for p in source["paths"]}
    ours = [name for name in ("make_data.py", "sagemaker_entry.py") if (folder / name).is_file()]
    entry = manifest["job"]["entry_point"]
    assert entry in vendored or entry in ours
    if "data" in manifest:
        assert manifest["data"]["maker"] in ours
    if entry == "sagemaker_entry.py":
        # It runs one vendored script with runpy; that script is the one the manifest vendors.
        text = (folder / entry).read_text()
        script = re.search(r'^SCRIPT = "([^"]+)"', text, flags=re.MULTILINE) or re.search(
            r'^sys\.argv = \["([^"]+)"', text, flags=re.MULTILINE)
        assert script and script.group(1) in vendored
    for name, value in manifest.get("environment", {}).items():
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) and isinstance(value, str)


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_the_vendored_files_are_upstreams_bytes(folder: Path):
    source = upstream(folder)
    files = {p: local_path(folder, source["root"], p) for p in source["paths"]}
    present = [p for p, f in files.items() if f.is_file()]
    if not present and not (folder / "LICENSE").is_file():
        pytest.skip(f"{folder.name}: the upstream files are not in this checkout (only what is ours is)")
    assert sorted(present) == sorted(files), f"missing: {sorted(set(files) - set(present))}"
    assert (folder / "LICENSE").is_file(), "upstream's licence file goes beside its files"
    changed = [p for p, f in files.items() if git_blob_id(f) != source["blobs"][p]]
    assert not changed, f"differ from upstream {source['commit'][:7]}: {changed}"
    known = {f.relative_to(folder).as_posix() for f in files.values()} | OURS | {"LICENSE"}
    extra = [f.relative_to(folder).as_posix() for f in folder.rglob("*")
             if f.is_file() and not any(part in GENERATED for part in f.parts)]
    assert sorted(set(extra) - known) == [], "nothing but upstream's files and ours"
