"""A Guard is driven through its methods: the scripts and integration levels assign to none of its attributes.

model/train.py, the Lightning callback, the launcher, watch() and the stabilizer package tell a
guard what happened (`restores_checkpoints`, `resumed`, `begin_step`, `check_counted`, `failed`); a
caller that set `guard.record.restores` or `guard.step_number` itself would depend on how the guard
keeps them. The guard's own parts (its step clock, log channel, DDP agreement) keep its record with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SENTINEL = ROOT / "model" / "stabilizer_sentinel"
CALLERS = [ROOT / "model" / "train.py",
           SENTINEL / "launch.py",
           *(SENTINEL / "integration" / f"{name}.py"
             for name in ("lightning_callback", "launcher_hooks", "script_watch")),
           *sorted((ROOT / "stabilizer").rglob("*.py"))]


def _reaches_a_guard(target: ast.expr) -> bool:
    """`guard.x`, `guard.x.y`, `self.guard.x`: an attribute reached through a name or attribute `guard`."""
    node = target
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
        if isinstance(node, ast.Name) and node.id == "guard":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "guard":
            return True
    return False


def guard_assignments(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                targets += target.elts if isinstance(target, ast.Tuple) else [target]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        found += [f"{name}:{node.lineno} {ast.unparse(t)}" for t in targets if _reaches_a_guard(t)]
    return found


def test_no_script_or_integration_level_sets_a_guards_attributes():
    assert all(path.is_file() for path in CALLERS) and len(CALLERS) > 50
    found = [hit for path in CALLERS for hit in guard_assignments(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert found == []


def test_the_check_sees_the_assignments_it_forbids():
    source = ("guard.record.restores = True\n"
              "self.guard.step_number = 3\n"
              "self.guard.record.steps_taken += 1\n"
              "ended, self.guard.record.exception = 'x', 'y'\n"
              "guard = make()\n"
              "self.guard = make()\n")
    assert guard_assignments(source, "m") == [
        "m:1 guard.record.restores", "m:2 self.guard.step_number", "m:3 self.guard.record.steps_taken",
        "m:4 self.guard.record.exception"]
