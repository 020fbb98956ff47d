"""`--help` says what a new user needs: every flag with help text and, where it has one,
its default; no internal command in the list. `--log-level` works after the subcommand
too, and the flags of where a new group starts parse as documented."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from keyshard.cli.parser import build_parser
from keyshard.coordinator.group.state import OffsetReset
from tests.cli.test_cli import REPO_ROOT, _clean_env, _coordinator, _error_line, _help_entries


def keyshard(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyshard", *args],
        cwd=REPO_ROOT, env=_clean_env(**env), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_command_list_has_no_internal_command() -> None:
    helped = keyshard("--help")
    assert helped.returncode == 0, helped.stderr
    assert "SUPPRESS" not in helped.stdout and "demo-worker" not in helped.stdout
    listed = {"broker", "coordinator", "groups", "status", "positions", "where", "rebalance"}
    listed |= {"fence", "reset-positions"}
    assert listed | {"worker", "demo"} == set(subcommands())


def test_the_demo_consumer_runs_as_a_module_of_its_own() -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "keyshard.local.demo_worker", "--help"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert helped.returncode == 0 and "--handler-ms" in helped.stdout, helped.stderr


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_flag_has_help_and_shows_its_default(command: str) -> None:
    helped = keyshard(command, "--help")
    assert helped.returncode == 0, helped.stderr
    entries = _help_entries(helped.stdout)
    assert "default: None" not in helped.stdout and "default: False" not in helped.stdout
    for action in subcommands()[command]._actions:
        flags = [f for f in action.option_strings if f.startswith("--")]
        if not flags or flags[0] == "--help":
            continue
        entry = entries.get(flags[0], "")
        assert entry.removeprefix(flags[0]).strip(), f"{command} {flags[0]} has no help"
        default = action.default
        shown = isinstance(default, (int, float, str)) and not isinstance(default, bool)
        if shown and default and default is not argparse.SUPPRESS:
            assert f"(default: {default})" in entry, f"{command} {flags[0]}: {entry!r}"


def test_a_host_port_default_is_shown_as_it_is_typed() -> None:
    entries = _help_entries(keyshard("coordinator", "--help").stdout)
    assert "(default: 127.0.0.1:7171)" in entries["--listen"]
    assert "(default: earliest)" in entries["--auto-offset-reset"]


def test_log_level_after_the_subcommand_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEYSHARD_LOG_LEVEL", raising=False)
    parse = build_parser().parse_args
    assert parse(["coordinator", "--log-level", "DEBUG"]).log_level == "DEBUG"
    assert parse(["--log-level", "debug", "coordinator"]).log_level == "DEBUG"
    assert parse(["coordinator"]).log_level == "INFO"
    assert parse(["groups", "--log-level", "WARNING"]).log_level == "WARNING"
    # The daemon takes it: asyncio's DEBUG line shows before Kafka is found missing.
    result = _coordinator("--log-level", "DEBUG")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "unrecognized arguments" not in result.stderr
    assert " DEBUG asyncio: Using selector" in result.stderr, result.stderr[-2000:]


def test_log_level_from_its_variable_and_a_bad_one_named() -> None:
    result = _coordinator(KEYSHARD_LOG_LEVEL="DEBUG")
    assert " DEBUG asyncio: Using selector" in result.stderr, result.stderr[-2000:]
    refused = _coordinator("--log-level", "LOUD")
    assert refused.returncode == 2
    assert "--log-level" in _error_line(refused) and "LOUD" in _error_line(refused)


def test_where_a_new_group_starts_parses_flag_per_group_and_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("KEYSHARD_AUTO_OFFSET_RESET", "KEYSHARD_GROUP_AUTO_OFFSET_RESET"):
        monkeypatch.delenv(name, raising=False)
    parse = build_parser().parse_args
    assert parse(["coordinator"]).auto_offset_reset is OffsetReset.EARLIEST
    args = parse(
        ["coordinator", "--auto-offset-reset", "latest",
         "--group-auto-offset-reset", "audit=earliest", "--group-auto-offset-reset", "x=latest"]
    )  # fmt: skip
    assert args.auto_offset_reset is OffsetReset.LATEST
    assert dict(args.group_auto_offset_reset) == {
        "audit": OffsetReset.EARLIEST, "x": OffsetReset.LATEST,
    }  # fmt: skip
    monkeypatch.setenv("KEYSHARD_AUTO_OFFSET_RESET", "latest")
    monkeypatch.setenv("KEYSHARD_GROUP_AUTO_OFFSET_RESET", "a=latest,b=earliest")
    args = build_parser().parse_args(["coordinator"])  # defaults read when it is built
    assert args.auto_offset_reset is OffsetReset.LATEST
    assert dict(args.group_auto_offset_reset) == {
        "a": OffsetReset.LATEST,
        "b": OffsetReset.EARLIEST,
    }
    for flag, value in (("--auto-offset-reset", "newest"), ("--group-auto-offset-reset", "g")):
        refused = _coordinator(flag, value)
        assert refused.returncode == 2
        assert flag in _error_line(refused) and value in _error_line(refused)


def test_the_embedded_broker_port_is_refused_beside_a_kafka() -> None:
    refused = _coordinator("--embedded-broker-listen", "127.0.0.1:19999")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert "--embedded-broker-listen" in line and "--bootstrap-servers" in line
    demo = keyshard(
        "demo", "--bootstrap-servers", "127.0.0.1:9", "--embedded-broker-listen", "127.0.0.1:9"
    )
    assert demo.returncode == 2 and "--embedded-broker-listen" in demo.stderr
