"""Imports point one way: down the floors of ``stabilizer``, and from infra/ only to the bottom floor.

The floors, top to bottom, are `FLOORS`: the benchmarks, the command line, the client, local mode
(its engine, then the SageMaker emulator and the IAM access check the engine stands up, then
what they share: where the project's parts are), and the floor they all stand on (source packing,
reports, the SNS mailbox, the training images). A module imports modules of its own floor and of
the floors below it, never one above: local mode runs without the client, the client without the
command line, the emulator and the access check without the engine. The CDK app (infra/) imports of
``stabilizer`` only the bottom floor: synthesizing the stack never loads local mode or the client.

The in-job library ``stabilizer_sentinel`` has floors of its own, `SENTINEL_FLOORS`: its commands and
documented doors (``launch``, ``evaluator``, the autostart ``sitecustomize``, the old paths
``lightning_callback`` and ``smdebug_compat``), then ``integration`` (how a script gets watched, the
guard), then ``detection`` and ``recovery``, then ``rules`` and ``loops``, then ``capture`` (capture,
the store, the Trial API), and at the bottom what all of them share (``job_config``, ``summary``, ``failsafe``,
``say``, ``handle_ids``). The checks run without the guard, the rules without the checks, the store without the rules.

Every ``import`` and ``from ... import`` counts, at the top of a module or inside a function, and
under ``if TYPE_CHECKING:`` too (a type from a floor above still points up); relative imports are
resolved against the module's package. Read from the source with ``ast``, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.packaging.test_layout import imported_names

ROOT = Path(__file__).resolve().parents[2]

# Top to bottom. A module of `stabilizer` belongs to the floor of the longest name here that it
# is or lies under; `stabilizer` itself (its __init__) is on the bottom floor.
FLOORS = (
    ("stabilizer.bench",),
    ("stabilizer.cli",),
    ("stabilizer.client",),
    ("stabilizer.local.engine",),
    ("stabilizer.local.emulator", "stabilizer.local.iam"),
    ("stabilizer.local",),
    ("stabilizer", "stabilizer.source", "stabilizer.reports", "stabilizer.mailbox", "stabilizer.training_images"),
)
BOTTOM = len(FLOORS) - 1

# The in-job library, top to bottom, read the same way; `stabilizer_sentinel` itself (its __init__,
# whose exports are resolved on first use) is on the bottom floor.
SENTINEL_FLOORS = (
    ("stabilizer_sentinel.launch", "stabilizer_sentinel.evaluator", "stabilizer_sentinel.autostart",
     "stabilizer_sentinel.lightning_callback", "stabilizer_sentinel.smdebug_compat"),
    ("stabilizer_sentinel.integration",),
    ("stabilizer_sentinel.detection", "stabilizer_sentinel.recovery"),
    ("stabilizer_sentinel.rules", "stabilizer_sentinel.loops"),
    ("stabilizer_sentinel.capture",),
    ("stabilizer_sentinel", "stabilizer_sentinel.job_config", "stabilizer_sentinel.summary",
     "stabilizer_sentinel.failsafe", "stabilizer_sentinel.say", "stabilizer_sentinel.handle_ids"),
)


def floor_of(module: str, floors: tuple[tuple[str, ...], ...] = FLOORS) -> int | None:
    """The floor of a module, or None when no name in `floors` holds it.

    The first name of the bottom floor is the package itself: it holds only the package's __init__."""
    package = floors[-1][0]
    if module == package:
        return len(floors) - 1
    holders = [(len(name), number) for number, names in enumerate(floors) for name in names
               if name != package and (module == name or module.startswith(name + "."))]
    return max(holders)[1] if holders else None


def modules(root: Path, packages: tuple[str, ...] = ("stabilizer", "infra")) -> dict[str, Path]:
    """Every module of `packages` (stabilizer/ and infra/; model/stabilizer_sentinel/) under `root`, by dotted name."""
    found = {}
    for top in packages:
        directory = root / "model" / top if top == "stabilizer_sentinel" else root / top
        for path in sorted(directory.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = [top, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def module_of(named: str, known: dict[str, Path]) -> str:
    """The module an imported name lies in: ``from m import a_function`` imports m."""
    while named not in known and "." in named:
        named = named.rpartition(".")[0]
    return named


def upward_imports(root: Path = ROOT, floors: tuple[tuple[str, ...], ...] = FLOORS) -> list[str]:
    """Each import under `root` that points up one of `floors`, or from infra/ above the bottom floor, as a line.

    `FLOORS` reads stabilizer/ and infra/; `SENTINEL_FLOORS` reads model/stabilizer_sentinel/."""
    package = floors[-1][0]
    known = modules(root, ("stabilizer", "infra") if package == "stabilizer" else (package,))
    found = []
    for name, path in known.items():
        own = len(floors) - 1 if name.split(".")[0] == "infra" else floor_of(name, floors)
        if own is None:
            continue  # test_every_module_..._is_on_a_floor names it
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = set()
            for named in imported_names(name, path.name == "__init__.py", node):
                target = module_of(named, known)
                floor = floor_of(target, floors) if target.split(".")[0] == package else None
                if floor is not None and floor < own:
                    targets.add((target, floor))
            for target, floor in targets:  # `from p import m` names p and p.m: m says more
                if not any(other.startswith(target + ".") for other, _ in targets):
                    where = path.relative_to(root).as_posix()
                    found.append(f"{where}:{node.lineno} ({name}) imports {target}, "
                                 f"on floor {', '.join(floors[floor])}, above its own")
    return sorted(set(found))


def test_the_checker_finds_an_upward_import_inside_a_function(tmp_path):
    (tmp_path / "stabilizer" / "local").mkdir(parents=True)
    (tmp_path / "stabilizer" / "client").mkdir()
    (tmp_path / "infra").mkdir()
    for package in ("stabilizer", "stabilizer/local", "stabilizer/client", "infra"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "stabilizer" / "client" / "mailbox.py").write_text("")
    (tmp_path / "stabilizer" / "client" / "inputs.py").write_text("from stabilizer.local.engine import run\n")
    (tmp_path / "stabilizer" / "local" / "engine.py").write_text(
        "def run():\n    from ..client.mailbox import Mailbox\n")
    (tmp_path / "infra" / "stack.py").write_text("from stabilizer import local\n")
    assert upward_imports(tmp_path) == [
        "infra/stack.py:1 (infra.stack) imports stabilizer.local, on floor stabilizer.local, above its own",
        "stabilizer/local/engine.py:2 (stabilizer.local.engine) imports stabilizer.client.mailbox, "
        "on floor stabilizer.client, above its own",
    ]


def test_every_module_of_stabilizer_is_on_a_floor():
    names = [name for name in modules(ROOT) if name.split(".")[0] == "stabilizer"]
    assert len(names) > 50, "the modules of stabilizer/ were not found"
    assert [name for name in names if floor_of(name) is None] == [], "add the package to FLOORS"


def test_imports_point_down_the_floors_and_infra_imports_only_the_bottom():
    upward = upward_imports()
    assert upward == [], "imports that point up:\n" + "\n".join(upward)


def test_the_checker_finds_an_upward_import_in_the_sentinel(tmp_path):
    library = tmp_path / "model" / "stabilizer_sentinel"
    for package in ("", "capture", "detection", "integration"):
        (library / package).mkdir(parents=True, exist_ok=True)
        (library / package / "__init__.py").write_text("")
    (library / "integration" / "guard.py").write_text("from stabilizer_sentinel.detection import sentinel\n")
    (library / "detection" / "sentinel.py").write_text("from stabilizer_sentinel.capture import store\n")
    (library / "capture" / "store.py").write_text("def write():\n    from ..detection import sentinel\n")
    (library / "summary.py").write_text("import stabilizer_sentinel.integration.guard\n")
    assert upward_imports(tmp_path, SENTINEL_FLOORS) == [
        "model/stabilizer_sentinel/capture/store.py:2 (stabilizer_sentinel.capture.store) imports "
        "stabilizer_sentinel.detection.sentinel, on floor stabilizer_sentinel.detection, "
        "stabilizer_sentinel.recovery, above its own",
        "model/stabilizer_sentinel/summary.py:1 (stabilizer_sentinel.summary) imports "
        "stabilizer_sentinel.integration.guard, on floor stabilizer_sentinel.integration, above its own",
    ]


def test_every_module_of_the_sentinel_is_on_a_floor():
    names = list(modules(ROOT, ("stabilizer_sentinel",)))
    assert len(names) > 40, "the modules of model/stabilizer_sentinel/ were not found"
    assert [name for name in names if floor_of(name, SENTINEL_FLOORS) is None] == [], "add it to SENTINEL_FLOORS"


def test_the_sentinels_imports_point_down_its_floors():
    upward = upward_imports(ROOT, SENTINEL_FLOORS)
    assert upward == [], "imports that point up:\n" + "\n".join(upward)
