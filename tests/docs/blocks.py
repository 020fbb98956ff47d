"""The code examples of README.md and docs/, as the tests see them.

An example is a fenced ```python or ```bash block. The HTML comment on the line before it
says what happens to it (docs/development.md): `<!-- test: NAME -->` (run by the test of
that name, with `, file PATH` or `, background NAME` for how), or
`<!-- test: skip, REASON -->` (not run, and why).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_LANGUAGES = ("python", "bash")

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- test: (?P<body>.*?) -->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str | None  # the marker's text after "test: ", or None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def test(self) -> str | None:
        """The test that runs this block (None: skipped or unmarked)."""
        if self.marker is None or self.marker.startswith("skip"):
            return None
        return self.marker.split(",")[0].strip()

    def option(self, name: str) -> str | None:
        """`file` or `background` of a marker such as `walkthrough, file produce.py`."""
        for part in (self.marker or "").split(",")[1:]:
            key, _, value = part.strip().partition(" ")
            if key == name:
                return value.strip()
        return None


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(
            Block(
                path=path,
                line=i + 1,
                language=opening[1],
                code="\n".join(lines[i + 1 : end]) + "\n",
                marker=marker["body"] if marker else None,
            )
        )
        i = end + 1
    return found


def examples() -> list[Block]:
    return [b for p in doc_files() for b in blocks(p) if b.language in EXAMPLE_LANGUAGES]


def examples_of(test: str) -> list[Block]:
    """The blocks a test runs, in document order."""
    return [b for b in examples() if b.test == test]
