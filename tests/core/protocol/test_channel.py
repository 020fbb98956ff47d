"""The channel's one way to answer "did the peer send anything we have not handled?".

The coordinator asks before judging a member on its own clock (runtime/verdicts.py). It
must see bytes still in the socket, and it must answer for a channel whose socket is
already closed too (descriptor -1, which the kernel cannot be asked about: `ValueError`),
or the timer task judging a consumer whose network path was cut would fail.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keyshard.coordinator.runtime.verdicts import PendingReplies, settled
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.codec import encode
from keyshard.core.protocol.messages import Message, MetadataRequest

TIMEOUT = 5.0


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Channel, socket.socket]]:
    """A channel accepted by a listener, and the raw client socket talking to it."""
    accepted: asyncio.Queue[Channel] = asyncio.Queue()

    def accept() -> asyncio.Protocol:
        channel = Channel(name="test")
        accepted.put_nowait(channel)
        return channel.protocol()

    server = await asyncio.get_running_loop().create_server(accept, "127.0.0.1", 0)
    client = socket.create_connection(server.sockets[0].getsockname()[:2])
    channel = await asyncio.wait_for(accepted.get(), TIMEOUT)
    try:
        yield channel, client
    finally:
        client.close()
        await channel.aclose()
        server.close()


async def eventually(predicate: Any) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - the loop must run to dispatch
            await asyncio.sleep(0.001)


async def test_unread_input_is_seen_until_it_is_dispatched(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, client = pair
    seen: list[Message] = []
    channel.set_request_handler(lambda _, message: seen.append(message))
    assert not channel.has_unread_input()
    client.sendall(encode(MetadataRequest(correlation_id=7)))
    await eventually(channel.has_unread_input)  # in the socket: reading has not started
    assert not seen
    channel.start()
    await eventually(lambda: seen)
    assert not channel.has_unread_input()
    assert [m.correlation_id for m in seen] == [7]


async def test_a_channel_closed_by_its_peer_has_nothing_unread(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, client = pair
    channel.start()
    client.sendall(b"\x00\x00")  # half a frame header, then gone
    client.close()
    await asyncio.wait_for(channel.wait_closed(), TIMEOUT)
    assert channel.has_unread_input() is False
    await channel.aclose()
    assert channel.has_unread_input() is False


class _ClosedSocket:
    def fileno(self) -> int:
        return -1


class _TransportOverAClosedSocket(asyncio.Transport):
    """What a channel sees when its socket was closed before it heard about it."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return _ClosedSocket() if name == "socket" else default

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...


async def test_a_socket_closed_under_the_channel_has_nothing_unread() -> None:
    channel = Channel(name="test")
    channel.protocol().connection_made(_TransportOverAClosedSocket())
    assert not channel.is_closed
    assert channel.has_unread_input() is False  # no ValueError on fd -1
    # ...so the coordinator's verdict on this member goes ahead instead of crashing.
    assert await settled(channel, PendingReplies(), "g", "m1", limit_s=1.0) is True
