"""The README is a front door (at most 8 KB, the quick start first) and no relative link in it or in docs/ is
broken: every file or folder a link names exists, and every #anchor into a Markdown page is one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(path: Path) -> str:
    """The page without code blocks and code spans, where a bracket is not a link."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*?)\s*$", _prose(path), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_the_readme_is_a_front_door():
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert readme.stat().st_size <= 8 * 1024
    assert "make demo" in text and "make test" in text and "envace app" in text
    assert "docs/figures/act-rehearse.svg" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", _prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert broken == []
