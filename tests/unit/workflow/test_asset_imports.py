"""The Lambda asset imports only what the Lambda runtime, the Powertools layer and the bundled
pydantic provide, and nothing from the other deployables (model/, stabilizer/)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# What the asset build copies: lambdas/ and the contract package of model/.
ASSET_SOURCES = (ROOT / "lambdas", ROOT / "model")
ALLOWED = {
    "boto3",
    "botocore",
    "aws_lambda_powertools",
    "pydantic",
    "stabilizer_workflow",
    "stabilizer_contract",
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
    lambdas, model = ASSET_SOURCES
    files = sorted([*lambdas.rglob("*.py"), *(model / "stabilizer_contract").rglob("*.py")])
    names = {f.relative_to(lambdas if lambdas in f.parents else model).as_posix() for f in files}
    assert names >= {"stabilizer_workflow/handlers/train.py", "stabilizer_workflow/handlers/monitor.py",
                     "stabilizer_workflow/execution/state.py", "stabilizer_workflow/remedies/policy.py",
                     "stabilizer_contract/catalogue.py"}
    for path in files:
        foreign = _imported_roots(path) - ALLOWED - set(sys.stdlib_module_names) - {"__future__"}
        assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)}"


def test_handlers_expose_lambda_handler():
    from stabilizer_workflow.handlers import monitor as monitor_handler
    from stabilizer_workflow.handlers import train as train_handler

    assert callable(train_handler.lambda_handler)
    assert callable(monitor_handler.lambda_handler)
