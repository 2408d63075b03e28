"""Which interpreter is the job's entry point (``autostart/sitecustomize.py``): the one that runs the script."""

from __future__ import annotations

import importlib.util

import pytest

from tests.unit.sentinel.support import MODEL_DIR


@pytest.fixture
def runs_the_entry_point(monkeypatch):
    monkeypatch.delenv("SM_USER_ENTRY_POINT", raising=False)  # loading it acts on nothing
    path = MODEL_DIR / "stabilizer_sentinel" / "autostart" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("_stabilizer_sitecustomize_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("SM_USER_ENTRY_POINT", "train.py")
    return module._runs_the_entry_point


@pytest.mark.parametrize("argv", [["train.py"], ["-u", "train.py", "--lr", "1"], ["-W", "error", "train.py"],
                                  ["-X", "dev", "-W", "ignore", "train.py"], ["-Werror", "-Xdev", "train.py"],
                                  ["-m", "train"]])
def test_the_script_is_found_after_the_interpreters_options_and_their_values(runs_the_entry_point, argv):
    # ``python -W error train.py``: "error" was taken for the script, and the run went unwatched, silently.
    assert runs_the_entry_point(argv)


@pytest.mark.parametrize("argv", [["-W", "train.py", "other.py"], ["-c", "print(1)"], ["other.py"], ["-m", "pip"]])
def test_another_command_is_not_the_entry_point(runs_the_entry_point, argv):
    assert not runs_the_entry_point(argv)
