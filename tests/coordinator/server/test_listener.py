"""The listener under abuse: connections that never register are closed at their deadline,
the caps refuse with the reason, and accept errors neither spin nor flood the log.

An in-process coordinator behind its real listener, raw sockets as clients.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

import pytest

from keyshard.consumer_client import Membership
from keyshard.coordinator.server import listener
from keyshard.coordinator.server.admission import ConnectionLimits
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.codec import FrameDecoder, encode
from keyshard.core.protocol.messages import (
    ErrorCode,
    ErrorResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
)
from keyshard.core.security.log_safety import ThrottledLog
from tests.consumer_client.test_coordinator_tls import Hooks
from tests.coordinator.server.inprocess import running_coordinator

TIMEOUT = 5.0


@dataclass
class Exchange:
    messages: list[Message]
    seconds: float


async def exchange(
    port: int, payload: bytes = b"", *, source: str | None = None, timeout: float = TIMEOUT
) -> Exchange:
    """Connect (from `source`, a loopback address), send `payload`, read until the
    coordinator closes the connection."""
    began = time.monotonic()
    local = (source, 0) if source else None
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
    writer.write(payload)
    data = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                data += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return Exchange(FrameDecoder().feed(data), time.monotonic() - began)


def error_of(result: Exchange) -> ErrorResponse:
    assert result.messages, "the coordinator closed without a word"
    last = result.messages[-1]
    assert isinstance(last, ErrorResponse), last
    return last


async def registered(port: int, name: str) -> Channel:
    """A protocol-level member that answers what the coordinator asks."""

    def answer(channel: Channel, message: Message) -> None:
        match message:
            case PingRequest():
                channel.reply(message, PingResponse(correlation_id=0, member_epoch=1))
            case StartFetcherRequest():
                reply = StartFetcherResponse(correlation_id=0, member_epoch=message.member_epoch)
                channel.reply(message, reply)

    channel = await Channel.connect("127.0.0.1", port, name=name)
    channel.set_request_handler(answer)
    channel.start()
    request = RegisterRequest(
        correlation_id=0, group="g", topics=["t"], consumer_name=name, session_timeout_ms=5000
    )
    assert isinstance(await channel.request(request, timeout=TIMEOUT), RegisterResponse)
    return channel


async def until(predicate: Any, what: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - the loop must run for it to change
            await asyncio.sleep(0.01)


# ---- the registration deadline --------------------------------------------------------


async def test_connections_that_do_not_register_are_closed_at_their_deadline() -> None:
    """Silent, half a length prefix, or a Metadata probe that then idles: all closed with
    REGISTER_TIMEOUT once the deadline passes; a member registered meanwhile stays."""
    async with running_coordinator(ConnectionLimits(register_timeout_ms=300)) as server:
        member = await registered(server.port, "stays")
        silent, half, probe = await asyncio.gather(
            exchange(server.port),
            exchange(server.port, b"\x00\x00"),
            exchange(server.port, encode(MetadataRequest(correlation_id=1))),
        )
        for result in (silent, half, probe):
            error = error_of(result)
            assert error.code is ErrorCode.REGISTER_TIMEOUT
            assert "no Register within 300 ms" in error.message
            assert 0.25 < result.seconds < 2.0
        assert isinstance(probe.messages[0], MetadataResponse)  # answered, not extended
        await asyncio.sleep(0.4)  # past the member's own deadline
        assert not member.is_closed
        await until(lambda: server.counts.total == 1, "only the member left")
        await member.aclose()
        await until(lambda: server.counts.total == 0, "every connection released")


# ---- the caps ---------------------------------------------------------------------------


async def test_a_connection_over_the_total_cap_is_refused_with_the_reason() -> None:
    limits = ConnectionLimits(register_timeout_ms=5000, max_connections=2)
    async with running_coordinator(limits) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        try:
            await until(lambda: server.counts.total == 2, "two connections counted")
            refused = await exchange(server.port, encode(MetadataRequest(correlation_id=1)))
            error = error_of(refused)
            assert error.code is ErrorCode.TOO_MANY_CONNECTIONS
            assert "2 connections open, its limit (--max-connections 2)" in error.message
        finally:
            held.pop().close()
        # One slot free again: the next connection is served.
        await until(lambda: server.counts.total == 1, "a slot freed")
        member = await registered(server.port, "fits")
        await member.aclose()
        for sock in held:
            sock.close()


async def test_the_per_peer_cap_counts_each_address_apart() -> None:
    """127.0.0.2 is another peer (all of 127/8 is loopback on Linux): the cap that stops
    127.0.0.1 does not stop it."""
    limits = ConnectionLimits(register_timeout_ms=1000, max_connections_per_peer=2)
    async with running_coordinator(limits) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        try:
            await until(lambda: server.counts.of("127.0.0.1") == 2, "two counted")
            error = error_of(await exchange(server.port))
            assert error.code is ErrorCode.TOO_MANY_CONNECTIONS
            assert "127.0.0.1 has 2 connections open" in error.message
            assert "--max-connections-per-peer 2" in error.message
            other = await exchange(
                server.port, encode(MetadataRequest(correlation_id=1)), source="127.0.0.2"
            )
            assert isinstance(other.messages[0], MetadataResponse)
        finally:
            for sock in held:
                sock.close()


async def test_a_register_over_the_pending_bound_is_told_to_come_back_not_queued() -> None:
    """With as many Registers in flight as the replica takes at once, one more is refused
    at once (TOO_MANY_CONNECTIONS, id 0: what every client retries); once one is answered,
    the next is served."""
    async with running_coordinator(ConnectionLimits(max_pending_registers=1)) as server:
        in_flight = server.registers.enter(time.monotonic())
        frame = encode(
            RegisterRequest(
                correlation_id=7, group="g", topics=["t"], consumer_name="late",
                session_timeout_ms=5000,
            )
        )  # fmt: skip
        refused = await exchange(server.port, frame)
        error = error_of(refused)
        assert (error.code, error.correlation_id) == (ErrorCode.TOO_MANY_CONNECTIONS, 0)
        assert "1 registrations in flight" in error.message
        assert refused.seconds < 1.0 and server.registers.pending == 1
        server.registers.leave(in_flight)
        member = await registered(server.port, "in-turn")
        assert server.registers.pending == 0
        await member.aclose()


async def test_the_reference_client_retries_a_busy_coordinator_until_it_registers() -> None:
    """The client side of the bound: refused while the coordinator is full, the reference
    client backs off and tries again (never gives up), and registers once there is room."""
    async with running_coordinator(ConnectionLimits(max_pending_registers=1)) as server:
        in_flight = server.registers.enter(time.monotonic())
        membership = Membership(
            group="g", topics=["t"], coordinators=[("127.0.0.1", server.port)], name="c",
            session_timeout_ms=5000, capacity=1,
        )  # fmt: skip
        running = asyncio.create_task(membership.run(Hooks()))
        try:
            await until(lambda: server.registers.refused >= 2, "two refusals")
            assert not running.done() and not membership.registered.is_set()
            server.registers.leave(in_flight)
            await asyncio.wait_for(membership.registered.wait(), TIMEOUT)
        finally:
            await membership.leave({})
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


# ---- accept errors --------------------------------------------------------------------


class _OutOfFiles:
    """A listening socket whose accept() fails with EMFILE `failures` times, as a process
    at its open-file limit sees it, then works."""

    def __init__(self, sock: socket.socket, failures: int) -> None:
        self.sock = sock
        self.failures = failures
        self.attempts = 0

    def accept(self) -> tuple[socket.socket, Any]:
        self.attempts += 1
        if self.failures > 0:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return self.sock.accept()

    def fileno(self) -> int:
        return self.sock.fileno()

    def getsockname(self) -> Any:
        return self.sock.getsockname()


async def test_accept_errors_pause_accepting_and_are_logged_once_per_interval(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(listener, "ACCEPT_PAUSE_S", 0.01)
    caplog.set_level(logging.WARNING, logger="keyshard.coordinator.server.listener")
    async with running_coordinator(ConnectionLimits(register_timeout_ms=5000)) as server:
        (real,) = server._sockets
        failing = _OutOfFiles(real, failures=30)
        loop = asyncio.get_running_loop()
        loop.remove_reader(real.fileno())
        # as start() would; `failing` stands in for the listening socket (only accept() is used)
        loop.add_reader(real.fileno(), server._accept, failing)  # type: ignore[arg-type]
        # A real client waits in the backlog meanwhile, and is served once accept works.
        member = await registered(server.port, "patient")
        # One failed accept per wake-up: paused, not spinning through the backlog.
        assert failing.attempts <= 30 + 2
        await member.aclose()
    lines = [r.getMessage() for r in caplog.records if "accept" in r.getMessage()]
    assert len(lines) == 2, lines  # the first, and the count when the interval ends
    assert "cannot accept connections on 127.0.0.1" in lines[0]
    assert "Too many open files" in lines[0]
    assert lines[1] == "... and 29 more accept errors in the last 10 s"
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


def test_throttled_log_logs_a_burst_then_counts(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    throttled = ThrottledLog(
        logging.getLogger("t"), "things", interval_s=10, burst=2, clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger="t"):
        for i in range(5):
            throttled("thing %d", i)
        now[0] = 11.0  # a new interval: the count of the last one first
        throttled("thing %d", 5)
        throttled.flush()  # nothing left to count
    assert [r.getMessage() for r in caplog.records] == [
        "thing 0",
        "thing 1",
        "... and 3 more things in the last 10 s",
        "thing 5",
    ]
