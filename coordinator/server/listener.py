"""The coordinator's listening sockets: one `MemberSession` per consumer connection.

The accept loop is ours rather than asyncio's `create_server`, for what happens under a
connection flood (`coordinator.server.admission`):

* Out of descriptors, asyncio's accept loop logs `socket.accept() out of system resource`
  with a traceback on every attempt, up to `backlog` times per wake-up (CPython 3.11
  `selector_events._accept_connection` keeps looping after it paused the socket): 60 MB
  of log in 6 s. Here an accept error pauses accepting for `ACCEPT_PAUSE_S` and is
  counted; one line per interval says how many.
* The caps are checked on the accepted socket before any transport, handshake or
  session exists; a refused connection is told why (`TOO_MANY_CONNECTIONS`) and closed.
* Every connection gets a deadline to register, TLS handshake included, and until it
  has registered, a small frame limit and a screen (`coordinator.server.preauth`).
* Bad input is logged a line per peer per interval, then counted.

With TLS, the first byte a client sends is looked at before the handshake, by the
codec's `foreign_protocol` (a TLS connection starts with a handshake record, 0x16; a frame
of this protocol with a length byte, 0x00): a consumer without TLS is answered in plain
text (`TLS_REQUIRED`) instead of with a TLS alert it cannot read.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Coroutine
from typing import Any

from keyshard.coordinator.runtime.location import Replicas, Standalone
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.server.admission import (
    ConnectionCounts,
    ConnectionLimits,
    PendingRegisters,
)
from keyshard.coordinator.server.authentication import Authentication
from keyshard.coordinator.server.preauth import bad_input_reporter, register_screen
from keyshard.coordinator.server.session import ConnectionState, MemberSession
from keyshard.core.protocol.channel import TLS_SHUTDOWN_TIMEOUT_S, Channel
from keyshard.core.protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    ForeignProtocol,
    encode,
    foreign_protocol,
)
from keyshard.core.protocol.messages import ErrorCode, ErrorResponse
from keyshard.core.security.log_safety import ThrottledLog

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
ACCEPT_BATCH = 256  # connections accepted per wake-up, so established ones are served too
ACCEPT_PAUSE_S = 0.1  # after an accept error: descriptors free up as deadlines close idlers
MAX_REFUSING = 64  # TLS refusals in their handshake at once; past that a socket just closes
REFUSAL_TIMEOUT_S = 5.0  # a refused TLS client gets this long to finish its handshake
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class _NotTls(Exception):
    """The client sent something else than a TLS handshake, or nothing (already told)."""


class CoordinatorServer:
    def __init__(
        self,
        runtime: CoordinatorRuntime,
        host: str,
        port: int,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        tls: ssl.SSLContext | None = None,
        limits: ConnectionLimits | None = None,
        replicas: Replicas | None = None,
        authentication: Authentication | None = None,
    ) -> None:
        self.runtime = runtime
        self.replicas = replicas or Standalone(runtime)
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self.tls = tls
        self.limits = limits = limits or ConnectionLimits()
        if limits.pre_auth_max_frame_bytes > max_frame_bytes:
            raise ValueError(
                f"the frame limit before Register ({limits.pre_auth_max_frame_bytes} bytes) "
                f"is above the frame limit ({max_frame_bytes} bytes)"
            )
        self.counts = ConnectionCounts(limits)
        self.registers = PendingRegisters(limits.max_pending_registers)
        runtime.registers_in_flight = lambda: self.registers.pending
        self._sockets: list[socket.socket] = []
        self._paused: set[socket.socket] = set()
        self._stopping = False
        self._connections: set[asyncio.Task[Any]] = set()
        self._channels: set[Channel] = set()
        self._refusing = 0
        self._accept_errors = ThrottledLog(log, "accept errors", burst=1)
        self._refused = ThrottledLog(log, "connections refused")
        self._idle = ThrottledLog(log, "connections closed for not registering")
        self._handshakes = ThrottledLog(log, "TLS handshakes refused")
        self._refusals = ThrottledLog(log, "Register refusals", burst=5, per_peer=1)
        self._bad_input, self._bad_frames = bad_input_reporter(log)
        self.authentication = authentication or Authentication()

    async def start(self) -> None:
        self._sockets = await _bind(self.host, self.port)
        self.port = self._sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    async def stop(self) -> None:
        self._stopping = True
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            if sock not in self._paused:
                loop.remove_reader(sock.fileno())
            sock.close()
        for channel in list(self._channels):
            channel.close("coordinator shutting down")
        for task in list(self._connections):
            task.cancel()  # those still before their channel: handshake, first byte
        await asyncio.gather(*self._connections, return_exceptions=True)
        for throttled in (
            self._accept_errors, self._refused, self._idle, self._handshakes, self._refusals,
            self._bad_frames,
        ):  # fmt: skip
            throttled.flush()

    # ---- accepting ------------------------------------------------------------------

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as err:
                self._accept_failed(sock, err)
                return
            self._admit(conn, address)

    def _accept_failed(self, sock: socket.socket, err: OSError) -> None:
        """Out of descriptors (or buffers): stop trying for a moment instead of spinning
        on a socket that stays readable, and say so once per interval."""
        host, port = sock.getsockname()[:2]
        address = f"{host}:{port}"
        if err.errno not in _RESOURCE_ERRNOS:
            self._accept_errors("cannot accept a connection on %s: %s", address, err)
            return
        self._accept_errors(
            "cannot accept connections on %s: %s (%d consumer connections open); "
            "retrying every %g s",
            address, err.strerror, self.counts.total, ACCEPT_PAUSE_S,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())
        self._paused.add(sock)
        loop.call_later(ACCEPT_PAUSE_S, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        self._paused.discard(sock)
        if not self._stopping:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock)

    def _admit(self, conn: socket.socket, address: Any) -> None:
        conn.setblocking(False)
        peer, where = str(address[0]), f"{address[0]}:{address[1]}"  # counted, logged
        refusal = self.counts.refusal(peer)
        if refusal is not None:
            self._refused("refused a connection from %s: %s", where, refusal)
            if self.tls is None:  # said at once, no transport: a burst costs nothing
                _tell_plain(conn, ErrorCode.TOO_MANY_CONNECTIONS, refusal)
                conn.close()
            elif self._refusing >= MAX_REFUSING:
                conn.close()
            else:
                self._refusing += 1
                self._spawn(self._refuse(conn, refusal))
            return
        self.counts.add(peer)
        self._spawn(self._serve(conn, peer, where))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name="member-connection")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    # ---- one connection -------------------------------------------------------------

    async def _serve(self, conn: socket.socket, peer: str, where: str) -> None:
        """Open the channel (TLS handshake included) and run its session until it closes;
        a connection that has not sent Register by its deadline is closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.register_timeout_ms / 1000
        try:
            channel = await self._open(conn, where, deadline)
            if channel is None:
                return
            session = MemberSession(
                self.runtime,
                channel,
                self.replicas,
                self._refusals,
                self.authentication,
                self.registers,
            )
            channel.set_request_handler(session.on_request)
            certificate = channel.peer_certificate()
            screen = register_screen(lambda token: self.authentication.screen(token, certificate))
            channel.before_authentication(self.limits.pre_auth_max_frame_bytes, screen)
            channel.start()
            timer = loop.call_at(deadline, self._deadline_passed, channel, session)
            try:
                await channel.wait_closed()
            finally:
                timer.cancel()
                session.closed()
                await channel.aclose()
                self._channels.discard(channel)
        finally:
            self.counts.remove(peer)

    async def _refuse(self, conn: socket.socket, reason: str) -> None:
        """Tell a TLS connection over a cap why, after the handshake (the only way its
        client can read it), then close it."""
        loop = asyncio.get_running_loop()
        try:
            channel = await self._open(conn, None, loop.time() + REFUSAL_TIMEOUT_S)
            if channel is not None:
                channel.fail(ErrorCode.TOO_MANY_CONNECTIONS, reason)
                await channel.aclose()
                self._channels.discard(channel)
        finally:
            self._refusing -= 1

    async def _open(
        self, conn: socket.socket, where: str | None, deadline: float
    ) -> Channel | None:
        """The connection's channel, or None when it did not get that far (the reason is
        logged, throttled, when `where` is given; refusals were logged already)."""
        loop = asyncio.get_running_loop()
        channel = Channel(
            max_frame_bytes=self.max_frame_bytes, name="member", on_bad_input=self._bad_input
        )
        self._channels.add(channel)
        try:
            if self.tls is None:
                await loop.connect_accepted_socket(channel.protocol, conn)
            elif await self._speaks_tls(conn, where, deadline):
                await loop.connect_accepted_socket(
                    channel.protocol, conn, ssl=self.tls,
                    ssl_handshake_timeout=max(0.001, deadline - loop.time()),
                    ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT_S,
                )  # fmt: skip
            else:
                raise _NotTls
            return channel
        except BaseException as err:
            conn.close()  # a no-op if its transport closed it already
            channel.close("not opened")
            self._channels.discard(channel)
            if isinstance(err, OSError | TimeoutError) and self.tls is not None:
                if where is not None:  # ssl.SSLError is an OSError
                    self._handshakes("TLS handshake from %s refused: %s", where, _why(err))
                return None
            if isinstance(err, _NotTls | OSError | TimeoutError):
                return None
            raise

    async def _speaks_tls(self, conn: socket.socket, where: str | None, deadline: float) -> bool:
        """Wait for the client's first byte (until the deadline) and look at it."""
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        try:
            await asyncio.wait_for(readable, max(0.0, deadline - loop.time()))
        except TimeoutError:
            if where is not None:
                self._idle(
                    "closed a connection from %s: nothing received within %d ms "
                    "(--register-timeout-ms)", where, self.limits.register_timeout_ms,
                )  # fmt: skip
            return False
        finally:
            loop.remove_reader(fd)
        try:
            first = conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError, ConnectionError):
            return False
        if not first:
            return False  # the client went away
        if foreign_protocol(first) is ForeignProtocol.TLS:
            return True
        if where is not None:
            self._handshakes(
                "refused a plain-text connection from %s: this listener requires TLS", where
            )
        _tell_plain(
            conn,
            ErrorCode.TLS_REQUIRED,
            "this coordinator's consumer channel requires TLS: connect with "
            "coordinator_tls (the CA file that signed its certificate)",
        )
        return False

    def _deadline_passed(self, channel: Channel, session: MemberSession) -> None:
        if channel.is_closed or session.state is not ConnectionState.OPEN:
            return  # registered, registering, or gone
        self._idle(
            "closed a connection from %s: no Register within %d ms of connecting "
            "(--register-timeout-ms)", channel.peer, self.limits.register_timeout_ms,
        )  # fmt: skip
        channel.fail(
            ErrorCode.REGISTER_TIMEOUT,
            f"no Register within {self.limits.register_timeout_ms} ms of connecting "
            "(Metadata requests do not extend it)",
        )


def _tell_plain(conn: socket.socket, code: ErrorCode, message: str) -> None:
    """Best effort: an error frame on a socket with no transport, before closing it.
    What the client sent is read first, so closing does not reset the connection
    (which could discard the frame before the client reads it)."""
    with contextlib.suppress(OSError):
        for _ in range(16):
            if not conn.recv(65536):
                break
    with contextlib.suppress(OSError):
        conn.send(encode(ErrorResponse(correlation_id=0, code=code, message=message)))
        conn.shutdown(socket.SHUT_WR)


def _why(err: BaseException) -> str:
    """A handshake failure in a few words: OpenSSL's reason when it has one."""
    if isinstance(err, ssl.SSLCertVerificationError):  # we checked the client's
        return f"its certificate is not trusted by --tls-client-ca-file: {err.verify_message}"
    if isinstance(err, ssl.SSLError) and err.reason:
        return err.reason.replace("_", " ").lower()
    if isinstance(err, ConnectionError):
        return "the client closed the connection (it may not trust this coordinator's certificate)"
    return str(err) or type(err).__name__


async def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host:port`, one per address it resolves to (as asyncio's
    `create_server` binds them: SO_REUSEADDR, IPv6 sockets IPv6-only)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    seen: set[tuple[Any, ...]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                # Port 0: the first address picks a free port, the others take the same.
                sock.bind((address[0], port, *address[2:]))
            except OSError as err:
                raise OSError(
                    err.errno, f"consumer channel cannot listen on {host}:{port}: {err.strerror}"
                ) from err
            port = sock.getsockname()[1]
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
