"""The coordinator's listening socket: one `MemberSession` per consumer connection."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from coordinator.protocol.channel import Channel
from coordinator.protocol.codec import DEFAULT_MAX_FRAME_BYTES
from coordinator.runtime.runtime import CoordinatorRuntime
from coordinator.server.session import MemberSession

log = logging.getLogger(__name__)
LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn


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
