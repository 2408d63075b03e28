"""Each module of the in-job library keeps its own state: no other module assigns to it or changes it.

The integration levels talk through small named functions of the module that owns the state
(``bare_tensors.listen``, ``step_clock.stand_by``, ``script_watch.offer``, ``summary.watch_exit``, ...).
A module that appended to another's list of listeners, or set another's flag, would depend on how
that module keeps its state, and the owner could no longer tell who changes it.

In a module of model/stabilizer_sentinel/, a name another module of the package holds at module
level is ``other.NAME`` (after ``import`` or ``from package import other``) or ``NAME`` (after
``from other import NAME``). The check finds:

- an assignment to it or through it, or its deletion (``other.NAME = v``, ``NAME.x = v``,
  ``NAME[k] = v``, ``other.NAME += 1``, ``del other.NAME``, ``setattr(other, "NAME", v)``);
- a call that changes a list, dict, set or deque held there (``other.NAME.append(f)``, ``NAME.remove(f)``);
- any method call on an object the other module makes at import from a class of its own
  (``EXIT = ExitWatch()`` then ``EXIT.install()``): its methods change it;
- any use of another module's private name (``other._state``, ``from other import _state``).

Read from the source with ``ast``, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.packaging.test_import_direction import modules
from tests.packaging.test_layout import imported_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "stabilizer_sentinel"
# The methods that change a list, dict, set or deque in place.
MUTATORS = frozenset({"append", "appendleft", "extend", "extendleft", "insert", "remove", "pop", "popleft",
                      "popitem", "clear", "add", "discard", "update", "setdefault", "sort", "reverse",
                      "difference_update", "intersection_update", "symmetric_difference_update"})


def instances_made_at_import(tree: ast.Module) -> set[str]:
    """The module-level names a module binds to an instance of a class of its own (``EXIT = ExitWatch()``)."""
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    found = set()
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in classes:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {target.id for target in targets if isinstance(target, ast.Name)}
    return found


def bindings(name: str, is_package: bool, tree: ast.Module) -> dict[str, str]:
    """What each imported name of a module stands for, as a dotted name (``bare_tensors`` ->
    ``stabilizer_sentinel.loops.bare_tensors``, ``EXIT`` -> ``stabilizer_sentinel.summary.EXIT``)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            _module, *named = imported_names(name, is_package, node)
            for alias, dotted in zip(node.names, named, strict=True):
                bound[alias.asname or alias.name] = dotted
    return bound


def dotted_path(node: ast.expr) -> list[str]:
    """The names an expression reaches through, from its root name: ``a.b[k].c`` -> ``["a", "b", "c"]``."""
    names: list[str] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            names.insert(0, node.attr)
        node = node.value
    return [node.id, *names] if isinstance(node, ast.Name) else []


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def assignment_targets(node: ast.AST) -> list[ast.expr]:
    """What a statement assigns or deletes: each target, a tuple's elements one by one."""
    if isinstance(node, ast.Assign):
        return [element for target in node.targets
                for element in (target.elts if isinstance(target, ast.Tuple | ast.List) else [target])]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


class Library:
    """The modules of the in-job library under a root, read from their source."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths = modules(root, (PACKAGE,))
        self.trees = {name: ast.parse(path.read_text(), str(path)) for name, path in self.paths.items()}
        self.instances = {name: instances_made_at_import(tree) for name, tree in self.trees.items()}

    def reached(self, bound: dict[str, str], node: ast.expr) -> list[str]:
        """The dotted name an expression stands for, its imported root resolved; [] when its root is no import."""
        path = dotted_path(node)
        if not path or path[0] not in bound:
            return []
        return [*bound[path[0]].split("."), *path[1:]]

    def held(self, module: str, bound: dict[str, str], node: ast.expr) -> tuple[str, str, list[str]] | None:
        """(another module, its module-level name, what the expression reaches through that name), or None."""
        full = self.reached(bound, node)
        for cut in range(len(full) - 1, 0, -1):
            holder = ".".join(full[:cut])
            if holder in self.paths:
                return (holder, full[cut], full[cut + 1:]) if holder != module else None
        return None

    def reaches(self, module: str) -> list[str]:
        """Each place where ``module`` changes another module's module-level names, or uses a private one."""
        tree, path = self.trees[module], self.paths[module]
        bound = bindings(module, path.name == "__init__.py", tree)
        found: set[tuple[int, str]] = set()
        for node in ast.walk(tree):
            found |= {(node.lineno, f"assigns {ast.unparse(target)}") for target in assignment_targets(node)
                      if isinstance(target, ast.Attribute | ast.Subscript) and self.held(module, bound, target)}
            if isinstance(node, ast.Call):
                found |= {(node.lineno, what) for what in self.changes(module, bound, node)}
            if isinstance(node, ast.Attribute):
                held = self.held(module, bound, node)
                if held is not None and private(held[1]) and not held[2]:
                    found.add((node.lineno, f"uses the private {held[0]}.{held[1]}"))
            if isinstance(node, ast.ImportFrom):
                for alias, dotted in zip(node.names, imported_names(module, path.name == "__init__.py", node)[1:],
                                         strict=True):
                    holder = dotted.rpartition(".")[0]
                    if private(alias.name) and holder in self.paths and holder != module and dotted not in self.paths:
                        found.add((node.lineno, f"uses the private {dotted}"))
        where = path.relative_to(self.root).as_posix()
        return [f"{where}:{line} {what}" for line, what in sorted(found)]

    def changes(self, module: str, bound: dict[str, str], call: ast.Call) -> list[str]:
        """What a call changes of another module: ``setattr(other, ...)``, ``other.NAME.append(...)``,
        ``EXIT.install()`` on an object the other module made at import."""
        func = call.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and call.args:
            reached = ".".join(self.reached(bound, call.args[0]))
            if self.held(module, bound, call.args[0]) or (reached in self.paths and reached != module):
                return [f"assigns by {func.id}({ast.unparse(call.args[0])}, ...)"]
        if isinstance(func, ast.Attribute):
            held = self.held(module, bound, func.value)
            if held is not None:
                other, name, through = held
                if func.attr in MUTATORS or (not through and name in self.instances[other]):
                    return [f"changes {other}.{name} by {ast.unparse(func)}()"]
        return []


def reaches_into_other_modules(root: Path = ROOT) -> list[str]:
    """Every place a module of the in-job library under ``root`` changes another's names, or uses a private one."""
    library = Library(root)
    return [line for module in library.paths for line in library.reaches(module)]


def test_no_module_of_the_library_changes_another_modules_names():
    library = Library(ROOT)
    assert len(library.paths) > 40, "the modules of model/stabilizer_sentinel/ were not found"
    found = reaches_into_other_modules()
    assert found == [], "call a function of the module that owns the state:\n" + "\n".join(found)


def test_the_check_sees_the_changes_it_forbids(tmp_path):
    library = tmp_path / "model" / "stabilizer_sentinel"
    (library / "loops").mkdir(parents=True)
    (library / "__init__.py").write_text("")
    (library / "loops" / "__init__.py").write_text("")
    (library / "summary.py").write_text(
        "class ExitWatch:\n"
        "    def install(self): ...\n"
        "EXIT = ExitWatch()\n"
        "LISTENERS = []\n"
        "_STATE = {}\n"
        "def watch_exit():\n"
        "    EXIT.install()\n"
        "    LISTENERS.append(print)\n")
    (library / "loops" / "hooks.py").write_text(
        "import stabilizer_sentinel.summary\n"
        "from stabilizer_sentinel import summary\n"
        "from stabilizer_sentinel import summary as ended\n"
        "from stabilizer_sentinel.summary import EXIT, LISTENERS, _STATE\n"
        "summary.LISTENERS.append(print)\n"
        "def close():\n"
        "    LISTENERS.remove(print)\n"
        "ended.PRELOADED = 'checkpoint'\n"
        "stabilizer_sentinel.summary.FLAG += 1\n"
        "summary._STATE['key'] = 1\n"
        "del summary.LISTENERS[0]\n"
        "setattr(summary, 'FLAG', 2)\n"
        "EXIT.install()\n"
        "EXIT.ended, found = 'exception', None\n"
        "summary.watch_exit()\n"
        "copied = summary.LISTENERS.copy()\n"
        "listeners = []\n"
        "listeners.append(len(summary.LISTENERS))\n")
    assert reaches_into_other_modules(tmp_path) == [
        "model/stabilizer_sentinel/loops/hooks.py:4 uses the private stabilizer_sentinel.summary._STATE",
        "model/stabilizer_sentinel/loops/hooks.py:5 changes stabilizer_sentinel.summary.LISTENERS by "
        "summary.LISTENERS.append()",
        "model/stabilizer_sentinel/loops/hooks.py:7 changes stabilizer_sentinel.summary.LISTENERS by "
        "LISTENERS.remove()",
        "model/stabilizer_sentinel/loops/hooks.py:8 assigns ended.PRELOADED",
        "model/stabilizer_sentinel/loops/hooks.py:9 assigns stabilizer_sentinel.summary.FLAG",
        "model/stabilizer_sentinel/loops/hooks.py:10 assigns summary._STATE['key']",
        "model/stabilizer_sentinel/loops/hooks.py:10 uses the private stabilizer_sentinel.summary._STATE",
        "model/stabilizer_sentinel/loops/hooks.py:11 assigns summary.LISTENERS[0]",
        "model/stabilizer_sentinel/loops/hooks.py:12 assigns by setattr(summary, ...)",
        "model/stabilizer_sentinel/loops/hooks.py:13 changes stabilizer_sentinel.summary.EXIT by EXIT.install()",
        "model/stabilizer_sentinel/loops/hooks.py:14 assigns EXIT.ended",
    ]
