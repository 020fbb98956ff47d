"""Pure unit tests of the production pieces: warning about an unreachable peer, which
signals `run()` takes over, the metrics' handler wrapper and the readiness answer."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from keyshard.consumer_client._errors import ConsumerError
from keyshard.consumer_client._membership.unreachable import Unreachable
from keyshard.consumer_client._operations.endpoints import STALL_AFTER_S, ConsumerEndpoints
from keyshard.consumer_client._operations.metrics import ConsumerMetrics, ConsumerSnapshot
from keyshard.consumer_client._operations.signals import (
    GracefulSignals,
    ShutdownState,
    choose_signals,
    signals_to_handle,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_unreachable_warns_at_once_then_at_most_every_30_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    seen = Unreachable(logging.getLogger("t"), "the coordinator", clock=clock)
    with caplog.at_level(logging.WARNING, logger="t"):
        seen.failed("127.0.0.1:7999", "Connect call failed")
        for _ in range(20):
            clock.now += 1
            seen.failed("127.0.0.1:7999", "Connect call failed")
        clock.now += 10
        seen.failed("127.0.0.1:7999", "refused again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "cannot reach the coordinator at 127.0.0.1:7999: Connect call failed (retrying)",
        "still cannot reach the coordinator at 127.0.0.1:7999 after 30 s (22 attempts): "
        "refused again",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_unreachable_raises_past_connect_timeout_and_resets_on_success() -> None:
    clock = FakeClock()
    seen = Unreachable(logging.getLogger("t"), "Kafka", connect_timeout_ms=5000, clock=clock)
    seen.failed("k:9092", "refused")
    clock.now += 4
    seen.failed("k:9092", "refused")
    seen.succeeded()
    assert not seen.failing
    clock.now += 100
    seen.failed("k:9092", "refused")  # a new run of failures: its own 5 s
    clock.now += 5
    with pytest.raises(
        ConsumerError, match=r"Kafka at k:9092 within the connect timeout \(5 s\): refused"
    ):
        seen.failed("k:9092", "refused")


def test_connect_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="connect_timeout_ms"):
        Unreachable(logging.getLogger("t"), "Kafka", connect_timeout_ms=0)


def test_signals_are_taken_only_in_the_main_thread_and_only_when_default() -> None:
    """Each signal judged on its own: taken unless the app has a handler of its own for
    it (an ignored one is not); none outside the main thread."""
    assert signals_to_handle().take == [signal.SIGTERM, signal.SIGINT]
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(signals_to_handle().take))
    thread.start()
    thread.join()
    assert found == [[]]
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:  # the app handles SIGTERM itself: Ctrl-C still closes gracefully
        assert signals_to_handle().take == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGTERM, previous)
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:  # the app handles Ctrl-C itself: SIGTERM still closes gracefully
        assert signals_to_handle().take == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGINT, previous)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # a shell's background job: an ignored signal is no handler of the app's
        assert signals_to_handle().take == [signal.SIGTERM, signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def app_handler(signum: int, frame: object) -> None: ...


def test_a_signal_left_alone_is_said_in_one_line_naming_it_and_why() -> None:
    default = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    assert choose_signals(default, main_thread=True).explain() is None
    own_sigint = {**default, signal.SIGINT: app_handler}
    assert choose_signals(own_sigint, main_thread=True).explain() == (
        "not taking over SIGINT: the app handles it (app_handler) (SIGTERM closes gracefully)"
    )
    assert choose_signals(default, main_thread=False).explain() == (
        "not taking over SIGTERM and SIGINT: run() is not in the main thread (close() or "
        "request_stop() stop gracefully)"
    )
    assert choose_signals(default, main_thread=True, wanted=False).explain() == (
        "not taking over SIGTERM and SIGINT: handle_signals=False"
    )


async def test_an_ignored_signal_taken_over_is_ignored_again_afterwards() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        handlers = GracefulSignals(
            asyncio.get_running_loop(), "c", close=lambda: None, abort=lambda: None
        )
        handlers.install([signal.SIGINT])
        assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        handlers.remove()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


async def test_asyncio_runner_sigint_handler_counts_as_default() -> None:
    # pytest-asyncio runs this loop in the main thread without a Runner SIGINT handler;
    # a Runner's bound method is what asyncio.run() installs.
    runner = asyncio.Runner()
    on_sigint = functools.partial(runner._on_sigint, main_task=None)  # type: ignore[attr-defined]
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        assert signal.SIGINT in signals_to_handle().take
    finally:
        signal.signal(signal.SIGINT, previous)
        runner.close()


async def test_first_signal_closes_second_aborts() -> None:
    calls: list[str] = []
    handlers = GracefulSignals(
        asyncio.get_running_loop(), "c", close=lambda: calls.append("close"),
        abort=lambda: calls.append("abort"),
    )  # fmt: skip

    def state() -> ShutdownState:
        # Read afresh each time: a signal changes it between the asserts, and mypy would
        # otherwise keep the first assert's narrowing of `handlers.state`.
        return handlers.state

    handlers.install([signal.SIGTERM])
    try:
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)  # the loop's signal handler runs on its next iteration
        assert calls == ["close"] and state() is ShutdownState.CLOSING
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)
        assert calls == ["close", "abort"] and state() is ShutdownState.ABORTED
    finally:
        handlers.remove()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _record(offset: int, topic: str = "orders") -> Any:
    return SimpleNamespace(topic=topic, partition=0, offset=offset)


def _sample(metrics: ConsumerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_metrics_count_processed_failed_retried_and_dead_lettered() -> None:
    metrics = ConsumerMetrics()
    attempts: dict[int, int] = {}

    async def handler(record: Any) -> None:
        attempts[record.offset] = attempts.get(record.offset, 0) + 1
        if record.offset == 1 and attempts[1] < 3:
            raise RuntimeError("flaky")

    async def send(record: Any, error: BaseException) -> None:
        pass

    counted = metrics.wrap(handler)
    await counted(_record(0))
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await counted(_record(1))
    await counted(_record(1))
    await metrics.wrap_dead_letter(send)(_record(2), RuntimeError("x"))
    topic = {"topic": "orders"}
    assert _sample(metrics, "keyshard_consumer_records_processed_total", **topic) == 2
    assert _sample(metrics, "keyshard_consumer_records_failed_total", **topic) == 2
    assert _sample(metrics, "keyshard_consumer_records_retried_total", **topic) == 2
    assert _sample(metrics, "keyshard_consumer_records_dead_lettered_total", **topic) == 1
    assert _sample(metrics, "keyshard_consumer_handler_seconds_count", **topic) == 4


def _snapshot(**changes: Any) -> ConsumerSnapshot:
    fields: dict[str, Any] = dict(
        taken=time.monotonic(), registered=True, closing=False, heard_ago=0.5, in_flight=3,
        busy_lanes=4, owned_slots=100, lag={("orders", 0): 7}, reads={"fetched": 9},
    )  # fmt: skip
    fields.update(changes)
    return ConsumerSnapshot(**fields)


def test_readiness_follows_registration_contact_kafka_and_closing() -> None:
    metrics = ConsumerMetrics()
    endpoints = ConsumerEndpoints(metrics, _snapshot, 10_000, "127.0.0.1:9")
    assert endpoints.readiness() == (503, "not started")
    metrics.snapshot = _snapshot()
    assert endpoints.readiness() == (200, "ready") and endpoints.health() == (200, "ok")
    metrics.snapshot = _snapshot(heard_ago=12.0)
    assert endpoints.readiness()[1].startswith("no coordinator heard from for 12.")
    metrics.snapshot = _snapshot(registered=False)
    assert endpoints.readiness() == (503, "not registered with a coordinator")
    metrics.snapshot = _snapshot(closing=True)
    assert endpoints.readiness() == (503, "closing")
    metrics.snapshot = _snapshot(registered=False, unreadable_for=11.25)
    assert endpoints.readiness() == (503, "cannot read Kafka for 11.2 s")
    metrics.snapshot = _snapshot(taken=time.monotonic() - STALL_AFTER_S - 1)
    code, text = endpoints.health()
    assert code == 503 and text.startswith("event loop stalled for")
    assert endpoints.readiness()[0] == 503


def test_gauges_come_from_the_snapshot() -> None:
    metrics = ConsumerMetrics()
    metrics.snapshot = _snapshot()
    assert _sample(metrics, "keyshard_consumer_in_flight") == 3
    assert _sample(metrics, "keyshard_consumer_busy_lanes") == 4
    assert _sample(metrics, "keyshard_consumer_owned_slots") == 100
    assert _sample(metrics, "keyshard_consumer_fetch_lag", topic="orders", partition="0") == 7
    assert _sample(metrics, "keyshard_consumer_records_fetched_total") == 9
    assert _sample(metrics, "keyshard_consumer_coordinator_contact_age_seconds") >= 0.5


def test_the_memory_budget_gauges_by_kind_and_its_pauses() -> None:
    metrics = ConsumerMetrics()
    held = {"waiting": 10, "in_flight": 20, "replay_window": 30}
    metrics.snapshot = _snapshot(buffered=held, max_buffer_bytes=64, budget_pauses=2)
    for kind, value in held.items():
        assert _sample(metrics, "keyshard_consumer_buffered_bytes", kind=kind) == value
    assert _sample(metrics, "keyshard_consumer_max_buffer_bytes") == 64
    assert _sample(metrics, "keyshard_consumer_budget_pauses_total") == 2


def test_a_bad_metrics_address_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="metrics_listen"):
        ConsumerEndpoints(ConsumerMetrics(), _snapshot, 10_000, "nope")


async def test_an_unreachable_kafka_is_warned_about_then_connect_timeout_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real sockets, nothing listening: no mock needed to be refused."""
    from keyshard.consumer_client import ConsumerError as Error
    from keyshard.consumer_client import CoordinatedConsumer
    from keyshard.local.processes import free_port

    kafka = f"127.0.0.1:{free_port()}"
    consumer = CoordinatedConsumer(
        group="g", topics=["t"], coordinator=f"127.0.0.1:{free_port()}",
        bootstrap_servers=kafka, connect_timeout_ms=2500, handle_signals=False,
    )  # fmt: skip
    expected = rf"Kafka at {kafka} within the connect timeout \(2.5 s\)"
    with (
        caplog.at_level(logging.INFO, logger="keyshard.consumer_client._consumer"),
        pytest.raises(Error, match=expected),
    ):
        await asyncio.wait_for(consumer.run(lambda record: asyncio.sleep(0)), 60)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["consumer: not taking over SIGTERM and SIGINT: handle_signals=False"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and warnings[0].startswith(
        f"cannot reach Kafka at {kafka}: Connect call failed"
    ), warnings
