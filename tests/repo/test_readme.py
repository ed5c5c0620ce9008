"""The README and docs/*.md hold together: every relative link names a file
that exists, every ``#anchor`` a heading of its target (GitHub's slugs), and
the README stays short enough to read in five minutes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code (no links there)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file (repeats get -1, -2, ...)."""
    found: set[str] = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = name = slug(heading)
        n = 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` that lead nowhere, with the reason."""
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto: leave the repository
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor}")
    return broken


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_docs_are_there() -> None:
    assert len(DOCUMENTS) > 5, DOCUMENTS


def test_the_readme_reads_in_five_minutes() -> None:
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


def test_every_document_is_linked_from_the_readme_or_the_index() -> None:
    linked = {Path(t.partition("#")[0]).name
              for doc in (REPO / "README.md", REPO / "docs" / "README.md")
              for t in LINK.findall(prose(doc.read_text()))}
    assert {p.name for p in DOCUMENTS[1:]} - linked - {"README.md"} == set()


# ---------------------------------------------------------------- the checker itself
def test_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `make bench` figures\n")
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## Top\n\n"
                    "[ok](other.md#the-make-bench-figures) [ok](#top-1) [ok](https://x/#y)\n"
                    "[bad](gone.md) [bad](other.md#nowhere) [bad](#missing)\n"
                    "```\n[not a link](gone-too.md)\n```\n`[code](gone-three.md)`\n")
    assert broken_links(page) == ["gone.md: no such file", "other.md#nowhere: no heading #nowhere",
                                  "#missing: no heading #missing"]


def test_slug_follows_github() -> None:
    assert slug("Relay, webhooks and the cleaner") == "relay-webhooks-and-the-cleaner"
    assert slug("Queue figures (`make bench`)") == "queue-figures-make-bench"
    assert slug("Installing on Debian: the .deb") == "installing-on-debian-the-deb"
