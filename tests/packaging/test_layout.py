"""The house rules of the tree, each a check CI runs: no import circle in any of the four packages,
no symlink, no ``sys.path`` edit.

Import circles are found on the import graph of the packages' modules, read from their source
(``ast``): every ``import`` and ``from ... import`` of a module of the four packages, at the top
level or inside a function (a circle closed by a lazy import still couples its modules; only
imports under ``if TYPE_CHECKING:`` are left out), plus the edge from a module to its parent
packages, which importing it runs first.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "stabilizer": ROOT / "stabilizer",
    "stabilizer_workflow": ROOT / "lambdas" / "stabilizer_workflow",
    "stabilizer_sentinel": ROOT / "model" / "stabilizer_sentinel",
    "stabilizer_contract": ROOT / "model" / "stabilizer_contract",
}


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def modules() -> dict[str, Path]:
    found = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an import statement names: the module, and for ``from m import n`` also ``m.n`` (maybe a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, except those under ``if TYPE_CHECKING:``."""
    found = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            for imported in imported_names(name, path.name == "__init__.py", node):
                target = imported
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    for name, targets in graph.items():  # importing a.b.c runs a and a.b first
        for target in list(targets):
            parts = target.split(".")
            for end in range(1, len(parts)):
                parent = ".".join(parts[:end])
                if parent in known and parent != name and not name.startswith(parent + "."):
                    targets.add(parent)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_circle_closed_by_a_lazy_import(tmp_path):
    a = ast.parse("from p import b\n")
    b = ast.parse("def f():\n    from p import a\n")
    graph = {"p.a": set(), "p.b": set()}
    for name, tree in (("p.a", a), ("p.b", b)):
        for node in _imports(tree):
            graph[name].update(t for t in imported_names(name, False, node) if t in graph and t != name)
    assert circles(graph) == [["p.a", "p.b"]]


def test_no_package_imports_in_a_circle():
    graph = import_graph()
    assert len(graph) > 100, "the packages' modules were not found"
    assert circles(graph) == []


@pytest.mark.slow
def test_the_tree_holds_no_symlinks():
    links = [path.relative_to(ROOT).as_posix() for path in tracked_files() if path.is_symlink()]
    assert links == []


# `sys.path.insert(...)`, `sys.path.append(...)`, `sys.path[:0] = ...`, `sys.path = ...`,
# `site.addsitedir(...)`: anything that changes where imports are looked up.
SYS_PATH_EDIT = re.compile(
    r"sys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\s*\(|\[[^\]]*\]\s*=|\+?=(?!=))|site\.addsitedir"
)


def test_the_pattern_recognises_each_kind_of_sys_path_edit():
    for edit in ("sys.path.insert(0, d)", "sys.path.append(d)", "sys.path[:0] = [d]", "sys.path = [d]",
                 "sys.path += [d]", "site.addsitedir(d)"):
        assert SYS_PATH_EDIT.search(edit), edit
    for read in ("for entry in sys.path:", "if d in sys.path:", "sys.path == before"):
        assert not SYS_PATH_EDIT.search(read), read


@pytest.mark.slow
def test_no_file_edits_sys_path():
    this = Path(__file__).resolve()
    edits: dict[str, list[str]] = {}
    for path in tracked_files():
        if path.suffix not in {".py", ".ipynb"} or path.resolve() == this or not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SYS_PATH_EDIT.search(line):
                edits.setdefault(path.relative_to(ROOT).as_posix(), []).append(f"{number}: {line.strip()}")
    assert edits == {}


def _listed_packages(pyproject: Path) -> set[str]:
    import tomllib

    return set(tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"])


def _code_packages(root_package: str, directory: Path) -> set[str]:
    """Every directory of a package that holds Python code, as a package name."""
    return {
        ".".join([root_package, *path.parent.relative_to(directory).parts])
        for path in directory.rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_the_distributions_list_every_package_on_disk():
    on_disk = set().union(*(_code_packages(name, directory) for name, directory in PACKAGES.items()))
    data = {"stabilizer.reference_job", "stabilizer_workflow.statemachine"}  # the reference job, the definition
    assert _listed_packages(ROOT / "pyproject.toml") == on_disk | data
    library = {name for name in on_disk if name.split(".")[0] in {"stabilizer_sentinel", "stabilizer_contract"}}
    assert _listed_packages(ROOT / "model" / "pyproject.toml") == library
