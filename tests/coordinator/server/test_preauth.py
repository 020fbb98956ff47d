"""Almost nothing before authentication: an unregistered connection gets a small frame
limit, its Register's token is compared before the rest is validated, it is not read
while it leaves its answers unread, and its bad frames are logged a line per peer.

An in-process coordinator behind its real listener, raw sockets and channels as clients.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from typing import Any

import pytest

from keyshard.coordinator.server.admission import ConnectionLimits
from keyshard.coordinator.server.listener import CoordinatorServer
from keyshard.core.protocol.channel import Channel, RemoteError
from keyshard.core.protocol.codec import PRE_AUTH_MAX_FRAME_BYTES, PROTOCOL_VERSION, encode
from keyshard.core.protocol.messages import (
    ErrorCode,
    LeaveRequest,
    LeaveResponse,
    MetadataRequest,
    PartitionPositions,
    PositionModel,
    RangePosition,
    RegisterRequest,
    RegisterResponse,
)
from tests.coordinator.server.inprocess import running_coordinator
from tests.coordinator.server.test_listener import TIMEOUT, error_of, exchange, until

TOKEN = "s3cret-token"


def _frame(document: dict[str, Any]) -> bytes:
    body = json.dumps(document).encode()
    return struct.pack(">I", 1 + len(body)) + bytes((PROTOCOL_VERSION,)) + body


def _register(**fields: Any) -> dict[str, Any]:
    return {
        "type": "register_request", "correlation_id": 7, "group": "g", "topics": ["t"],
        "consumer_name": "c", "session_timeout_ms": 5000, **fields,
    }  # fmt: skip


def _big_leave(member_id: str) -> LeaveRequest:
    """A Leave of about 100 KiB: positions with many offsets acked out of order."""
    acked = [(2 * i + 1, 2 * i + 2) for i in range(8000)]
    position = PositionModel(next_offset=0, acked=acked)
    ranges = [RangePosition(range=(0, 65535), position=position)]
    return LeaveRequest(
        correlation_id=0, member_id=member_id, member_epoch=1,
        positions=[PartitionPositions(topic="t", partition=0, ranges=ranges)],
    )  # fmt: skip


async def test_a_large_frame_is_refused_at_its_header_until_the_register_succeeds() -> None:
    async with running_coordinator() as server:
        announced = struct.pack(">I", 1 << 20)  # a 1 MiB frame, of which nothing follows
        error = error_of(await exchange(server.port, announced))
        assert error.code is ErrorCode.FRAME_TOO_LARGE
        assert f"maximum of {PRE_AUTH_MAX_FRAME_BYTES} bytes" in error.message
        # What a registered member may send is the normal limit again.
        channel = await Channel.connect("127.0.0.1", server.port)
        # The member's StartFetcher and Pings may come before the Leave is answered: left
        # unanswered (the Leave ends the membership), never refused.
        channel.set_request_handler(lambda _channel, _request: None)
        channel.start()
        try:
            leave = _big_leave("nobody")
            assert len(encode(leave)) > PRE_AUTH_MAX_FRAME_BYTES
            request = RegisterRequest(**_register(correlation_id=0))
            registered = await channel.request(request, timeout=TIMEOUT)
            assert isinstance(registered, RegisterResponse)
            leave = _big_leave(registered.member_id)
            assert isinstance(await channel.request(leave, timeout=TIMEOUT), LeaveResponse)
        finally:
            await channel.aclose()
        # Before it, the same Leave is refused unread.
        error = error_of(await exchange(server.port, encode(_big_leave("nobody"))))
        assert error.code is ErrorCode.FRAME_TOO_LARGE


async def test_the_token_is_compared_before_the_rest_of_the_register_is_validated() -> None:
    async with running_coordinator(auth_token=TOKEN) as server:
        invalid = {"session_timeout_ms": 5}  # a validation error, were it validated
        cases = [
            (_register(auth_token="wrong", **invalid), ErrorCode.AUTHENTICATION_FAILED),
            (_register(**invalid), ErrorCode.AUTHENTICATION_FAILED),  # no token at all
            (_register(auth_token=None, **invalid), ErrorCode.AUTHENTICATION_FAILED),
            (_register(auth_token=["a", TOKEN], **invalid), ErrorCode.AUTHENTICATION_FAILED),
            (_register(auth_token=TOKEN, **invalid), ErrorCode.INVALID_MESSAGE),
        ]
        for document, code in cases:
            error = error_of(await exchange(server.port, _frame(document)))
            assert (error.code, error.correlation_id) == (code, 7), (document, error)
        # A message only a member sends is refused without being validated either.
        ping_reply = {"type": "ping_response", "correlation_id": 3, "member_epoch": "x"}
        error = error_of(await exchange(server.port, _frame(ping_reply)))
        assert (error.code, error.correlation_id) == (ErrorCode.UNEXPECTED_MESSAGE, 3)
        assert "ping_response" in error.message
        # The right token registers.
        channel = await Channel.connect("127.0.0.1", server.port)
        channel.start()
        try:
            request = RegisterRequest(**_register(correlation_id=0, auth_token=TOKEN))
            assert isinstance(await channel.request(request, timeout=TIMEOUT), RegisterResponse)
        finally:
            await channel.aclose()


async def test_a_register_refused_by_the_screen_is_the_clients_fatal_refusal() -> None:
    """What the reference client sees of the screen: the code it gives up on."""
    async with running_coordinator(auth_token=TOKEN) as server:
        channel = await Channel.connect("127.0.0.1", server.port)
        channel.start()
        request = RegisterRequest(**_register(correlation_id=0, auth_token="wrong"))
        with pytest.raises(RemoteError) as refused:
            await channel.request(request, timeout=TIMEOUT)
        assert refused.value.code is ErrorCode.AUTHENTICATION_FAILED
        await channel.aclose()


_SOCKET_BUFFER = 1 << 16


def _the_connection(server: CoordinatorServer) -> Channel:
    (channel,) = server._channels
    return channel


async def test_an_unregistered_peer_that_does_not_read_is_not_read_either() -> None:
    """Metadata requests sent without ever reading the answers: the coordinator stops
    reading the connection instead of queueing answers without end, and answers all of
    them once the peer reads."""
    # What the test reads takes a while on a busy machine: not the registration
    # deadline's business here.
    async with running_coordinator(ConnectionLimits(register_timeout_ms=120_000)) as server:
        # Small socket buffers on both ends, fixed (no autotuning: Linux grows a
        # receive buffer up to tcp_rmem's maximum, 32 MB on some hosts, which would
        # take every answer and leave nothing for the coordinator to hold back).
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        await until(lambda: bool(server._channels), "the coordinator has the connection")
        served = _the_connection(server)._transport
        assert served is not None
        served.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER
        )
        request = encode(MetadataRequest(correlation_id=1))
        count = 20_000  # ~1.2 MB of answers, several times what the socket buffers hold
        writer.write(request * count)
        channel: Channel | None = None

        def paused() -> bool:
            nonlocal channel
            channel = _the_connection(server) if server._channels else None
            transport = None if channel is None else channel._transport
            return transport is not None and not transport.is_reading()

        await until(paused, "reading the peer paused")
        assert channel is not None and channel._transport is not None
        buffered = channel._transport.get_write_buffer_size()
        assert buffered < 1 << 20, f"{buffered} bytes of answers queued"
        answers = 0
        async with asyncio.timeout(TIMEOUT * 4):
            while answers < count:
                head = await reader.readexactly(4)
                await reader.readexactly(int.from_bytes(head, "big"))
                answers += 1
        writer.close()


async def test_bad_frames_are_logged_a_line_per_peer_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="keyshard.coordinator.server.listener")
    async with running_coordinator() as server:
        for _ in range(30):
            error = error_of(await exchange(server.port, b"\x00\x00\x00\x05\x01[1,2"))
            assert error.code is ErrorCode.MALFORMED_FRAME
        await until(lambda: server.counts.total == 0, "every connection closed")
    lines = [r.getMessage() for r in caplog.records if "bad" in r.getMessage()]
    assert len(lines) == 2, lines  # the first one, and the count (flushed at stop)
    assert lines[0].startswith("bad input from 127.0.0.1:")
    assert lines[1] == "... and 29 more bad frames from 1 address in the last 10 s"
