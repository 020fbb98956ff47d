"""README.md's links into the repository resolve (the docs' own links are checked by
`mkdocs build --strict` in scripts/test.sh; README.md is outside the site)."""

from __future__ import annotations

import re

from tests.docs.blocks import ROOT

_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_links_point_at_files() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in _LINK.findall(text) if "://" not in t]
    assert targets, "README.md links into the docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def test_readme_stays_short() -> None:
    """A README of a few KB; everything else is in the docs site."""
    assert len((ROOT / "README.md").read_bytes()) <= 6 * 1024
