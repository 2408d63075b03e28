"""Patterns in the syntax of `.gitignore`, read from a job source's `.stabilizerignore`.

Only the matching: which paths, relative to the source's root, the patterns leave out.
`stabilizer.source.sourcedir` decides what else stays out of a source and packs it. No dependency
(pathspec is not among the project's): the forms `IgnoreRules` lists are the ones supported, and a
test compares their verdicts with git's own on the same patterns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negated: bool
    directory_only: bool
    anchored: bool


def _stars(glob: str, i: int) -> tuple[str, int]:
    """The run of ``*`` at `i`: ``**`` as a whole segment crosses directories, anything else does not."""
    j = i
    while j < len(glob) and glob[j] == "*":
        j += 1
    starts_segment = i == 0 or glob[i - 1] == "/"
    ends_segment = j == len(glob) or glob[j] == "/"
    if j - i == 2 and starts_segment and ends_segment:
        if j == len(glob):
            return ".*", j  # "dir/**": everything inside
        return "(?:.*/)?", j + 1  # "**/x" or "a/**/b": zero or more directories
    return "[^/]*", j


def _bracket(glob: str, i: int) -> tuple[str, int]:
    """The character class at `i` (``[abc]``, ``[a-z]``, ``[!a]``), or a literal ``[`` without a closing one."""
    j = i + 1
    if j < len(glob) and glob[j] in "!^":
        j += 1
    if j < len(glob) and glob[j] == "]":
        j += 1
    while j < len(glob) and glob[j] != "]":
        j += 1
    if j >= len(glob):
        return re.escape("["), i + 1
    body = glob[i + 1 : j]
    negate = body[:1] in ("!", "^")
    body = (body[1:] if negate else body).replace("\\", "\\\\")
    return f"[{'^/' if negate else ''}{body}]", j + 1


def _translate(glob: str) -> str:
    """A gitignore glob as a regular expression over a `/`-separated path (no anchors added)."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            part, i = _stars(glob, i)
        elif c == "[":
            part, i = _bracket(glob, i)
        elif c == "?":
            part, i = "[^/]", i + 1
        elif c == "\\" and i + 1 < len(glob):
            part, i = re.escape(glob[i + 1]), i + 2
        else:
            part, i = re.escape(c), i + 1
        out.append(part)
    return "".join(out)


def _rule(line: str) -> _Rule | None:
    line = line.rstrip("\n").rstrip("\r")
    # Trailing spaces are ignored unless escaped with a backslash, as in git.
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated or line.startswith(("\\!", "\\#")):
        line = line[1:]
    directory_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.removeprefix("/")
    return _Rule(re.compile(f"^{_translate(line)}$"), negated, directory_only, anchored)


class IgnoreRules:
    """Patterns in the syntax of `.gitignore`, matched against paths relative to the source root.

    Supported, as git reads them: one pattern a line; blank lines and lines starting with ``#``
    are skipped (``\\#`` for a leading ``#``); ``!`` re-includes what an earlier pattern left out
    (``\\!`` for a leading ``!``); a trailing ``/`` matches directories only; a pattern with a ``/``
    at its start or in its middle is relative to the source root, one without matches a name at
    any depth; ``*`` and ``?`` match within one path segment, ``[abc]``, ``[a-z]`` and ``[!a]``
    one character; ``**/`` at the start, ``/**/`` in the middle and ``/**`` at the end match any
    number of directories; ``\\`` escapes the next character; the last matching pattern wins.
    As in git, a file inside a left-out directory cannot be re-included. Not read: ignore files
    in subdirectories, ``.gitignore`` itself, git's global excludes.
    """

    def __init__(self, lines: Iterable[str] = ()) -> None:
        self.rules = [rule for rule in (_rule(line) for line in lines) if rule is not None]

    @classmethod
    def read(cls, path: Path, extra: Iterable[str] = ()) -> IgnoreRules:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
        return cls([*lines, *extra])

    def __bool__(self) -> bool:
        return bool(self.rules)

    def ignored(self, relative: str, is_dir: bool) -> bool:
        name = relative.rsplit("/", 1)[-1]
        verdict = False
        for rule in self.rules:
            if rule.directory_only and not is_dir:
                continue
            if rule.regex.match(relative if rule.anchored else name):
                verdict = not rule.negated
        return verdict
