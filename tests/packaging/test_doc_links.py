"""The README is a door into docs/: its relative links and the pages' links lead somewhere.

Every relative link in README.md and docs/*.md names a file or folder of the checkout, and a link to
a heading (`page.md#anchor`, `#anchor`) finds that heading under GitHub's anchor rules. Both the
README and the index, docs/README.md, link every page of docs/. The README keeps the two commands
(`make run`, `make test`, which `.ci/run` runs) and stays short enough to read as a door.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", flags=re.M)


def prose(path: Path) -> str:
    """The page without its code: a link shown inside a code block or span is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces to
    hyphens, and a repeated anchor numbered from -1."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in relative_links(page):
        name, _, anchor = target.partition("#")
        destination = (page.parent / name).resolve() if name else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor in {destination.relative_to(ROOT)}")
    assert not broken, broken


@pytest.mark.parametrize("index", [README, DOCS / "README.md"], ids=["README.md", "docs/README.md"])
def test_the_readme_and_the_docs_index_link_every_docs_page(index):
    linked = {(index.parent / target.partition("#")[0]).resolve() for target in relative_links(index)}
    pages = {page.resolve() for page in DOCS.glob("*.md")} - {index.resolve()}
    assert not pages - linked, sorted(str(page.relative_to(ROOT)) for page in pages - linked)


def test_the_readme_keeps_the_two_commands_ci_runs_and_reads_as_a_door():
    text = README.read_text()
    assert re.search(r"^make run\b", text, flags=re.M) and re.search(r"^make test\b", text, flags=re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert len(text.splitlines()) < 300, "the README is a door: move the detail into a page of docs/"
