"""The client: one front for notebooks and scripts over AWS or the local engine.

A notebook imports what it uses from here::

    from stabilizer.client import LocalClient       # or AwsClient("Stabilizer") for a deployed stack
    client = LocalClient.open("runs/notebook")
    view = client.wait(client.start(job=estimator, inputs=inputs, knobs=knobs))

Modules
-------
``execution_client`` what both clients answer (``ExecutionClient``, ``ExecutionView``)
``local_client``  ``LocalClient``, over the local engine (stabilizer.local)
``aws_client``    ``AwsClient``, over a deployed stack
``inputs``        the execution input from the command line (``build_input``, ``check_input``)
``sdk``           a SageMaker SDK job adapted to the client (``job_from_sdk``, ``execution_input_for``),
                  with ``debugger`` (Debugger's configuration), ``sdk_aws`` and ``sdk_distribution``
``channels``      the data channels, prepared and uploaded

Names are resolved on first use: importing this package loads none of its modules, and so no part
of local mode, until a name is asked for. The client stands on local mode, never the other way
round: nothing in ``stabilizer.local`` imports this package (tests/packaging/test_import_direction.py).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ExecutionClient": "execution_client",
    "ExecutionView": "execution_client",
    "LocalClient": "local_client",
    "AwsClient": "aws_client",
    "build_input": "inputs",
    "check_input": "inputs",
    "InputProblemError": "inputs",
    "job_from_sdk": "sdk",
    "execution_input_for": "sdk",
    "SdkJobError": "sdk_errors",
    "DebuggerConfigError": "debugger",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stabilizer.client' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stabilizer.client.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
