"""What a notebook imports from ``stabilizer.client``: the short names work, each is the object of the
module it lives in, and importing the package loads none of them (nor local mode) until asked."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import stabilizer.client

# Name -> the module that defines it (its one home).
PUBLIC = {
    "LocalClient": "stabilizer.client.local_client",
    "AwsClient": "stabilizer.client.aws_client",
    "ExecutionClient": "stabilizer.client.execution_client",
    "ExecutionView": "stabilizer.client.execution_client",
    "check_input": "stabilizer.client.inputs",
    "build_input": "stabilizer.client.inputs",
    "InputProblemError": "stabilizer.client.inputs",
    "job_from_sdk": "stabilizer.client.sdk",
    "execution_input_for": "stabilizer.client.sdk",
    "SdkJobError": "stabilizer.client.sdk_errors",
    "DebuggerConfigError": "stabilizer.client.debugger",
}


def test_a_notebook_imports_the_clients_and_functions_by_their_short_names():
    from stabilizer.client import (  # noqa: F401 - the imports are the test
        AwsClient,
        ExecutionView,
        LocalClient,
        SdkJobError,
        channels,
        check_input,
        execution_input_for,
        job_from_sdk,
    )
    from stabilizer.client.local_client import LocalClient as FromModule

    assert LocalClient is FromModule
    assert hasattr(channels, "prepare_digits")  # a module of the package still imports as one
    for name, home in PUBLIC.items():
        module = __import__(home, fromlist=[name])
        assert getattr(stabilizer.client, name) is getattr(module, name), name
    assert sorted(stabilizer.client.__all__) == sorted(PUBLIC)
    assert set(PUBLIC) <= set(dir(stabilizer.client))  # what a notebook's completion offers


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match=re.escape("module 'stabilizer.client' has no attribute 'LocalClinet'")):
        stabilizer.client.LocalClinet  # noqa: B018 - the lookup is the test
    with pytest.raises(ImportError, match="LocalClinet"):
        from stabilizer.client import LocalClinet  # noqa: F401


@pytest.mark.slow
@pytest.mark.parametrize(
    "program",
    [
        # Importing the package loads no client module and no part of local mode.
        "import sys, stabilizer.client\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('stabilizer.client.', 'stabilizer.local')))\n"
        "assert loaded == [], loaded",
        # Local mode first, then the short name.
        "import stabilizer.local.engine.engine\nfrom stabilizer.client import LocalClient\nLocalClient.open",
        # The short name first, then local mode.
        "from stabilizer.client import LocalClient, channels\nimport stabilizer.local.engine.engine",
    ],
    ids=["lazy", "local-mode-first", "client-first"],
)
def test_importing_the_client_and_local_mode_in_either_order_has_no_cycle(program):
    done = subprocess.run([sys.executable, "-c", program], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
