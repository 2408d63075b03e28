"""The reference training script is written like any user's script: it reaches the library only
through ``stabilizer_sentinel``'s public names (its ``__all__``), never through its modules or the
contract package behind it. One exception: its own recipe (defaults, bounds, meanings), which the
workflow's `run_spec` section shares with it and which therefore lives in the contract
(``stabilizer_contract.reference_recipe``)."""

from __future__ import annotations

import ast
from pathlib import Path

import stabilizer_sentinel

MODEL = Path(__file__).resolve().parents[3] / "model"
SCRIPT_FILES = ("train.py", "recipe.py", "data.py", "resnet.py")
LIBRARY_PACKAGES = ("stabilizer_sentinel", "stabilizer_contract")


def _library(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in LIBRARY_PACKAGES


def uses_beyond_the_public_api(source: str) -> list[str]:
    """What a script takes from the library other than ``stabilizer_sentinel``'s public names."""
    tree = ast.parse(source)
    aliases: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "stabilizer_sentinel":
                    aliases.add(alias.asname or alias.name)
                elif _library(alias.name):
                    found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and _library(node.module):
            for alias in node.names:
                if node.module != "stabilizer_sentinel" or alias.name not in stabilizer_sentinel.__all__:
                    found.append(f"from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr not in stabilizer_sentinel.__all__):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_checker_sees_a_private_module_a_contract_import_and_an_unexported_name():
    source = ("import stabilizer_sentinel as s\nimport stabilizer_sentinel.integration.guard\n"
              "from stabilizer_contract.checkpoints import checkpoint_name\ns.watch\ns._EXPORTS\n")
    assert uses_beyond_the_public_api(source) == [
        "import stabilizer_sentinel.integration.guard", "from stabilizer_contract.checkpoints import checkpoint_name",
        "s._EXPORTS"]


OWN_RECIPE = "from stabilizer_contract.reference_recipe import RECIPE"


def test_the_reference_script_uses_only_the_librarys_public_names():
    found = {name: uses_beyond_the_public_api((MODEL / name).read_text()) for name in SCRIPT_FILES}
    assert found == {name: [OWN_RECIPE] if name == "recipe.py" else [] for name in SCRIPT_FILES}


def test_a_script_that_keeps_its_own_checkpoints_names_them_as_the_workflow_resumes_them(tmp_path):
    for step in (0, 120, 40):
        (tmp_path / stabilizer_sentinel.checkpoint_name(step)).write_bytes(b"")
    assert stabilizer_sentinel.checkpoint_name(40) == "checkpoint-00000040.pt"
    assert [path.name for path in stabilizer_sentinel.checkpoints_in(tmp_path)] == [
        "checkpoint-00000000.pt", "checkpoint-00000040.pt", "checkpoint-00000120.pt"]
    assert stabilizer_sentinel.newest_checkpoint(tmp_path) == tmp_path / "checkpoint-00000120.pt"


def test_every_public_name_resolves():
    for name in stabilizer_sentinel.__all__:
        assert getattr(stabilizer_sentinel, name) is not None, name
