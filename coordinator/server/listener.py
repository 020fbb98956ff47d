"""The coordinator's listening socket: one `MemberSession` per consumer connection."""

from __future__ import annotations

import asyncio
from typing import Any

from coordinator.protocol.channel import Channel
from coordinator.protocol.codec import DEFAULT_MAX_FRAME_BYTES
from coordinator.runtime.runtime import CoordinatorRuntime
from coordinator.server.session import MemberSession

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
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept, self.host, self.port, backlog=LISTEN_BACKLOG
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels):
            channel.close("coordinator shutting down")
        await asyncio.gather(*self._connections, return_exceptions=True)

    def _accept(self) -> asyncio.Protocol:
        """A new connection: its channel and session, and a task that ends with it."""
        channel = Channel(max_frame_bytes=self.max_frame_bytes, name="member")
        session = MemberSession(self.runtime, channel)
        channel.set_request_handler(session.on_request)
        channel.start()
        self._channels.add(channel)
        task = asyncio.create_task(self._serve(channel, session), name="member-connection")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)
        return channel.protocol()

    async def _serve(self, channel: Channel, session: MemberSession) -> None:
        try:
            await channel.wait_closed()
        finally:
            session.closed()
            await channel.aclose()
            self._channels.discard(channel)
