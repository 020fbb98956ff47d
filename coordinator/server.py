"""The coordinator's listening socket: one `MemberSession` per consumer connection.

A connection may ask Metadata any time, must Register before anything else, and ends
with a Leave or by closing. Every bad input is answered with an ErrorResponse naming the
problem, then the connection is closed; nothing else in the group is disturbed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from coordinator.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    ErrorCode,
    LeaveRequest,
    LeaveResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    RegisterRequest,
)
from coordinator.runtime import CoordinatorError, CoordinatorRuntime
from coordinator.transport import Channel

log = logging.getLogger(__name__)
LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn


class MemberSession:
    def __init__(self, runtime: CoordinatorRuntime, channel: Channel) -> None:
        self.runtime = runtime
        self.channel = channel
        self.group: str | None = None
        self.member_id: str | None = None
        self.registering = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def on_request(self, channel: Channel, message: Message) -> None:
        match message:
            case MetadataRequest():
                channel.reply(
                    message,
                    MetadataResponse(
                        correlation_id=0,
                        coordinator_id=self.runtime.settings.coordinator_id,
                        coordinator=self.runtime.settings.advertised_address,
                        active=self.runtime.ready,
                    ),
                )
            case RegisterRequest():
                if self.registering or self.member_id is not None:
                    channel.fail(
                        ErrorCode.UNEXPECTED_MESSAGE,
                        "this connection is already registered; open a new one to register again",
                        message.correlation_id,
                    )
                    return
                self.registering = True
                task = asyncio.create_task(self._register(message))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            case LeaveRequest():
                if (
                    self.member_id is None
                    or self.group is None
                    or message.member_id != self.member_id
                ):
                    channel.fail(
                        ErrorCode.UNKNOWN_MEMBER,
                        f"member {message.member_id!r} is not registered on this connection",
                        message.correlation_id,
                    )
                    return
                member_id, self.member_id = self.member_id, None
                error = self.runtime.leave(self.group, member_id, message.positions)
                if error is None:
                    channel.reply(message, LeaveResponse(correlation_id=0))
                else:
                    channel.fail(error, f"leave of {member_id!r} failed", message.correlation_id)
            case _:
                channel.fail(
                    ErrorCode.UNEXPECTED_MESSAGE,
                    f"a consumer may not send {message.type}",
                    message.correlation_id,
                )

    async def _register(self, request: RegisterRequest) -> None:
        try:
            response = await self.runtime.register(self.channel, request)
        except CoordinatorError as err:
            log.warning("register from %s refused: %s", self.channel.peer, err)
            self.channel.fail(err.code, err.message, request.correlation_id)
            return
        except Exception as err:
            log.exception("register from %s failed", self.channel.peer)
            self.channel.fail(ErrorCode.INTERNAL, f"register failed: {err}", request.correlation_id)
            return
        self.group, self.member_id = request.group, response.member_id
        if self.channel.is_closed:  # closed while we were validating
            self.runtime.channel_closed(self.group, self.member_id, "closed during register")
            return
        self.channel.reply(request, response)

    def closed(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.group is not None and self.member_id is not None:
            self.runtime.channel_closed(
                self.group, self.member_id, self.channel.close_reason or "closed"
            )


class CoordinatorServer:
    def __init__(
        self,
        runtime: CoordinatorRuntime,
        host: str,
        port: int,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.runtime = runtime
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._channels: set[Channel] = set()

    async def start(self) -> None:
        # A deep accept queue: after a coordinator restart every consumer reconnects at
        # once, and a full queue drops SYNs that clients retry only after 1, 3, 7 s.
        self._server = await asyncio.start_server(
            self._on_connection, self.host, self.port, backlog=LISTEN_BACKLOG
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        # Closing the channels ends their connection tasks; cancelling those tasks instead
        # makes Python 3.11's stream callback log a spurious CancelledError.
        for channel in list(self._channels):
            channel.close("coordinator shutting down")
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        channel = Channel(reader, writer, max_frame_bytes=self.max_frame_bytes, name="member")
        self._channels.add(channel)
        session = MemberSession(self.runtime, channel)
        channel.set_request_handler(session.on_request)
        channel.start()
        try:
            await channel.wait_closed()
            await channel.drain()
        finally:
            session.closed()
            await channel.aclose()
            self._channels.discard(channel)
            if task is not None:
                self._connections.discard(task)
