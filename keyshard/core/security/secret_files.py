"""Secrets from a file or the environment, never from a command line.

A command line is readable by every user of the machine (`ps`, /proc/<pid>/cmdline) and
lands in shell histories and process listings that get pasted into tickets. So every
token flag has a `...-file` form (what a Kubernetes Secret mounted as a volume gives) and
an environment variable; the plain flag still works, with a warning that says where the
value shows.
"""

from __future__ import annotations

from pathlib import Path


class SecretFileError(ValueError):
    """A secret file that cannot be used, or a secret given twice: said in one line."""


def read_secret_file(path: str, flag: str) -> str:
    """The secret in `path`: its text without the surrounding whitespace (the newline an
    editor or `echo` leaves). A missing, unreadable or empty file is a SecretFileError
    naming `flag`."""
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise SecretFileError(f"{flag} {path}: cannot read it: {err}") from None
    if not secret:
        raise SecretFileError(f"{flag} {path}: the file is empty")
    return secret


def secret_from(
    value: str | None,
    path: str | None,
    *,
    flag: str,
    file_flag: str,
    env_value: str | None,
) -> tuple[str | None, str | None]:
    """The secret a pair of settings gives, and a warning to show when it was a plain
    command-line value.

    `value` is what the flag (or its environment variable, `env_value` when set) holds;
    `path` what the file flag holds. Both given is a SecretFileError: which one counts
    must not depend on an ordering rule nobody remembers."""
    if value is not None and path is not None:
        raise SecretFileError(f"give {flag} or {file_flag}, not both")
    if path is not None:
        return read_secret_file(path, file_flag), None
    if value is None or value == env_value:
        return value, None
    return value, (
        f"{flag} on the command line is visible to every user of this machine (ps, "
        f"/proc/<pid>/cmdline): use {file_flag} or the environment instead"
    )
