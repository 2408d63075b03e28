"""What a job's source directory packs to (stabilizer.source.sourcedir): everything the SageMaker SDK would
upload, less runs, `.git`, virtual environments, caches and what `.stabilizerignore` names; read as
git reads the same patterns; reproducible; refused over the limit."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from stabilizer.source import sourcedir
from stabilizer.source.sourcedir import (
    IGNORE_FILE,
    SourceTooLargeError,
    mark_run_directory,
    pack,
    plan_source,
    source_archive,
)


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return sorted(m.name for m in archive.getmembers() if m.isfile())


PATTERNS = """\
# comments and blank lines are skipped

*.log
!keep.log
/build/
checkpoints/
**/cache-*.bin
docs/**/*.png
assets/[ab]?.txt
assets/[!c]*.md
notes/**
\\#hash.txt
"""
PATTERNS += "trailing.txt   \n"  # trailing spaces are not part of the pattern

FILES = [
    "fit.py", "debug.log", "keep.log", "sub/deep/run.log", "build/out.o", "src/build/kept.py",
    "checkpoints/a.pt", "model/checkpoints/b.pt", "checkpoints.py", "x/cache-1.bin", "cache-2.bin",
    "docs/a.png", "docs/img/b.png", "docs/readme.md", "assets/a1.txt", "assets/c1.txt", "assets/ab.txt",
    "assets/a.md", "assets/c.md", "notes/one/two.txt", "notes.txt", "#hash.txt", "trailing.txt",
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to compare with")
def test_the_ignore_file_leaves_out_exactly_what_git_would_for_the_same_patterns(tmp_path: Path):
    ours = tree(tmp_path / "ours", dict.fromkeys(FILES, "x") | {IGNORE_FILE: PATTERNS})
    theirs = tree(tmp_path / "theirs", dict.fromkeys(FILES, "x") | {".gitignore": PATTERNS})
    subprocess.run(["git", "init", "-q", str(theirs)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(theirs), "ls-files", "--others", "--exclude-standard"],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    expected = sorted(name for name in listed if name != ".gitignore")
    kept = sorted(entry.name for entry in plan_source(ours).files if entry.name != IGNORE_FILE)
    assert kept == expected
    # The patterns did leave things out, of every form above.
    assert {"debug.log", "build/out.o", "model/checkpoints/b.pt", "docs/img/b.png", "#hash.txt"}.isdisjoint(kept)
    assert {"keep.log", "src/build/kept.py", "checkpoints.py", "assets/c1.txt", "notes.txt"} <= set(kept)


def test_a_virtual_environment_stays_out_whatever_its_name(tmp_path: Path):
    source = tree(tmp_path / "src", {
        "fit.py": "x",
        "py311/pyvenv.cfg": "home = /usr/bin\n", "py311/lib/site.py": "x",
        "tools/conda-env/conda-meta/history": "x", "tools/conda-env/bin/python": "x",
        "tools/helper.py": "x",
        "venv-notes/readme.txt": "not an environment, only named like one",
    })
    plan = plan_source(source)
    assert [e.name for e in plan.files] == ["fit.py", "tools/helper.py", "venv-notes/readme.txt"]
    assert ("py311/", "virtual environment") in plan.left_out
    assert ("tools/conda-env/", "virtual environment") in plan.left_out


def test_a_marked_run_directory_stays_out_wherever_it_lies(tmp_path: Path):
    source = tree(tmp_path / "src", {"fit.py": "x", "experiments/today/jobs/ckpt.pt": b"\0" * 100})
    mark_run_directory(source / "experiments")
    assert members(source_archive(source)) == ["fit.py"]


def test_links_are_followed_as_the_sdk_follows_them(tmp_path: Path):
    shared = tree(tmp_path / "shared", {"helpers.py": "H = 1\n"})
    source = tree(tmp_path / "src", {"fit.py": "x"})
    (source / "helpers").symlink_to(shared, target_is_directory=True)
    (source / "loop").symlink_to(source, target_is_directory=True)
    plan = plan_source(source)
    assert [e.name for e in plan.files] == ["fit.py", "helpers/helpers.py"]
    assert ("loop/", "link loop") in plan.left_out


def test_the_same_content_packs_to_the_same_bytes(tmp_path: Path):
    source = tree(tmp_path / "src", {"fit.py": "print(1)\n", "run.sh": "#!/bin/sh\n", "data/a.csv": "1,2\n"})
    (source / "run.sh").chmod(0o755)
    first = source_archive(source)
    os.utime(source / "fit.py", (1, 1))
    copy = shutil.copytree(source, tmp_path / "elsewhere")
    assert source_archive(copy) == first
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:gz") as archive:
        modes = {m.name: m.mode for m in archive.getmembers()}
    assert modes == {"data": 0o755, "data/a.csv": 0o644, "fit.py": 0o644, "run.sh": 0o755}


def test_the_limit_is_the_size_the_train_lambda_reads_at_validate_input():
    from stabilizer_workflow.launch.sources import MAX_ARCHIVE_BYTES

    assert sourcedir.MAX_ARCHIVE_BYTES == MAX_ARCHIVE_BYTES == 64 * 1024 * 1024


def test_an_archive_over_the_limit_is_refused_naming_the_source_the_limit_and_the_biggest_entries(tmp_path: Path):
    source = tree(tmp_path / "src", {
        "fit.py": "x", "corpus/a.bin": os.urandom(300_000), "corpus/b.bin": os.urandom(100_000),
        "weights.pt": os.urandom(150_000),
    })
    with pytest.raises(SourceTooLargeError) as caught:
        pack(plan_source(source), limit=256 * 1024, shown_as="src")
    message = str(caught.value)
    assert message.startswith("job.source: src packs to more than 256.0 KiB, the limit for a source archive "
                              "(4 files, 537.1 KiB unpacked); biggest entries: corpus/ 390.6 KiB, weights.pt "
                              "146.5 KiB, fit.py 1 B.")
    assert "job.channels" in message and IGNORE_FILE in message
