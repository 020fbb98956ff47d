"""Timer verdicts on a busy coordinator, over real loopback sockets.

A member's reply is written in time, then the event loop is blocked past the deadline
(as a coordinator busy with a recompute or thousands of replies is): when it runs again
the expired timer and the unread reply are due together. The member must not be judged
before its reply is read. The state log is in memory: durability is not under test here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from keyshard.coordinator.group.state import GroupConfig
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.server.listener import CoordinatorServer
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.messages import (
    Message,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from tests.coordinator.runtime.memory import serving_runtime

TIMEOUT = 10.0


class Member:
    """A protocol-level consumer; `stall_on(kind)` blocks the whole loop right after
    answering the first request of that kind (the reply is already in the socket)."""

    def __init__(self, name: str, session_timeout_ms: int = 10_000) -> None:
        self.name = name
        self.session_timeout_ms = session_timeout_ms
        self.channel: Channel | None = None
        self.member_id = ""
        self.received: list[str] = []
        self.stall: tuple[type[Message], float] | None = None

    def stall_on(self, kind: type[Message], seconds: float) -> None:
        self.stall = (kind, seconds)

    async def join(self, port: int) -> None:
        self.channel = await Channel.connect("127.0.0.1", port, name=self.name)
        self.channel.set_request_handler(self._on_request)
        self.channel.start()
        reply = await self.channel.request(
            RegisterRequest(
                correlation_id=0,
                group="g",
                topics=["t"],
                consumer_name=self.name,
                session_timeout_ms=self.session_timeout_ms,
            ),
            timeout=TIMEOUT,
        )
        assert isinstance(reply, RegisterResponse)
        self.member_id = reply.member_id

    def _on_request(self, channel: Channel, message: Message) -> None:
        self.received.append(message.type)
        match message:
            case PingRequest():
                reply: Message = PingResponse(correlation_id=0, member_epoch=message.member_epoch)
            case StartFetcherRequest():
                reply = StartFetcherResponse(correlation_id=0, member_epoch=message.member_epoch)
            case StopFetcherRequest():
                reply = StopFetcherResponse(
                    correlation_id=0, member_epoch=message.member_epoch, positions=[]
                )
            case _:
                raise AssertionError(f"unexpected {message.type}")
        channel.reply(message, reply)
        if self.stall is not None and isinstance(message, self.stall[0]):
            seconds, self.stall = self.stall[1], None
            time.sleep(seconds)  # the loop is blocked: a coordinator busy elsewhere

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.aclose()


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - waiting on the loop's own work
            await asyncio.sleep(0.01)


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[CoordinatorRuntime, int]]:
    config = RuntimeConfig(
        "unused:1",
        group_defaults=GroupConfig(drain_timeout_ms=300, ping_interval_ms=100),
    )
    runtime = serving_runtime(config)
    await runtime.start()
    server = CoordinatorServer(runtime, "127.0.0.1", 0)
    await server.start()
    try:
        yield runtime, server.port
    finally:
        await server.stop()
        await runtime.stop()


async def test_a_drain_answered_in_time_but_read_late_is_not_fenced(
    coordinator: tuple[CoordinatorRuntime, int],
) -> None:
    runtime, port = coordinator
    a, b = Member("a"), Member("b")
    try:
        await a.join(port)
        await eventually(lambda: "start_fetcher_request" in a.received, "a owns everything")
        a.stall_on(StopFetcherRequest, 0.6)  # twice the drain timeout
        await b.join(port)
        await eventually(lambda: "start_fetcher_request" in b.received, "b got a's slots")
        state = runtime.group_states()["g"]
        assert a.member_id in state.members, "a drained in time and was fenced"
        assert a.channel is not None and not a.channel.is_closed
        assert runtime.activity.totals["drain expired"] == 0
        assert runtime.activity.totals["verdict spared"] == 1
    finally:
        await a.close()
        await b.close()


async def test_a_ping_answered_in_time_but_read_late_does_not_expire_the_session(
    coordinator: tuple[CoordinatorRuntime, int],
) -> None:
    runtime, port = coordinator
    a = Member("a", session_timeout_ms=1000)
    try:
        await a.join(port)
        await eventually(lambda: "ping_request" in a.received, "a pinged")
        a.stall_on(PingRequest, 1.5)  # longer than the session timeout
        pings = a.received.count("ping_request")
        await eventually(lambda: a.received.count("ping_request") >= pings + 3, "pinged on")
        assert a.member_id in runtime.group_states()["g"].members, "a's session expired"
        assert runtime.activity.totals["session expired"] == 0
        assert runtime.activity.totals["verdict spared"] >= 1
    finally:
        await a.close()


async def test_a_member_that_does_not_drain_is_still_fenced(
    coordinator: tuple[CoordinatorRuntime, int],
) -> None:
    """The other side: a member that never answers its StopFetcher is fenced."""
    runtime, port = coordinator
    a, b = Member("a"), Member("b")
    try:
        await a.join(port)
        await eventually(lambda: "start_fetcher_request" in a.received, "a owns everything")
        assert a.channel is not None
        a.channel.set_request_handler(lambda channel, message: a.received.append(message.type))
        await b.join(port)
        await eventually(lambda: a.channel is not None and a.channel.is_closed, "a fenced")
        assert a.member_id not in runtime.group_states()["g"].members
        assert runtime.activity.totals["drain expired"] == 1
    finally:
        await a.close()
        await b.close()
