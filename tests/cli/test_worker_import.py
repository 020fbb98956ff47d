"""A handler module that cannot be imported is one line and exit status 2, as for any bad
MODULE:FUNCTION: the error with its file and line, and for a package Python cannot find,
where it looked. Run as a user runs it, from the application's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = {
    "syntax": "x = 1\ndef handle(record)\n    pass\n",
    "raises": "import json\n\nraise RuntimeError('no settings file')\n",
    "needs": "import no_such_dependency_xyz\n",
}


def worker(target: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KEYSHARD_")}
    clean.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "keyshard", "worker", target, "--group", "g", "--topics", "t",
         "--bootstrap-servers", "127.0.0.1:9"],
        cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    for name, source in MODULES.items():
        (tmp_path / "myapp" / f"{name}.py").write_text(source)
    return tmp_path


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("syntax", "SyntaxError: expected ':' (myapp/syntax.py, line 2)"),
        ("raises", "RuntimeError: no settings file (myapp/raises.py, line 3)"),
        ("needs", "ModuleNotFoundError: No module named 'no_such_dependency_xyz' "
                  "(myapp/needs.py, line 1)"),
    ],
)  # fmt: skip
def test_a_module_that_fails_at_import_is_one_line(module: str, expected: str, app: Path) -> None:
    line = one_line(worker(f"myapp.{module}:handle", app))
    assert line == f"keyshard worker: cannot import myapp.{module}: {expected}"


def test_a_package_not_found_names_where_python_looked(app: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    line = one_line(worker("myapp.syntax:handle", elsewhere, PYTHONPATH="/opt/nothing"))
    assert line.startswith("keyshard worker: cannot import myapp.syntax: ModuleNotFoundError: ")
    assert "No module named 'myapp'" in line
    assert f"working directory {elsewhere}" in line and "PYTHONPATH (/opt/nothing)" in line
    # The package itself is found, a module in it is not: no advice about where to look.
    line = one_line(worker("myapp.nothing:handle", app))
    assert line == (
        "keyshard worker: cannot import myapp.nothing: ModuleNotFoundError: "
        "No module named 'myapp.nothing'"
    )
