"""`pip install keyshard` without extras, from a wheel, beside a user package named `api`.

The wheel installs one import name, `keyshard`: a user's own `api` (or `coordinator`)
package is not shadowed and does not shadow keyshard's. The `keyshard` command comes
with every install, but the daemon, the admin client and the demo need
`keyshard[server]`: on a consumer-only install `--help` must work and a server command
must say in one line which extra to install (exit 2), not fail on an import. Replayed as
a user would: a wheel built from the repository, installed with pip into a fresh
virtualenv, as tests/deploy/test_dockerfile.py does for the image.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.chart import ROOT
from tests.deploy.dockerfile import host_environment

SOURCES = ("pyproject.toml", "setup.py", "README.md")
# The import root and what it links to (keyshard/coordinator -> ../coordinator, ...).
PACKAGES = ("keyshard", "coordinator", "consumer_client", "api", "spark_jobs")


def run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.packaging
@pytest.mark.timeout(900)
def test_keyshard_on_a_consumer_only_install(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=skip, symlinks=True)
    env = host_environment(tmp_path, getattr(sys, "_base_executable", sys.executable))
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    created = run(["python", "-m", "venv", str(venv)], env, tmp_path)
    assert created.returncode == 0, created.stderr
    wheels = tmp_path / "wheels"
    built = run([python, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), "."], env, source)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = wheels.glob("keyshard-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        roots = {name.split("/")[0] for name in archive.namelist()}
    assert {root for root in roots if not root.endswith(".dist-info")} == {"keyshard"}, roots
    installed = run([python, "-m", "pip", "install", str(wheel)], env, tmp_path)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    keyshard = str(venv / "bin" / "keyshard")

    # A user's application beside it, with a package of its own named `api`.
    app = tmp_path / "app"
    (app / "api").mkdir(parents=True)
    (app / "api" / "__init__.py").write_text("OWNER = 'the user'\n")

    server_only = run(
        [str(venv / "bin" / "python"), "-c", "import fastapi"], env, tmp_path
    )  # the premise: no server extra here
    assert server_only.returncode != 0

    helped = run([keyshard, "--help"], env, tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "coordinator" in helped.stdout and helped.stderr == ""
    assert run([keyshard, "coordinator", "--help"], env, tmp_path).returncode == 0
    # The worker needs no server extra: prometheus-client (its /metrics) is a base dependency.
    assert run([keyshard, "worker", "--help"], env, tmp_path).returncode == 0
    bad_target = run([keyshard, "worker", "nope", "--group", "g", "--topics", "t"], env, tmp_path)
    assert bad_target.returncode == 2 and "is not MODULE:FUNCTION" in bad_target.stderr

    for command in (["coordinator"], ["groups"], ["demo"], ["broker"]):
        refused = run([keyshard, *command], env, tmp_path)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, (command, refused.stderr)
        assert "pip install 'keyshard[server]'" in lines[0], lines[0]
        assert lines[0].startswith(f"keyshard {command[0]}:"), lines[0]

    both = run(
        [
            python,
            "-c",
            "import api; from keyshard.consumer_client import CoordinatedConsumer; "
            "import keyshard.api.models; print(api.OWNER)",
        ],
        env,
        app,
    )
    assert both.returncode == 0, both.stderr
    assert both.stdout.strip() == "the user"
    for generic in ("coordinator", "consumer_client", "spark_jobs"):
        absent = run([python, "-c", f"import {generic}"], env, tmp_path)
        assert "No module named" in absent.stderr, (generic, absent.stderr)
