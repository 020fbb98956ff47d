"""Read a Dockerfile's instructions, and replay its ENV/WORKDIR/COPY/RUN steps outside
Docker (there is no Docker engine on the development machines or in CI).

Replaying: absolute paths of the image are moved under a scratch root, the build context
is the repository, and RUN steps go through `/bin/sh -c` as Docker's shell form does.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass
class Step:
    instruction: str  # ENV, WORKDIR, COPY, RUN, USER...
    argument: str


@dataclass
class Dockerfile:
    steps: list[Step] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # as declared, `$VAR` unexpanded
    exposed: set[int] = field(default_factory=set)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    user: str = "root"


def logical_lines(text: str) -> list[str]:
    """Instructions with their backslash continuations joined, comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def env_pairs(argument: str) -> list[tuple[str, str]]:
    """`ENV A=1 B="two words"` -> [(A, 1), (B, two words)]."""
    pairs = []
    for token in shlex.split(argument):
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"ENV {argument!r}: only the KEY=VALUE form is supported")
        pairs.append((key, value))
    return pairs


def _exec_form(argument: str) -> list[str]:
    value = json.loads(argument)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), argument
    return value


def parse_dockerfile(path: Path) -> Dockerfile:
    parsed = Dockerfile()
    for line in logical_lines(path.read_text(encoding="utf-8")):
        instruction, _, argument = line.partition(" ")
        instruction, argument = instruction.upper(), argument.strip()
        parsed.steps.append(Step(instruction, argument))
        if instruction == "ENV":
            parsed.env.update(env_pairs(argument))
        elif instruction == "EXPOSE":
            parsed.exposed |= {int(p.split("/")[0]) for p in argument.split()}
        elif instruction == "ENTRYPOINT":
            parsed.entrypoint = _exec_form(argument)
        elif instruction == "CMD":
            parsed.cmd = _exec_form(argument)
        elif instruction == "USER":
            parsed.user = argument
        elif instruction == "HEALTHCHECK":
            _options, _, command = argument.partition("CMD ")
            parsed.healthcheck = _exec_form(command.strip())
    return parsed


def dockerignore(context: Path) -> list[str]:
    path = context / ".dockerignore"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [p.strip() for p in lines if p.strip() and not p.strip().startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: a pattern matches the path or any parent of it;
    `**/` matches at any depth. (No `!` exceptions: this project uses none.)"""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        assert not pattern.startswith("!"), "exceptions are not supported here"
        if pattern.startswith("**/"):
            tail = pattern[3:]
            if any(fnmatch.fnmatch(part, tail) for part in parts):
                return True
        elif any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
    return False


@dataclass
class Replay:
    """Runs the steps of a Dockerfile with `/` moved to `root`."""

    context: Path
    root: Path
    env: dict[str, str]
    skip_run: tuple[str, ...] = ()  # RUN steps containing one of these are not run
    drop_env: tuple[str, ...] = ()  # ENV settings not applied
    workdir: Path = field(init=False)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = self.root
        self.patterns = dockerignore(self.context)

    def rebase(self, path: str) -> Path:
        return self.root / path.lstrip("/") if path.startswith("/") else self.workdir / path

    def expand(self, value: str) -> str:
        return _VAR.sub(lambda m: self.env.get(m[1] or m[2], ""), value)

    def run(self, dockerfile: Dockerfile, until: str = "ENTRYPOINT") -> None:
        for step in dockerfile.steps:
            if step.instruction == until:
                return
            handler = getattr(self, f"_{step.instruction.lower()}", None)
            if handler is not None:
                handler(step.argument)

    def _env(self, argument: str) -> None:
        for key, value in env_pairs(argument):
            if key in self.drop_env:
                continue
            # A literal absolute path is the image's; `$VAR` parts are rebased already.
            literal = value.startswith("/")
            value = self.expand(value)
            self.env[key] = str(self.rebase(value)) if literal else value

    def _workdir(self, argument: str) -> None:
        self.workdir = self.rebase(self.expand(argument))
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _copy(self, argument: str) -> None:
        *sources, dest = shlex.split(argument)
        assert not any(s.startswith("--") for s in sources), "COPY flags are not replayed"
        target = self.rebase(dest)
        for source in sources:
            assert not ignored(source, self.patterns), f"{source} is in .dockerignore"
            origin = self.context / source
            if origin.is_dir():
                shutil.copytree(origin, target, dirs_exist_ok=True, ignore=self._ignore)
            else:
                into = target / origin.name if dest.endswith("/") or len(sources) > 1 else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into)

    def _ignore(self, directory: str, names: list[str]) -> list[str]:
        relative = Path(directory).relative_to(self.context)
        return [n for n in names if ignored(str(relative / n).removeprefix("./"), self.patterns)]

    def _run(self, argument: str) -> None:
        if any(marker in argument for marker in self.skip_run):
            self.skipped.append(argument)
            return
        result = subprocess.run(
            ["/bin/sh", "-c", argument],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"RUN {argument}\nexit {result.returncode}\n{result.stdout[-3000:]}"
                f"\n{result.stderr[-3000:]}"
            )


def host_environment(scratch: Path, python: str) -> dict[str, str]:
    """A clean environment whose `python` is the given interpreter (the image's base
    python:3.11 stands for it); nothing of the test run's own venv or settings leaks."""
    bin_dir = scratch / "host-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "python"
    if not link.exists():
        link.symlink_to(python)
    # The machine's own pip, proxy and CA settings still apply: they say how this host
    # reaches PyPI, as a build host's would.
    keep = re.compile(
        r"^(HOME|LANG|LC_ALL|TMPDIR|PIP_\w+|SSL_CERT_\w+|REQUESTS_CA_BUNDLE|\w*_proxy)$", re.I
    )
    env = {k: v for k, v in os.environ.items() if keep.match(k)}
    env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    return env
