"""`keyshard worker` takes durations in milliseconds. `--connect-timeout-s`
(KEYSHARD_CONNECT_TIMEOUT_S), in seconds, still works for one release, with one line on
stderr naming its replacement; given together with its replacement it is a usage error
(exit 2)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyshard.cli.parser import build_parser
from keyshard.cli.worker import WorkerUsageError, build_consumer, take_renamed_flags
from keyshard.local.processes import free_port

REPO = Path(__file__).resolve().parents[2]
REQUIRED = ("m:f", "--group", "g", "--topics", "t", "--bootstrap-servers", "127.0.0.1:9092")
WARNING = (
    "--connect-timeout-s (KEYSHARD_CONNECT_TIMEOUT_S) is deprecated: use --connect-timeout-ms "
    "(KEYSHARD_CONNECT_TIMEOUT_MS), in milliseconds"
)


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["worker", *REQUIRED, *flags])


def test_the_millisecond_flag_warns_about_nothing(clean_env: pytest.MonkeyPatch) -> None:
    args = _args("--connect-timeout-ms", "1500")
    assert take_renamed_flags(args) == []
    assert build_consumer(args, {}).connect_timeout_ms == 1500


def test_the_millisecond_variable_is_read(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KEYSHARD_CONNECT_TIMEOUT_MS", "2500")
    args = _args()
    assert take_renamed_flags(args) == []
    assert build_consumer(args, {}).connect_timeout_ms == 2500


def test_no_timeout_by_default(clean_env: pytest.MonkeyPatch) -> None:
    args = _args()
    assert take_renamed_flags(args) == []
    assert build_consumer(args, {}).connect_timeout_ms is None


def test_the_seconds_flag_still_works_and_names_its_replacement(
    clean_env: pytest.MonkeyPatch,
) -> None:
    args = _args("--connect-timeout-s", "1.5")
    assert take_renamed_flags(args) == [WARNING]
    assert build_consumer(args, {}).connect_timeout_ms == 1500


def test_the_seconds_variable_still_works_and_names_its_replacement(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("KEYSHARD_CONNECT_TIMEOUT_S", "0.25")
    args = _args()
    assert take_renamed_flags(args) == [WARNING]
    assert build_consumer(args, {}).connect_timeout_ms == 250


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (["--connect-timeout-ms", "1500", "--connect-timeout-s", "2"], {}),
        (["--connect-timeout-ms", "1500"], {"KEYSHARD_CONNECT_TIMEOUT_S": "2"}),
        (["--connect-timeout-s", "2"], {"KEYSHARD_CONNECT_TIMEOUT_MS": "1500"}),
    ],
)
def test_both_names_are_a_usage_error(
    clean_env: pytest.MonkeyPatch, flags: list[str], env: dict[str, str]
) -> None:
    for key, value in env.items():
        clean_env.setenv(key, value)
    args = _args(*flags)
    with pytest.raises(WorkerUsageError, match=r"--connect-timeout-ms .* and its deprecated name"):
        take_renamed_flags(args)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_seconds_value_is_refused_by_the_parser(
    clean_env: pytest.MonkeyPatch, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _args("--connect-timeout-s", value)
    assert exited.value.code == 2
    assert f"--connect-timeout-s: {value!r}" in capsys.readouterr().err


def _worker(*flags: str) -> subprocess.CompletedProcess[str]:
    """A worker whose coordinator and Kafka are addresses nothing listens at."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KEYSHARD_")}
    return subprocess.run(
        [sys.executable, "-m", "keyshard", "worker", "json:dumps", "--group", "g",
         "--topics", "t", "--bootstrap-servers", f"127.0.0.1:{free_port()}",
         "--coordinator", f"127.0.0.1:{free_port()}", *flags],
        cwd=REPO, env=clean, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_worker_given_seconds_warns_in_one_line_then_times_out_in_them() -> None:
    done = _worker("--connect-timeout-s", "0.5")
    assert done.returncode == 1, done.stderr
    warning, fatal = done.stderr.strip().splitlines()
    assert warning == f"keyshard worker: warning: {WARNING}"
    assert "within the connect timeout (0.5 s)" in fatal


def test_a_worker_given_both_names_exits_2_in_one_line() -> None:
    done = _worker("--connect-timeout-s", "0.5", "--connect-timeout-ms", "500")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("keyshard worker: --connect-timeout-ms (KEYSHARD_CONNECT_TIMEOUT_MS)")
    assert "deprecated name --connect-timeout-s" in line


def test_a_topic_pattern_instead_of_topics(clean_env: pytest.MonkeyPatch) -> None:
    flags = ["worker", "m:f", "--group", "g", "--bootstrap-servers", "127.0.0.1:9092"]
    args = build_parser().parse_args([*flags, "--topic-pattern", "orders-.*"])
    consumer = build_consumer(args, {})
    assert (consumer.topics, consumer.topic_pattern) == ([], "orders-.*")
    clean_env.setenv("KEYSHARD_TOPIC_PATTERN", "a|b")
    assert build_consumer(build_parser().parse_args(flags), {}).topic_pattern == "a|b"


def test_topics_and_a_topic_pattern_are_a_usage_error(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(WorkerUsageError, match="give one"):
        build_consumer(_args("--topic-pattern", "t.*"), {})
    flags = ["worker", "m:f", "--group", "g", "--bootstrap-servers", "127.0.0.1:9092"]
    with pytest.raises(WorkerUsageError, match="--topic-pattern"):
        build_consumer(build_parser().parse_args(flags), {})


def test_a_topic_pattern_that_is_no_regular_expression_is_refused(
    clean_env: pytest.MonkeyPatch,
) -> None:
    flags = ["worker", "m:f", "--group", "g", "--bootstrap-servers", "127.0.0.1:9092"]
    with pytest.raises(ValueError, match="not a regular expression"):
        build_consumer(build_parser().parse_args([*flags, "--topic-pattern", "(oops"]), {})


def test_the_memory_budget_flag_and_its_variable(clean_env: pytest.MonkeyPatch) -> None:
    assert build_consumer(_args(), {}).max_buffer_bytes == 64 * 1024 * 1024
    assert build_consumer(_args("--max-buffer-bytes", "1048576"), {}).max_buffer_bytes == 1048576
    clean_env.setenv("KEYSHARD_MAX_BUFFER_BYTES", "2097152")
    assert build_consumer(_args(), {}).max_buffer_bytes == 2097152
