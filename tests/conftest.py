"""Fixtures shared by every tier: the offline data set and a job directory; and the rule that keeps
`make test-fast` fast: a test that starts a process is marked `slow`.

Every test that starts a process (a training run, a local job, a command, pip, git, torchrun) or
trains a network for real is marked `slow`; `make test-fast` runs the others (`-m "not slow"`).
The mark is checked, not trusted: while a test without it runs (its set-up, call and tear-down),
every way Python starts a process raises `ProcessStartError`, and the test fails even if the code
under test catches that error.

Every boto3 session parses the AWS service models again (SageMaker's alone is megabytes of JSON),
which was about half the time of the tests that start none: here each model file is parsed once
per test process and the parse is shared, as the clients of one session already share it.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import functools
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from botocore import loaders

from tests.helpers import JobDirs, model_module

# Every way a process starts: subprocess (fork_exec or posix_spawn, both under _execute_child),
# multiprocessing's spawn and forkserver (fork_exec), its fork (os.fork), pty, os.system and os.spawn*.
_STARTERS = (
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
)


class ProcessStartError(RuntimeError):
    """A test outside the `slow` tier started a process."""


@contextmanager
def _no_process_started(test: str) -> Iterator[list[str]]:
    started: list[str] = []
    saved = [(owner, name, getattr(owner, name)) for owner, name in _STARTERS if hasattr(owner, name)]

    def refuse(what: str):
        def refused(*_args, **_kwargs):
            started.append(what)
            raise ProcessStartError(f"{test} called {what}: a test that starts a process is marked slow")

        return refused

    for owner, name, _ in saved:
        setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield started
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _guarded(item: pytest.Item):
    if item.get_closest_marker("slow"):
        return (yield)
    with _no_process_started(item.nodeid) as started:
        result = yield
    if started:  # raised inside the test, and caught there
        raise ProcessStartError(f"{item.nodeid} tried to start a process ({', '.join(started)}): mark it slow")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    return (yield from _guarded(item))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `long` test is a real run too: it is `slow` as well, so that `make test-fast` leaves it out."""
    for item in items:
        if item.get_closest_marker("long") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    """Under `make test` the workers run side by side, one per core: each worker, and every
    training process it starts, gets one torch thread, so that two workers use two cores instead
    of four threads contending for them (measured: ResNet-20's 36 steps alone take 57 s of CPU
    on one thread and 76 s on two)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MKL_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # matplotlib lists the system's fonts the first time a process loads its font manager, with `fc-list`
    # where it finds none cached (~/.cache/matplotlib): a process, refused inside a test that is not `slow`.
    # Loaded here, before any test, a fresh machine's first report plot does not depend on the test order.
    with contextlib.suppress(ImportError):  # the plots' extra not installed: the tests that need it skip
        import matplotlib.font_manager  # noqa: F401


_parse_model_file = functools.cache(loaders.JSONFileLoader().load_file)
loaders.JSONFileLoader.load_file = lambda _loader, file_path: _parse_model_file(file_path)


@pytest.fixture(scope="session")
def digits_channels(tmp_path_factory) -> dict[str, Path]:
    """scikit-learn's digits as train/test channels, written once per test session."""
    _data = model_module("data")
    prepare_digits = _data.prepare_digits

    return prepare_digits(tmp_path_factory.mktemp("digits"))


@pytest.fixture
def job_dirs(tmp_path) -> JobDirs:
    return JobDirs(tmp_path / "job")
