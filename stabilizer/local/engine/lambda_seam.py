"""Route the interpreter's Lambda invocations to the project's handler functions, in process.

moto's Step Functions interpreter invokes a Lambda task through a boto3 Lambda client; under
``mock_aws`` that request reaches moto's Lambda backend, which would run the function in Docker.
This module is the one seam that replaces that: ``LambdaBackend.invoke`` is wrapped so that the
ARNs (or names) registered here call a Python handler directly, the way the Lambda runtime
would: the JSON event in, the JSON result out, a raised exception reported as a function error
``{"errorType": <class name>, "errorMessage": ...}`` so that Retry and Catch match by name.

It must not know what the handlers do, and it leaves every other function to moto. It also loads
each handler's module as the runtime would, cold for each deployment (each engine).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

from stabilizer.local.engine.deployment import EngineError

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass(frozen=True)
class LambdaContext:
    """The attributes of the Lambda runtime's context object that handlers and Powertools read."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int = 512
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = ""
    log_stream_name: str = ""

    def get_remaining_time_in_millis(self) -> int:
        # The local engine imposes no Lambda timeout; report the deployed one (15 minutes).
        return 900_000


@dataclass
class Invocation:
    """One call of a registered function, kept for tests and the run report."""

    function_name: str
    event: Any
    result: Any = None
    error_type: str | None = None
    error_message: str | None = None
    seconds: float = 0.0


def function_name_of(name_or_arn: str) -> str:
    """``arn:aws:lambda:r:a:function:name[:qualifier]`` or ``name`` -> ``name``."""
    if name_or_arn.startswith("arn:"):
        parts = name_or_arn.split(":")
        return parts[6]
    return name_or_arn


class LocalLambdas:
    """A registry of in-process functions served in place of moto's Docker-backed Lambda."""

    def __init__(self, region: str, account: str) -> None:
        self.region = region
        self.account = account
        self._handlers: dict[str, Handler] = {}
        self.invocations: list[Invocation] = []
        self._lock = threading.Lock()

    def arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:{self.account}:function:{name}"

    def register(self, name: str, handler: Handler) -> str:
        """Serve ``name`` with ``handler``; returns the function ARN to put in the definition."""
        self._handlers[name] = handler
        return self.arn(name)

    def serves(self, name_or_arn: str) -> bool:
        return function_name_of(name_or_arn) in self._handlers

    def invoke(self, name_or_arn: str, event: Any) -> tuple[bytes, str | None]:
        """Run the handler; returns the response payload and the function error, if any."""
        import time

        name = function_name_of(name_or_arn)
        handler = self._handlers[name]
        context = LambdaContext(function_name=name, invoked_function_arn=self.arn(name))
        record = Invocation(function_name=name, event=event)
        started = time.monotonic()
        try:
            result = handler(event, context)
            payload = json.dumps(result).encode()
            record.result = result
            error = None
        except Exception as exc:  # every failure is reported, as the Lambda runtime does
            record.error_type = type(exc).__name__
            record.error_message = str(exc)
            payload = json.dumps(
                {
                    "errorType": type(exc).__name__,
                    "errorMessage": str(exc),
                    "stackTrace": traceback.format_exception(exc)[-5:],
                }
            ).encode()
            error = "Unhandled"
        record.seconds = time.monotonic() - started
        with self._lock:
            self.invocations.append(record)
        return payload, error

    @contextlib.contextmanager
    def installed(self) -> Iterator[LocalLambdas]:
        """Patch moto's Lambda backend so the registered functions are served here."""
        from moto.awslambda.models import LambdaBackend

        original = LambdaBackend.invoke
        registry = self

        def invoke(
            backend: Any,
            function_name: str,
            qualifier: str | None,
            body: Any,
            headers: Any,
            response_headers: dict[str, str],
        ) -> str | bytes | None:
            if not registry.serves(function_name):
                return original(backend, function_name, qualifier, body, headers, response_headers)
            if isinstance(body, bytes):
                body = body.decode()
            event = json.loads(body) if body else {}
            payload, error = registry.invoke(function_name, event)
            if error:
                response_headers["x-amz-function-error"] = error
            response_headers["Content-Length"] = str(len(payload))
            return payload

        with mock.patch.object(LambdaBackend, "invoke", invoke):
            yield self


def handler_module(lambdas: Path, name: str) -> ModuleType:
    """The handler ``stabilizer_workflow.handlers.<name>`` of the project whose asset root is ``lambdas``.

    The project's own asset is the installed ``stabilizer_workflow``: its handler is imported by its
    name, as Lambda imports it. Another project's (a test's stand-in asset) is loaded from its file
    under a name of its own, so neither replaces the other in ``sys.modules``.
    """
    path = (lambdas / "stabilizer_workflow" / "handlers" / f"{name}.py").resolve()
    if not path.is_file():
        raise EngineError(f"the Lambda asset {lambdas} has no handler stabilizer_workflow/handlers/{name}.py")
    module_name = f"stabilizer_workflow.handlers.{name}"
    installed = importlib.util.find_spec(module_name)
    if installed is not None and installed.origin and Path(installed.origin).resolve() == path:
        return importlib.import_module(module_name)
    key = f"_stabilizer_asset_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


def cold_start(handler: ModuleType) -> None:
    """Each engine is a new deployment, so its functions start cold: what a handler's package
    cached at module level (its settings read from the environment, its clients) is dropped, as a
    new Lambda execution environment would not have it."""
    package = handler.__name__.rpartition(".handlers.")[0] or "stabilizer_workflow"
    modules = [handler] + [m for n, m in list(sys.modules.items())
                           if m is not None and (n == package or n.startswith(package + "."))]
    for module in modules:
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == module.__name__:
                value.cache_clear()
