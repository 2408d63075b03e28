"""The watcher's lines on stderr are written in one call each (stabilizer_sentinel.say): processes that share one
stderr (ranks started by ``torch.multiprocessing.spawn``) cannot join two lines, as ``print``'s two writes could."""

from __future__ import annotations

import ast
import io
import sys

from stabilizer_sentinel.say import say
from tests.helpers import MODEL_DIR

PACKAGE = MODEL_DIR / "stabilizer_sentinel"
# The commands print their own usage and errors, each in a process of its own; the autostart imports nothing of
# the package before it must (it runs in every process of a job).
COMMANDS = {"launch.py", "evaluator.py", "autostart/sitecustomize.py"}


class Recording(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1


def test_a_line_and_its_newline_are_one_write_and_are_flushed(monkeypatch):
    stream = Recording()
    monkeypatch.setattr(sys, "stderr", stream)
    say("sentinel: Diverging at step 3: the loss rose")
    assert stream.calls == ["sentinel: Diverging at step 3: the loss rose\n"]
    assert stream.flushes == 1
    print("a line", file=stream)  # what say replaces: the text, then its newline
    assert stream.calls[1:] == ["a line", "\n"]


def test_with_no_stderr_say_writes_nothing_as_print_does(monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)
    say("nowhere to go")  # as print does with no stderr: nothing, and no error


def test_the_watchers_modules_write_stderr_through_say_alone():
    printed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in COMMANDS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and any(
                    keyword.arg == "file" and ast.unparse(keyword.value) == "sys.stderr" for keyword in node.keywords):
                printed.append(f"{relative}:{node.lineno}")
    assert printed == []
