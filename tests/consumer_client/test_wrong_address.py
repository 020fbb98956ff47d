"""A consumer pointed at an HTTP server (keyshard's admin API) is told so at once, in one
sentence naming the consumer port, instead of retrying on a "frame of 1213486160 bytes"
(b"HTTP" read as a frame length). Real sockets: uvicorn serving a FastAPI app, as the
coordinator serves its admin API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable

import pytest
import uvicorn
from fastapi import FastAPI

from harness import wait_for
from keyshard.consumer_client import ConsumerError, Membership, PingReport, TopicsChange
from keyshard.core.model.positions import PositionUpdate
from keyshard.core.model.ranges import EMPTY, RangeSet
from keyshard.core.protocol.codec import ForeignProtocol, encode, foreign_protocol
from keyshard.core.protocol.messages import MetadataRequest
from keyshard.local.processes import free_port


class NoHooks:
    def ping_reply(self) -> PingReport:
        raise AssertionError("never registered")

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None:
        raise AssertionError("never registered")

    def topics_changed(self, change: TopicsChange) -> None:
        raise AssertionError("never registered")

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]:
        raise AssertionError("never registered")

    async def session_lost(self) -> None:
        raise AssertionError("never registered")

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        return EMPTY, {}


@contextlib.asynccontextmanager
async def http_server() -> AsyncIterator[int]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(FastAPI(), host="127.0.0.1", port=port, log_level="error")
    )
    serving = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, 10, "the HTTP server to listen")
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


def test_the_first_bytes_of_another_protocol_are_recognized() -> None:
    assert foreign_protocol(b"HTTP/1.1 400 Bad Request\r\n") is ForeignProtocol.HTTP_RESPONSE
    assert foreign_protocol(b"GET /v1/groups HTTP/1.1\r\n") is ForeignProtocol.HTTP_REQUEST
    assert foreign_protocol(b"\x16\x03\x01\x02\x00\x01") is ForeignProtocol.TLS
    assert foreign_protocol(encode(MetadataRequest(correlation_id=1, group="g"))) is None
    assert foreign_protocol(b"") is None


async def test_an_http_address_is_a_configuration_error_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="keyshard")
    async with http_server() as port:
        membership = Membership(
            group="g", topics=["t"], coordinators=[("127.0.0.1", port)], name="c",
            session_timeout_ms=10_000, capacity=1,
        )  # fmt: skip
        with pytest.raises(ConsumerError) as raised:
            await asyncio.wait_for(membership.run(NoHooks()), 30)
    assert str(raised.value) == (
        f"127.0.0.1:{port} answers in HTTP: it is keyshard's admin API (or another web "
        "server), not a coordinator's consumer port; consumers connect to the consumer "
        "port (7171 by default, the coordinator's --listen)"
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    tries = [r for r in caplog.records if "bad input" in r.getMessage()]
    assert len(tries) == 1  # refused at the first answer: no retry
    assert tries[0].getMessage().endswith("(an HTTP response: the peer is an HTTP server)")
