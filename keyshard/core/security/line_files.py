"""The files operators write a line per entry (tokens, ACLs, admin roles): read, split
into fields as a shell would (quotes around a field with spaces, `#` comments), and every
error naming the file, the line and the flag, never the line's text (it may hold a
secret)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path


def fields_by_line(
    text: str, source: str, error: type[ValueError]
) -> Iterator[tuple[str, list[str]]]:
    """(`<source> line <n>`, its fields) for each line that has any."""
    for where, fields, _ in lines_with_fields(text, source, error):
        yield where, fields


def lines_with_fields(
    text: str, source: str, error: type[ValueError]
) -> Iterator[tuple[str, list[str], str]]:
    """(`<source> line <n>`, its fields, the line as written) for each line that has any
    fields: for a reader that must tell a field as written from one the quoting changed."""
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{source} line {number}"
        try:
            fields = shlex.split(line, comments=True)
        except ValueError:
            raise error(f"{where}: unbalanced quotes") from None
        if fields:
            yield where, fields, line


def read_line_file(path: str, flag: str, error: type[ValueError]) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"{flag} {path}: cannot read it: {err}") from None
