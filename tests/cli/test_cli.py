"""Bad configuration of `keyshard coordinator` is refused up front: exit code 2 and a
message naming the flag and the value, whether it came from a flag or its env var."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from keyshard.cli.parser import build_parser
from keyshard.local.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYSHARD_")}
    env["COLUMNS"] = "200"  # keep argparse from wrapping help lines
    env.update(extra)
    return env


def _coordinator(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `keyshard coordinator` with valid defaults for everything not under test; a
    broker that is not there, so a config that slips through fails fast, not by hanging
    or by starting an embedded broker."""
    defaults = {
        "--bootstrap-servers": f"127.0.0.1:{free_port()}",
        "--listen": f"127.0.0.1:{free_port()}",
        "--admin-listen": f"127.0.0.1:{free_port()}",
    }
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    given |= {f"--{k.removeprefix('KEYSHARD_').lower().replace('_', '-')}" for k in env}
    argv = [x for flag, value in defaults.items() if flag not in given for x in (flag, value)]
    return subprocess.run(
        [sys.executable, "-m", "keyshard", "coordinator", *argv, *args],
        cwd=REPO_ROOT,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, f"expected one argparse error line, stderr: {result.stderr!r}"
    return lines[0]


@pytest.mark.parametrize(
    ("args", "flag", "value"),
    [
        (["--listen", "nonsense"], "--listen", "nonsense"),
        (["--listen", "127.0.0.1:99999"], "--listen", "127.0.0.1:99999"),
        (["--listen", ":7171"], "--listen", ":7171"),
        (["--admin-listen", "localhost"], "--admin-listen", "localhost"),
        (["--drain-timeout-ms", "-5"], "--drain-timeout-ms", "-5"),
        (["--drain-timeout-ms=-5"], "--drain-timeout-ms", "-5"),
        (["--drain-timeout-ms", "0"], "--drain-timeout-ms", "0"),
        (["--drain-timeout-ms", "abc"], "--drain-timeout-ms", "abc"),
        (["--drain-timeout-ms", "1.5"], "--drain-timeout-ms", "1.5"),
        (["--replica-timeout-ms", "soon"], "--replica-timeout-ms", "soon"),
        (["--state-partitions", "0"], "--state-partitions", "0"),
        (["--advertise", "nohost"], "--advertise", "nohost"),
        (["--lost-member-margin-ms", "-1"], "--lost-member-margin-ms", "-1"),
        (["--max-capacity", "0"], "--max-capacity", "0"),
        (["--max-session-timeout-ms", "ten"], "--max-session-timeout-ms", "ten"),
        (["--max-members-per-group", "-1"], "--max-members-per-group", "-1"),
        (["--max-groups", "0"], "--max-groups", "0"),
        (["--max-speed-factor", "0.5"], "--max-speed-factor", "0.5"),
    ],
)
def test_bad_flag_exits_2_naming_flag_and_value(args: list[str], flag: str, value: str) -> None:
    result = _coordinator(*args)
    assert result.returncode == 2, result
    line = _error_line(result)
    assert flag in line and value in line, line
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("env", "flag", "value"),
    [
        ("KEYSHARD_DRAIN_TIMEOUT_MS", "--drain-timeout-ms", "abc"),
        ("KEYSHARD_DRAIN_TIMEOUT_MS", "--drain-timeout-ms", "-5"),
        ("KEYSHARD_LISTEN", "--listen", "nonsense"),
    ],
)
def test_bad_env_var_exits_2_naming_flag_and_value(env: str, flag: str, value: str) -> None:
    result = _coordinator(**{env: value})
    assert result.returncode == 2, result
    line = _error_line(result)
    assert flag in line and value in line, line


def test_session_timeout_bounds_that_contradict_each_other_exit_2_naming_both() -> None:
    result = _coordinator(
        "--min-session-timeout-ms", "30000", KEYSHARD_MAX_SESSION_TIMEOUT_MS="20000"
    )
    assert result.returncode == 2, result
    assert "30000" in result.stderr and "20000" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_bad_flag_is_rejected_even_with_a_valid_env_var() -> None:
    result = _coordinator("--drain-timeout-ms", "abc", KEYSHARD_DRAIN_TIMEOUT_MS="1000")
    assert result.returncode == 2
    assert "abc" in _error_line(result)


def test_out_of_range_bootstrap_port_is_a_clear_error_not_a_traceback() -> None:
    result = _coordinator("--bootstrap-servers", "127.0.0.1:99999")
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "127.0.0.1:99999" in result.stderr, result.stderr[-2000:]


def _coordinator_flags() -> list[str]:
    """Every long flag of the `coordinator` subcommand, from the parser itself, so a flag
    added later without an env var in its help is caught."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    coord = sub.choices["coordinator"]
    return [
        flag
        for action in coord._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    ]


def _help_entries(help_text: str) -> dict[str, str]:
    """`--flag` -> its whole help entry (argparse may wrap it over several lines)."""
    entries: dict[str, str] = {}
    current: str | None = None
    for line in help_text.splitlines():
        match = re.match(r"^  (-\S+)", line)
        if match:
            current = match.group(1).rstrip(",")
            entries[current] = line.strip()
        elif current is not None and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def test_help_lists_every_flag_with_its_env_var() -> None:
    script = Path(sys.executable).with_name("keyshard")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "keyshard"]
    result = subprocess.run(
        [*command, "coordinator", "--help"],
        cwd=REPO_ROOT,
        env=_clean_env(COLUMNS="80"),  # narrow on purpose: wrapping must not lose anything
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result
    expected = {
        "--bootstrap-servers",
        "--listen",
        "--admin-listen",
        "--state-topic",
        "--auth-token",
        "--drain-timeout-ms",
        "--replica-timeout-ms",
        "--state-partitions",
        "--advertise",
        "--replica-id",
        "--lost-member-margin-ms",
    }
    flags = _coordinator_flags()
    assert expected <= set(flags), flags
    entries = _help_entries(result.stdout)
    for flag in flags:
        env = "KEYSHARD_" + flag.removeprefix("--").replace("-", "_").upper()
        assert flag in entries, f"{flag} has no help entry:\n{result.stdout}"
        assert f"[env {env}]" in entries[flag], f"{flag}: {entries[flag]!r}"


@pytest.mark.parametrize(
    ("args", "files", "complaint"),
    [
        (["--ssl-principal-mapping-rules", "RULE:^CN=(.*)$/$1"], {}, "a '/' is missing"),
        (["--auth-token-principal", "alice"], {}, "'alice' is not a principal"),
        (["--auth-tokens-file", "{tokens}"], {"tokens": "alice Zq9-secret\n"}, "line 1"),
        (["--auth-tokens-file", "{tokens}"], {"tokens": "Zq9-secret User:alice\n"},
         "line 1: its first field is not a principal"),
        (["--jwt-jwks-url", "jwks.json"], {}, "--jwt-jwks-url 'jwks.json'"),
        (["--jwt-jwks-url", "http://127.0.0.1:9/jwks.json"], {}, "no key set read from it"),
        (["--jwt-issuer", "https://issuer.example"], {}, "give --jwt-jwks-url too"),
        (["--auth-tokens-file", "{missing}"], {}, "--auth-tokens-file"),
        (["--auth-tokens-file", "{tokens}", "--auth-token-file", "{token}"],
         {"tokens": "User:a b\n", "token": "Zq9-x"}, "not both"),
        (["--authorizer", "acl-file"], {}, "--authorizer acl-file needs --acl-file"),
        (["--authorizer", "acl-file", "--acl-file", "{acls}"], {"acls": "User:a allow Read\n"},
         "--acl-file"),
        (["--acl-file", "{acls}"], {"acls": ""}, "--acl-file is read only with --authorizer"),
        (["--admin-roles-file", "{roles}"], {"roles": "User:a admin *\n"}, "'admin' is not a role"),
    ],
)  # fmt: skip
def test_bad_access_settings_exit_2_with_one_line_and_no_secret(
    args: list[str], files: dict[str, str], complaint: str, tmp_path: Path
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    paths = {name: str(tmp_path / name) for name in ("tokens", "token", "acls", "roles", "missing")}
    result = _coordinator(*(a.format(**paths) for a in args))
    assert result.returncode == 2, result
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("keyshard coordinator: ") and complaint in line, line
    assert "Zq9" not in result.stderr and "Traceback" not in result.stderr, result.stderr
