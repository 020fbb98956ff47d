"""A TCP proxy a test can cut: a route to Kafka that one consumer alone goes through.

`cut()` makes it behave like a firewall that starts dropping packets: nothing is forwarded
either way and nothing is closed, so both ends see a connection that simply goes silent
(their requests time out; no reset tells them). New connections are accepted and held,
not passed on. `heal()` lets everything flow again, bytes held at the cut included, as TCP
retransmissions would deliver them. It runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from keyshard.core.model.addresses import parse_host_port

_CHUNK = 65536


class CuttableProxy:
    """Listens on `host` (a free port) and forwards to `target` (settable after start:
    a broker advertising the proxy's address needs the port before it starts)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target: str | None = None
        self._server: asyncio.Server | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        assert self._server is not None, "start() first"
        port = self._server.sockets[0].getsockname()[1]
        return f"{self.host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, 0)

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._open.wait()  # a connection made while cut hangs, unanswered
            assert self.target is not None, "set the proxy's target first"
            host, port = parse_host_port(self.target)
            server_r, server_w = await asyncio.open_connection(host, port)
            self._writers.add(server_w)
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            client_w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await self._open.wait()  # read just as the cut came: held until healed
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(OSError):
                writer.close()
