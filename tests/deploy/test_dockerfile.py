"""The Dockerfile's install steps work: they are replayed in a fresh virtualenv (no Docker
engine here) and the image's entrypoint starts. Its healthcheck is run against a real
coordinator."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from harness import CoordinatorProcess
from keyshard.local.processes import free_port
from tests.deploy.chart import ROOT
from tests.deploy.dockerfile import (
    Replay,
    dockerignore,
    host_environment,
    ignored,
    parse_dockerfile,
)

DOCKERFILE = ROOT / "Dockerfile"


def _pyproject_deps() -> ModuleType:
    path = ROOT / "scripts" / "pyproject_deps.py"
    spec = importlib.util.spec_from_file_location("pyproject_deps", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.packaging
@pytest.mark.timeout(900)
def test_dockerfile_install_steps_work_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """ENV, WORKDIR, COPY and RUN replayed in order with `/` moved under tmp_path, then
    ENTRYPOINT + CMD + --help. Differences from a real build, on purpose: pip may use
    its cache (PIP_NO_CACHE_DIR is not applied: the image wants no cache, the test wants
    speed), and the `useradd` step is not run (it would change this machine's users)."""
    image = parse_dockerfile(DOCKERFILE)
    base_python = getattr(sys, "_base_executable", sys.executable)
    replay = Replay(
        ROOT,
        tmp_path / "image",
        host_environment(tmp_path, base_python),
        skip_run=("useradd",),
        drop_env=("PIP_NO_CACHE_DIR",),
    )
    replay.run(image)
    assert len(replay.skipped) == 1 and "useradd" in replay.skipped[0]

    executable = shutil.which(image.entrypoint[0], path=replay.env["PATH"])
    assert executable is not None
    assert Path(executable).is_relative_to(replay.root), executable  # the image's venv
    result = subprocess.run(
        [executable, *image.entrypoint[1:], *image.cmd, "--help"],
        cwd=replay.workdir,
        env=replay.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "[env KEYSHARD_BOOTSTRAP_SERVERS]" in result.stdout
    # The package came from the image's venv, not from this checkout.
    python = Path(replay.env["VIRTUAL_ENV"]) / "bin" / "python"
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import keyshard.coordinator as c, keyshard.api as a; print(c.__file__, a.__file__)",
        ],
        cwd=replay.workdir,
        env=replay.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert where.stdout.count("site-packages") == 2 and str(ROOT) not in where.stdout


def _healthcheck(admin_listen: str) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK command, with this interpreter as the image's python."""
    command = parse_dockerfile(DOCKERFILE).healthcheck
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        env={"KEYSHARD_ADMIN_LISTEN": admin_listen, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.integration
async def test_healthcheck_passes_on_a_live_coordinator(coordinator: CoordinatorProcess) -> None:
    # The image binds 0.0.0.0; the check then asks loopback, as inside the container.
    assert _healthcheck(f"0.0.0.0:{coordinator.admin_port}").returncode == 0
    assert _healthcheck(f"127.0.0.1:{coordinator.admin_port}").returncode == 0


def test_healthcheck_fails_when_nothing_answers() -> None:
    result = _healthcheck(f"0.0.0.0:{free_port()}")
    assert result.returncode != 0
    assert "Connection refused" in result.stderr


def test_dockerfile_shape() -> None:
    image = parse_dockerfile(DOCKERFILE)
    first = image.steps[0]
    assert first.instruction == "FROM" and first.argument.startswith("python:3.11-slim")
    assert image.entrypoint == ["keyshard"] and image.cmd == ["coordinator"]
    assert image.user.split(":")[0] not in ("root", "0")
    # Dependencies are installed before any source is copied (their own cached layer).
    order = [(s.instruction, s.argument) for s in image.steps]
    deps = next(i for i, (ins, arg) in enumerate(order) if ins == "RUN" and "requirements" in arg)
    copies = [arg for ins, arg in order[:deps] if ins == "COPY"]
    assert copies == ["pyproject.toml scripts/pyproject_deps.py ./"]
    assert "coordinator" in " ".join(arg for ins, arg in order[deps:] if ins == "COPY")


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    patterns = dockerignore(ROOT)
    assert ignored("tests", patterns) and ignored("coordinator/__pycache__/x.pyc", patterns)
    assert ignored(".venv/bin/python", patterns)
    for step in parse_dockerfile(DOCKERFILE).steps:
        if step.instruction == "COPY":
            for source in step.argument.split()[:-1]:
                assert not ignored(source, patterns), source
                assert (ROOT / source).exists(), source


def test_server_requirements_come_from_pyproject() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    deps = _pyproject_deps()
    server = deps.requirements(project, ["server"])
    assert server == project["dependencies"] + project["optional-dependencies"]["server"]
    dev = deps.requirements(project, ["dev"])  # `keyshard[server]` inside dev is expanded
    assert set(server) <= set(dev) and not any(r.startswith("keyshard") for r in dev)
    with pytest.raises(ValueError, match="unknown extra 'servre'"):
        deps.requirements(project, ["servre"])
