"""Print the requirements of keyshard (and of the given extras) from pyproject.toml.

The Dockerfile installs these in a layer of their own, before any source is copied, so
a source change does not reinstall every dependency. pip has no "dependencies only" mode,
hence this script; it resolves the extras' references to other keyshard extras
(`keyshard[server]` inside `dev`).

Usage: python pyproject_deps.py [--pyproject PATH] [EXTRA ...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

_SELF = re.compile(r"^\s*(?P<name>[A-Za-z0-9_.-]+)\s*\[(?P<extras>[^\]]*)\]\s*$")


def requirements(project: dict[str, Any], extras: list[str]) -> list[str]:
    """The project's dependencies plus those of each extra, self-references expanded,
    in first-seen order without duplicates. An unknown extra is an error, not a no-op."""
    name = str(project["name"]).lower()
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    out: list[str] = []
    seen_extras: set[str] = set()

    def add(requirement: str) -> None:
        match = _SELF.match(requirement)
        if match and match["name"].lower() == name:
            for extra in match["extras"].split(","):
                visit(extra.strip())
        elif requirement not in out:
            out.append(requirement)

    def visit(extra: str) -> None:
        if extra in seen_extras:
            return
        if extra not in optional:
            known = ", ".join(sorted(optional)) or "none"
            raise ValueError(f"unknown extra {extra!r} (known: {known})")
        seen_extras.add(extra)
        for requirement in optional[extra]:
            add(requirement)

    for requirement in project.get("dependencies", []):
        add(requirement)
    for extra in extras:
        visit(extra)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("extras", nargs="*")
    args = parser.parse_args(argv)
    project = tomllib.loads(args.pyproject.read_text(encoding="utf-8"))["project"]
    try:
        lines = requirements(project, args.extras)
    except ValueError as err:
        print(f"pyproject_deps: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
