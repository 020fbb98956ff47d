"""The pure parts of the executor-consumer job and its bad-input errors (no broker)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        (StopWhen(max_seconds=10), (9.9, 0.0, False), None),
        (StopWhen(max_seconds=10), (10.0, 0.0, False), "max-seconds"),
        (StopWhen(idle_seconds=5), (100.0, 4.9, False), None),
        (StopWhen(idle_seconds=5), (100.0, 5.0, False), "idle"),
        (StopWhen(stop_file="/x"), (100.0, 100.0, False), None),
        (StopWhen(stop_file="/x", max_seconds=1), (2.0, 0.0, True), "stop-file"),
    ],
)
def test_stop_reasons(until: StopWhen, facts: tuple[float, float, bool], expected: str) -> None:
    running_for, idle_for, exists = facts
    assert until.reason(running_for=running_for, idle_for=idle_for, file_exists=exists) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_seconds": 0}, "max_seconds must be > 0"),
        ({"idle_seconds": -1}, "idle_seconds must be > 0"),
        ({"stop_file": ""}, "stop_file must be a path"),
    ],
)
def test_bad_stop_conditions_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StopWhen(**kwargs)


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
        bootstrap_servers=kafka, until=StopWhen(), connect_timeout_s=1.5,
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
        "--bootstrap-servers", "127.0.0.1:9", "--handler", "json:dumps", "--max-seconds", "1",
    )  # fmt: skip
    assert result.returncode == 2
    assert f"coordinator at 127.0.0.1:{port} is unreachable" in result.stderr


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
