"""A script's OMP_NUM_THREADS (or MKL_NUM_THREADS), set before it imports torch, holds under the launcher too.

Under the launcher torch is loaded before the script's first line, so a thread count the script sets in its
environment before ``import torch`` came too late: its operators ran on every core (stop 64's note).
"""

from __future__ import annotations

import builtins
import os
import textwrap

import pytest
import torch

from stabilizer_sentinel.integration.import_settings import THREADS, follow_thread_setting
from tests.unit.sentinel.support import job_env, run


@pytest.fixture
def threads(monkeypatch):
    """Two threads (the process's put back afterwards, with its import function), the variables unset."""
    for name in THREADS:
        monkeypatch.delenv(name, raising=False)
    count, original = torch.get_num_threads(), builtins.__import__
    torch.set_num_threads(2)
    yield 2
    builtins.__import__ = original
    torch.set_num_threads(count)


def test_the_threads_the_script_set_before_its_import_of_torch_are_set_where_it_imports_torch(threads):
    original = builtins.__import__
    follow_thread_setting()
    exec("import torch.nn", {"__name__": "stabilizer_sentinel.integration.guard"})  # the watcher's own: no sign
    os.environ["OMP_NUM_THREADS"] = "1"
    assert torch.get_num_threads() == threads  # torch was loaded already
    exec("import torch", {"__name__": "__main__"})  # the script's import: where unwatched torch would read it
    assert torch.get_num_threads() == 1
    assert builtins.__import__ is original  # the import statements are left alone from then on


def test_a_setting_made_after_the_scripts_import_of_torch_changes_nothing_as_unwatched(threads):
    follow_thread_setting()
    exec("from torch import nn", {"__name__": "__main__"})
    os.environ["OMP_NUM_THREADS"] = "1"
    exec("import torch", {"__name__": "__main__"})
    assert torch.get_num_threads() == threads


@pytest.mark.slow
def test_a_script_that_sets_its_threads_before_importing_torch_gets_them_under_the_launcher(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import os
        os.environ["MKL_NUM_THREADS"] = "1"
        import torch
        print("threads", torch.get_num_threads())
    """))
    env = {**job_env(tmp_path / "job"), "OMP_NUM_THREADS": "2"}  # the job's; the script asks for one
    plain = run(["train.py"], tmp_path, env)
    watched = run(["-m", "stabilizer_sentinel.launch", "train.py"], tmp_path, env)
    assert plain.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout == plain.stdout == "threads 1\n"
