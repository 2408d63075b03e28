"""The Debugger page's example (docs/debugger.md, "Before and after"), taken from the page as written.

The "before" block is a Debugger user's Estimator; the "after" block hands it to the client. The
test builds the estimator with the page's own code (a role and a `src/train.py` supplied, `fit`
kept from calling AWS), translates it as `client.start(job=estimator, ...)` does, and checks that
ValidateInput accepts the result and that the Debugger configuration arrived with its meaning.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "debugger.md"
SECTION = "## Before and after"


def _blocks() -> list[str]:
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_the_debugger_page_estimator_translates_to_an_input_validate_input_accepts(tmp_path, monkeypatch):
    pytest.importorskip("sagemaker")
    from sagemaker.pytorch import PyTorch

    from stabilizer.client.sdk import execution_input_for
    from stabilizer_workflow.execution.execution_input import parse_execution_input

    before, after = _blocks()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    fitted: list = []
    monkeypatch.setattr(PyTorch, "fit", lambda self, inputs=None, **_: fitted.append(inputs))
    namespace: dict = {"role": "arn:aws:iam::111122223333:role/MySageMakerRole"}
    exec(compile(before, str(PAGE), "exec"), namespace)  # the page's own code
    assert fitted == [{"train": "s3://my-bucket/train", "test": "s3://my-bucket/test"}]

    # The "after" block's call, made without a deployed stack: the same arguments, translated.
    [call] = [node for node in ast.walk(ast.parse(after))
              if isinstance(node, ast.Call) and ast.unparse(node.func) == "client.start"]
    arguments = {kw.arg: eval(ast.unparse(kw.value), namespace) for kw in call.keywords}  # the page's own
    job = arguments.pop("job")
    execution_input = execution_input_for(None, job, **arguments)
    parsed = parse_execution_input(execution_input)

    rules = {rule.name: rule for rule in parsed.monitoring.rules}
    imbalance = rules["ClassImbalance"]
    assert imbalance.parameters["labels_regex"] == "CrossEntropyLoss_input_1"
    assert imbalance.parameters["predictions_regex"] == "CrossEntropyLoss_input_0"
    assert json.loads(imbalance.parameters["action_json"]) == [
        {"name": "stoptraining"}, {"name": "email", "endpoint": "mlteam@example.com"}]
    custom = parsed.monitoring.capture["custom_collection"]
    assert custom.include_regex == ".*fc_output|.*CrossEntropyLoss"
    assert custom.save_interval == 100
    assert parsed.job.knobs.learning_rate.hyperparameter == "lr"
