"""One connection of the protocol, both ends: a thin asyncio adapter over the sans-IO codec.

Like aiokafka's `conn.py`: outgoing requests get a correlation id and a future; responses
resolve them; `close()` fails every pending future so no caller waits forever on a dead
peer. Incoming requests go to a synchronous callback in arrival order, which is what lets
a consumer apply StartFetcher/StopFetcher in exactly the order the coordinator sent them.

The channel is an `asyncio.Protocol` underneath, not a stream: bytes are decoded and
dispatched in the loop callback that receives them, so nothing sits in a user-space
buffer between the socket and the handlers. That is what makes "has the peer sent
anything we have not handled?" answerable from public APIs (`has_unread_input`), which
the coordinator asks before judging a member on its own clock.

Until the peer has authenticated (`before_authentication` ... `authenticated`) a channel
holds it to a smaller frame limit, screens each frame before validating it, and stops
reading while the peer does not read what it was sent: what an unauthenticated peer can
make this side buffer is one small frame each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import ssl as _ssl
import sys
import termios
from collections.abc import Callable
from typing import Any

from keyshard.core.protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    ForeignProtocol,
    FrameDecoder,
    ProtocolError,
    Screen,
    encode,
    foreign_protocol,
)
from keyshard.core.protocol.messages import ErrorCode, ErrorResponse, Message, is_response

log = logging.getLogger(__name__)

RequestHandler = Callable[["Channel", Message], None]
# Told of input that broke the protocol (the channel then fails): the error, and what
# the peer speaks instead when its first bytes say so.
BadInputReporter = Callable[["Channel", ProtocolError, ForeignProtocol | None], None]

# How long closing a TLS channel waits for the peer's close_notify before it drops the
# connection (asyncio's default is 30 s: a silent peer would hold the socket that long).
TLS_SHUTDOWN_TIMEOUT_S = 5.0


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
        *,
        on_request: RequestHandler | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        name: str = "channel",
        on_bad_input: BadInputReporter | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(max_frame_bytes)
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._on_request = on_request
        self._on_bad_input = on_bad_input or _log_bad_input
        self._reading = False  # `start` was called
        self._unauthenticated = False  # `before_authentication` until `authenticated`
        self._peer_not_reading = False  # our writes wait in the transport's buffer
        self._closed = loop.create_future()  # resolved with the reason by `close`
        self._lost = loop.create_future()  # resolved when the transport is gone
        self.name = name
        self.close_reason: str | None = None
        # What the peer said before it closed on us (an `error_response` tied to none of
        # our requests), and whether it said anything at all: a TLS peer that closes
        # right after the handshake without a byte is refusing us (`consumer_client`).
        self.peer_error: ErrorResponse | None = None
        self.heard_from_peer = False
        # Another protocol, told by the peer's first bytes (TLS, HTTP): what a bad address
        # or a TLS mismatch looks like from here.
        self.peer_protocol: ForeignProtocol | None = None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        name: str = "channel",
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> Channel:
        """A channel to `host:port`, over TLS with `ssl` (the certificate is checked
        against `server_hostname`, by default `host`); `timeout` covers the handshake.
        It dispatches nothing until `start()`."""
        channel = cls(max_frame_bytes=max_frame_bytes, name=name)
        loop = asyncio.get_running_loop()
        if ssl is None:
            connecting = loop.create_connection(channel.protocol, host, port)
        else:
            connecting = loop.create_connection(
                channel.protocol, host, port, ssl=ssl,
                server_hostname=server_hostname or host,
                ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT_S,
            )  # fmt: skip
        await asyncio.wait_for(connecting, timeout)
        return channel

    def protocol(self) -> asyncio.Protocol:
        """The asyncio protocol feeding this channel (a factory for create_connection)."""
        return _ChannelProtocol(self)

    @property
    def peer(self) -> str:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    @property
    def peer_host(self) -> str:
        """The peer's address without its port: one client over its reconnects."""
        peer = self._transport.get_extra_info("peername") if self._transport else None
        return str(peer[0]) if peer else "?"

    def peer_certificate(self) -> dict[str, Any] | None:
        """The certificate the peer presented and TLS verified (`getpeercert()`), or None:
        no TLS, or no certificate asked for."""
        ssl_object = self._transport.get_extra_info("ssl_object") if self._transport else None
        if ssl_object is None:
            return None
        certificate: dict[str, Any] | None = ssl_object.getpeercert()
        return certificate or None

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._on_request = handler

    def start(self) -> None:
        """Begin reading (now, or once connected): requests that arrived meanwhile waited
        in the socket, so none reaches a handler that was not set yet."""
        self._reading = True
        self._apply_reading()

    def before_authentication(self, max_frame_bytes: int, screen: Screen | None = None) -> None:
        """Until `authenticated`: take frames of at most `max_frame_bytes`, show each to
        `screen` before validating it, and read nothing while the peer leaves our
        answers unread (a client that sends requests without reading the answers would
        otherwise grow the transport's buffer without end)."""
        self._unauthenticated = True
        self._decoder.max_frame_bytes = max_frame_bytes
        self._decoder.screen = screen

    def authenticated(self) -> None:
        """The peer is who it should be: the normal frame limit, no screen, and reading
        whatever the peer does with our answers."""
        self._unauthenticated = False
        self._decoder.max_frame_bytes = self._max_frame_bytes
        self._decoder.screen = None
        self._apply_reading()

    def _apply_reading(self) -> None:
        transport = self._transport
        if transport is None or self.is_closed or transport.is_closing():
            return
        if self._reading and not (self._unauthenticated and self._peer_not_reading):
            transport.resume_reading()
        else:
            transport.pause_reading()

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

    def has_unread_input(self) -> bool:
        """Did the peer send bytes this side has not dispatched yet?

        Received bytes are decoded and dispatched in the callback that receives them, so
        only the kernel's receive buffer can hold unread ones (asked with FIONREAD), or
        it does while reading has not started. A partial frame already fed to the decoder
        does not count: the rest of it has not arrived. A closed channel, or a socket
        already closed under it, has nothing unread.
        """
        transport = self._transport
        if self.is_closed or transport is None or transport.is_closing():
            return False
        sock = transport.get_extra_info("socket")
        fd = -1 if sock is None else sock.fileno()
        if fd < 0:
            return False
        try:
            raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(raw, sys.byteorder, signed=True) > 0

    def close(self, reason: str = "closed locally") -> None:
        if self.is_closed:
            return
        self.close_reason = reason
        self._closed.set_result(reason)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelClosed(reason))
        self._pending.clear()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(Exception):
                if transport.can_write_eof():
                    transport.write_eof()
            transport.close()  # after what was written is flushed
        elif transport is None and not self._lost.done():
            self._lost.set_result(None)  # never connected: nothing to wait for

    async def aclose(self, reason: str = "closed locally") -> None:
        """Close, and wait until what was written is flushed and the socket is gone."""
        self.close(reason)
        await asyncio.shield(self._lost)

    def _write(self, message: Message) -> None:
        frame = encode(message, max_frame_bytes=self._max_frame_bytes)
        if self._transport is None:
            raise ChannelClosed("not connected")
        self._transport.write(frame)

    # ---- from the protocol ------------------------------------------------------------

    def _connected(self, transport: asyncio.Transport) -> None:
        if self.is_closed:  # closed while connecting (a TLS handshake, say): too late
            transport.abort()
            if not self._lost.done():
                self._lost.set_result(None)
            return
        self._transport = transport
        if not self._reading:
            transport.pause_reading()

    def _received(self, data: bytes) -> None:
        if self.is_closed:
            return
        if not self.heard_from_peer:
            self.heard_from_peer = True
            self.peer_protocol = foreign_protocol(data)
        try:
            messages = self._decoder.feed(data)
        except ProtocolError as err:
            self._on_bad_input(self, err, self.peer_protocol)
            self.fail(err.code, err.message, err.correlation_id)
            return
        for message in messages:
            if self.is_closed:
                return
            self._dispatch(message)

    def _writing_paused(self, paused: bool) -> None:
        self._peer_not_reading = paused
        if self._unauthenticated:
            self._apply_reading()

    def _lost_connection(self, reason: str) -> None:
        self.close(reason)
        if not self._lost.done():
            self._lost.set_result(None)

    def _dispatch(self, message: Message) -> None:
        if is_response(message):
            future = self._pending.get(message.correlation_id)
            if future is not None and not future.done():
                future.set_result(message)
            elif isinstance(message, ErrorResponse):
                # An error not tied to a request of ours: the peer is closing on us.
                self.peer_error = message
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
        except Exception as err:  # a handler bug must not go unanswered
            log.exception("%s: request handler failed", self.name)
            self.fail(ErrorCode.INTERNAL, f"internal error: {err}", message.correlation_id)


def _log_bad_input(channel: Channel, err: ProtocolError, foreign: ForeignProtocol | None) -> None:
    """One line per bad input. Another protocol is said as such rather than as "frame too
    large"; an HTTP response only comes to a client, whose owner says what the address
    is. (The coordinator counts and throttles these lines per peer instead.)"""
    hint = "" if foreign is None else f" ({foreign.value})"
    level = logging.DEBUG if foreign is ForeignProtocol.HTTP_RESPONSE else logging.WARNING
    log.log(level, "%s: bad input from %s: %s%s", channel.name, channel.peer, err.message, hint)


class _ChannelProtocol(asyncio.Protocol):
    """asyncio's side of a channel: hands the transport and every byte to it at once."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._channel._connected(transport)

    def data_received(self, data: bytes) -> None:
        self._channel._received(data)

    def pause_writing(self) -> None:
        self._channel._writing_paused(True)

    def resume_writing(self) -> None:
        self._channel._writing_paused(False)

    def eof_received(self) -> bool:
        self._channel.close("peer closed the connection")
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        reason = "peer closed the connection" if exc is None else f"connection error: {exc}"
        self._channel._lost_connection(reason)
