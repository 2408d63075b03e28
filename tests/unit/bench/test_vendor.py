"""The public scripts' upstream files are put in place from a clone, byte for byte, or not at all."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stabilizer.bench import vendor
from stabilizer.bench.corpus import Upstream, git_blob_id

pytestmark = pytest.mark.slow  # each test makes a git repository with git


def _clone(tmp_path: Path) -> tuple[Path, str]:
    """A repository with examples/demo/main.py and a LICENSE at one commit: (its git dir, the commit)."""
    work = tmp_path / "upstream"
    (work / "examples" / "demo").mkdir(parents=True)
    (work / "examples" / "demo" / "main.py").write_bytes(b"print('trained')\r\n")  # bytes as they are, CRLF too
    (work / "LICENSE").write_text("MIT License\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return work / ".git", commit


def _upstream(commit: str, blob: str) -> Upstream:
    return Upstream("owner/demo", commit, "examples/demo", ("examples/demo/main.py",),
                    {"examples/demo/main.py": blob}, "MIT")


def test_the_files_and_licence_are_written_at_their_places_byte_for_byte(tmp_path):
    git_dir, commit = _clone(tmp_path)
    expected = tmp_path / "expected.py"
    expected.write_bytes(b"print('trained')\r\n")
    folder = tmp_path / "owner__demo"
    folder.mkdir()
    written = vendor.put_in_place(_upstream(commit, git_blob_id(expected)), folder, git_dir)
    assert written == ["main.py", "LICENSE"]
    assert (folder / "main.py").read_bytes() == b"print('trained')\r\n"
    assert (folder / "LICENSE").read_text() == "MIT License\n"


def test_a_file_whose_blob_is_not_the_manifests_is_named_and_not_left_behind(tmp_path):
    git_dir, commit = _clone(tmp_path)
    folder = tmp_path / "owner__demo"
    folder.mkdir()
    with pytest.raises(vendor.VendorError, match="blob id is not the manifest's"):
        vendor.put_in_place(_upstream(commit, "0" * 40), folder, git_dir)
    assert not (folder / "main.py").exists()
    with pytest.raises(vendor.VendorError, match="not in"):
        vendor.put_in_place(_upstream("1" * 40, "0" * 40), folder, git_dir)


def test_a_clone_no_manifest_names_is_said_and_fails(tmp_path, capsys):
    git_dir, _ = _clone(tmp_path)
    assert vendor.main([f"owner/demo={git_dir.parent}"]) == 1
    assert "no manifest names owner/demo" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        vendor.main(["no-slash"])
    assert "expected owner/name=GIT_DIR" in capsys.readouterr().err
