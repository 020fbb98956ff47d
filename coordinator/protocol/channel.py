"""A thin asyncio adapter over the sans-IO codec, used by both ends of a channel.

Like aiokafka's `conn.py`: outgoing requests get a correlation id and a future; responses
resolve them; `close()` fails every pending future so no caller waits forever on a dead
peer. Incoming requests go to a synchronous callback in arrival order, which is what lets
a consumer apply StartFetcher/StopFetcher in exactly the order the coordinator sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import sys
import termios
from collections.abc import Callable

from coordinator.protocol.codec import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, ProtocolError, encode
from coordinator.protocol.messages import ErrorCode, ErrorResponse, Message, is_response

log = logging.getLogger(__name__)

RequestHandler = Callable[["Channel", Message], None]


class ChannelClosed(ConnectionError):
    """The channel is gone; `reason` says why (peer closed, protocol error, local close)."""


class RemoteError(Exception):
    """The peer answered a request with an ErrorResponse."""

    def __init__(self, response: ErrorResponse) -> None:
        super().__init__(f"{response.code}: {response.message}")
        self.code: ErrorCode = response.code
        self.message = response.message


class Channel:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_request: RequestHandler | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        name: str = "channel",
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(max_frame_bytes)
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._on_request = on_request
        self._closed = asyncio.get_running_loop().create_future()
        self._read_task: asyncio.Task[None] | None = None
        self.name = name
        self.close_reason: str | None = None

    @classmethod
    async def connect(
        cls, host: str, port: int, *, timeout: float = 5.0, **kwargs: object
    ) -> Channel:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return cls(reader, writer, **kwargs)  # type: ignore[arg-type]

    @property
    def peer(self) -> str:
        peer = self._writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._on_request = handler

    def start(self) -> None:
        if self._read_task is None:
            self._read_task = asyncio.create_task(self._read_loop(), name=f"{self.name}-read")

    @property
    def is_closed(self) -> bool:
        return self._closed.done()

    async def wait_closed(self) -> str:
        return await asyncio.shield(self._closed)

    async def request(self, message: Message, *, timeout: float | None = None) -> Message:
        """Send a request and wait for its response; ErrorResponse raises RemoteError."""
        return await self.response(self.submit(message), timeout=timeout)

    def submit(self, message: Message) -> asyncio.Future[Message]:
        """Write a request now and return the future of its response.

        Writing is synchronous, so callers that must keep several requests in order (the
        coordinator's StopFetcher/StartFetcher to one member) can write them in order and
        wait for the responses separately.
        """
        if self.is_closed:
            raise ChannelClosed(self.close_reason or "closed")
        cid = next(self._ids) % (2**31)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: self._pending.pop(cid, None))
        self._pending[cid] = future
        self._write(message.model_copy(update={"correlation_id": cid}))
        return future

    async def response(
        self, future: asyncio.Future[Message], *, timeout: float | None = None
    ) -> Message:
        try:
            response = await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            if not future.done():
                future.cancel()  # nobody waits for it any more
        if isinstance(response, ErrorResponse):
            raise RemoteError(response)
        return response

    def reply(self, request: Message, response: Message) -> None:
        if not self.is_closed:
            self._write(response.model_copy(update={"correlation_id": request.correlation_id}))

    def fail(self, code: ErrorCode, message: str, correlation_id: int = 0) -> None:
        """Tell the peer why, then close: the contract for every bad input."""
        if not self.is_closed:
            try:
                self._write(
                    ErrorResponse(correlation_id=correlation_id, code=code, message=message)
                )
            except (ProtocolError, OSError, RuntimeError) as err:
                log.warning("%s: could not send error to %s: %s", self.name, self.peer, err)
        self.close(f"{code}: {message}")

    def unread_bytes(self) -> int:
        """Bytes the peer sent that this side has not dispatched yet: in the kernel's
        receive buffer, or in the stream's buffer waiting for the read loop.

        The coordinator asks before fencing a member on its own clock (see
        coordinator/verdicts.py). A partial frame already fed to the decoder is not
        counted: the rest of it has not arrived.
        """
        buffered = len(getattr(self._reader, "_buffer", b""))  # StreamReader's, no public API
        sock = self._writer.get_extra_info("socket")
        if sock is None:
            return buffered
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return buffered
        return buffered + int.from_bytes(raw, sys.byteorder, signed=True)

    def _write(self, message: Message) -> None:
        self._writer.write(encode(message, max_frame_bytes=self._max_frame_bytes))

    async def drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    def close(self, reason: str = "closed locally") -> None:
        if self.is_closed:
            return
        self.close_reason = reason
        self._closed.set_result(reason)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelClosed(reason))
        self._pending.clear()
        with contextlib.suppress(Exception):
            if self._writer.can_write_eof():
                self._writer.write_eof()
        self._writer.close()
        if self._read_task is not None and self._read_task is not asyncio.current_task():
            self._read_task.cancel()

    async def aclose(self, reason: str = "closed locally") -> None:
        self.close(reason)
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    self.close("peer closed the connection")
                    return
                try:
                    messages = self._decoder.feed(data)
                except ProtocolError as err:
                    log.warning("%s: bad input from %s: %s", self.name, self.peer, err.message)
                    self.fail(err.code, err.message, getattr(err, "correlation_id", 0))
                    return
                for message in messages:
                    self._dispatch(message)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError) as err:
            self.close(f"connection error: {err}")

    def _dispatch(self, message: Message) -> None:
        if is_response(message):
            future = self._pending.get(message.correlation_id)
            if future is not None and not future.done():
                future.set_result(message)
            elif isinstance(message, ErrorResponse):
                # An error not tied to a request of ours: the peer is closing on us.
                self.close(f"peer error {message.code}: {message.message}")
            return
        if self._on_request is None:
            self.fail(
                ErrorCode.UNEXPECTED_MESSAGE,
                f"{message.type} is not expected here",
                message.correlation_id,
            )
            return
        try:
            self._on_request(self, message)
        except Exception as err:  # a handler bug must not kill the read loop silently
            log.exception("%s: request handler failed", self.name)
            self.fail(ErrorCode.INTERNAL, f"internal error: {err}", message.correlation_id)
