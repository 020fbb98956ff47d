"""The pure parts of the executor-consumer job and its bad-input errors (no broker)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from keyshard.consumer_client import ConsumerError
from keyshard.local.processes import free_port
from keyshard.spark_jobs.executors import (
    ConsumerSettings,
    StopWhen,
    _Counter,
    as_async,
    consume_until,
    load_handler,
    run_executor_consumers,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]


def test_no_condition_never_stops() -> None:
    assert StopWhen().reason(running_for=1e9, idle_for=1e9, file_exists=False) is None


@pytest.mark.parametrize(
    ("until", "facts", "expected"),
    [
        (StopWhen(max_ms=10_000), (9.9, 0.0, False), None),
        (StopWhen(max_ms=10_000), (10.0, 0.0, False), "max-seconds"),
        (StopWhen(idle_ms=5000), (100.0, 4.9, False), None),
        (StopWhen(idle_ms=5000), (100.0, 5.0, False), "idle"),
        (StopWhen(stop_file="/x"), (100.0, 100.0, False), None),
        (StopWhen(stop_file="/x", max_ms=1000), (2.0, 0.0, True), "stop-file"),
    ],
)
def test_stop_reasons(until: StopWhen, facts: tuple[float, float, bool], expected: str) -> None:
    running_for, idle_for, exists = facts
    assert until.reason(running_for=running_for, idle_for=idle_for, file_exists=exists) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_ms": 0}, "max_ms must be > 0"),
        ({"idle_ms": -1}, "idle_ms must be > 0"),
        ({"stop_file": ""}, "stop_file must be a path"),
    ],
)
def test_bad_stop_conditions_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StopWhen(**kwargs)


def test_stop_conditions_in_seconds_still_work_and_name_their_replacement() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        old = StopWhen(max_seconds=90, idle_seconds=0.5)  # type: ignore[call-arg]
    assert sorted(str(w.message) for w in caught) == [
        "StopWhen(idle_seconds=...) is deprecated: pass idle_ms (milliseconds)",
        "StopWhen(max_seconds=...) is deprecated: pass max_ms (milliseconds)",
    ]
    assert old == StopWhen(max_ms=90_000, idle_ms=500)


def test_a_stop_condition_under_both_names_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="both idle_ms and its old name idle_seconds"):
        StopWhen(idle_ms=500, idle_seconds=1)  # type: ignore[call-arg]


def test_stop_conditions_take_no_positional_seconds() -> None:
    """Positional arguments were seconds: refused, rather than read as milliseconds."""
    with pytest.raises(TypeError):
        cast(Any, StopWhen)(10, 5)


def test_run_executor_consumers_takes_the_connect_timeout_in_seconds_for_one_release() -> None:
    """Warned about, and past the renaming: the coordinator probe is the next to refuse."""
    nobody = f"127.0.0.1:{free_port()}"
    with (
        pytest.warns(DeprecationWarning, match=r"connect_timeout_s=\.\.\.\) is deprecated"),
        pytest.raises(ValueError, match="connect_timeout_ms must be > 0, got -1000"),
    ):
        run_executor_consumers(
            cast(Any, None), group="g", topics=["t"], coordinator=nobody,
            bootstrap_servers=nobody, handler=print, connect_timeout_s=-1,  # type: ignore[call-arg]
        )  # fmt: skip
    with pytest.raises(TypeError, match="both connect_timeout_ms and its old name"):
        run_executor_consumers(
            cast(Any, None), group="g", topics=["t"], coordinator=nobody,
            bootstrap_servers=nobody, handler=print, connect_timeout_ms=1000,
            connect_timeout_s=1,  # type: ignore[call-arg]
        )  # fmt: skip


async def test_sync_handlers_run_in_the_pool_and_async_ones_in_the_loop() -> None:
    seen: list[tuple[str, Any]] = []
    loop_thread = threading.current_thread()

    def plain(record: Any) -> None:
        seen.append(("sync", threading.current_thread() is loop_thread))

    async def coro(record: Any) -> None:
        seen.append(("async", threading.current_thread() is loop_thread))

    counter = _Counter()
    with ThreadPoolExecutor(2) as pool:
        await as_async(plain, counter, pool)("r1")
        await as_async(coro, counter, pool)("r2")
    assert seen == [("sync", False), ("async", True)]
    assert counter.records == 2


async def test_a_failing_handler_is_not_counted() -> None:
    def broken(record: Any) -> None:
        raise RuntimeError("nope")

    counter = _Counter()
    with ThreadPoolExecutor(1) as pool, pytest.raises(RuntimeError, match="nope"):
        await as_async(broken, counter, pool)("r")
    assert counter.records == 0
    await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "is not module:function"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("json:no_such_function", "json has no function no_such_function"),
    ],
)
def test_bad_handler_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_handler(spec)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyshard.spark_jobs.executors", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_a_task_whose_kafka_stays_unreachable_fails_at_connect_timeout() -> None:
    """Nothing listens at either address: the task warns, retries, then fails with the
    addresses and the timeout (in Spark: the task's error) instead of hanging."""
    kafka = f"127.0.0.1:{free_port()}"
    settings = ConsumerSettings(
        group="g", topics=["t"], coordinator=f"127.0.0.1:{free_port()}",
        bootstrap_servers=kafka, until=StopWhen(), connect_timeout_ms=1500,
    )  # fmt: skip
    expected = rf"Kafka at {kafka} within the connect timeout \(1.5 s\)"
    with pytest.raises(ConsumerError, match=expected):
        await asyncio.wait_for(consume_until(settings, lambda record: None, task=0), 60)


def test_cli_missing_arguments_are_named() -> None:
    result = _cli("--group", "g")
    assert result.returncode == 2
    assert "--topics" in result.stderr and "--handler" in result.stderr


def test_cli_unreachable_coordinator_is_a_clear_error_before_spark_starts() -> None:
    port = free_port()
    result = _cli(
        "--group", "g", "--topics", "t", "--coordinator", f"127.0.0.1:{port}",
        "--bootstrap-servers", "127.0.0.1:9", "--handler", "json:dumps", "--max-ms", "1000",
    )  # fmt: skip
    assert result.returncode == 2
    assert f"coordinator at 127.0.0.1:{port} is unreachable" in result.stderr


@pytest.mark.parametrize(
    ("old", "new", "seconds"),
    [("--max-seconds", "--max-ms", "1"), ("--idle-seconds", "--idle-ms", "1"),
     ("--connect-timeout-s", "--connect-timeout-ms", "0.5")],
)  # fmt: skip
def test_cli_flags_in_seconds_still_work_with_one_warning_line(
    old: str, new: str, seconds: str
) -> None:
    """Taken (the run goes on to the coordinator probe), with one line naming the new flag."""
    port = free_port()
    result = _cli(
        "--group", "g", "--topics", "t", "--coordinator", f"127.0.0.1:{port}",
        "--bootstrap-servers", "127.0.0.1:9", "--handler", "json:dumps", old, seconds,
    )  # fmt: skip
    assert result.returncode == 2
    warning, error = result.stderr.strip().splitlines()
    prog = "keyshard.spark_jobs.executors"
    assert warning == f"{prog}: warning: {old} is deprecated: use {new}, in milliseconds"
    assert f"coordinator at 127.0.0.1:{port} is unreachable" in error


def test_cli_a_flag_under_both_names_is_a_usage_error() -> None:
    result = _cli(
        "--group", "g", "--topics", "t", "--coordinator", "127.0.0.1:1",
        "--bootstrap-servers", "127.0.0.1:9", "--handler", "json:dumps",
        "--idle-seconds", "1", "--idle-ms", "1000",
    )  # fmt: skip
    assert result.returncode == 2
    assert "--idle-ms and its deprecated name --idle-seconds are both given" in result.stderr


def test_cli_a_bad_coordinator_tls_file_is_named_before_spark_starts() -> None:
    result = _cli(
        "--group", "g", "--topics", "t", "--coordinator", "127.0.0.1:1",
        "--bootstrap-servers", "127.0.0.1:9", "--handler", "json:dumps",
        "--coordinator-tls-ca-file", "/nope.pem",
    )  # fmt: skip
    assert result.returncode == 2
    assert "--coordinator-tls-ca-file: /nope.pem does not exist" in result.stderr


def test_more_consumers_than_task_slots_is_refused(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="3 consumers need 3 concurrent task slots"):
        run_executor_consumers(
            spark,
            group="g",
            topics=["t"],
            coordinator="127.0.0.1:1",
            bootstrap_servers="127.0.0.1:1",
            handler=print,
            consumers=3,
        )


def test_empty_topics_are_refused(spark: SparkSession) -> None:
    with pytest.raises(ValueError, match="topics must name at least one topic"):
        run_executor_consumers(
            spark, group="g", topics=[], coordinator="c:1", bootstrap_servers="b:1", handler=print
        )
