"""The Lambda asset imports only what the Lambda runtime, the Powertools layer and the bundled
pydantic provide, and nothing from the other deployables (model/, stabilizer/)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ASSET = Path(__file__).resolve().parents[3] / "lambdas"
ALLOWED = {
    "boto3",
    "botocore",
    "aws_lambda_powertools",
    "pydantic",
    "workflow",
    "train_handler",
    "monitor_handler",
}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_asset_imports_only_the_standard_library_boto3_powertools_and_pydantic():
    files = sorted(ASSET.rglob("*.py"))
    assert {f.name for f in files} >= {"train_handler.py", "monitor_handler.py", "state.py", "policy.py"}
    for path in files:
        foreign = _imported_roots(path) - ALLOWED - set(sys.stdlib_module_names) - {"__future__"}
        assert not foreign, f"{path.relative_to(ASSET)} imports {sorted(foreign)}"


def test_handlers_expose_lambda_handler():
    import monitor_handler
    import train_handler

    assert callable(train_handler.lambda_handler)
    assert callable(monitor_handler.lambda_handler)
