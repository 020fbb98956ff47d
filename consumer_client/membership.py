"""Group membership over the coordinator channel: the *connector* of docs/protocol.md.

Finding the coordinator, registering, answering Ping/StopFetcher/StartFetcher, noticing a
silent or lost coordinator and leaving are the same for every kind of member; what a
member *does* with its ranges is not. `Membership` does the former and calls a
`MemberHooks` object for the latter, so the fetching consumer (`CoordinatedConsumer`) and
the Spark streaming source (whose "fetchers" are micro-batches) share one implementation
of the protocol side.

All hooks run on the membership's event loop. `stop_fetcher` runs its synchronous part
(stop dispatching the ranges) when called and returns an awaitable that completes with
the final positions once the ranges are drained; the reply is sent only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable
from typing import Protocol

from consumer_client.tls_errors import closed_problem, handshake_problem
from coordinator.model.addresses import parse_host_port
from coordinator.model.positions import PositionUpdate
from coordinator.model.ranges import RangeSet
from coordinator.protocol.channel import Channel, ChannelClosed, RemoteError
from coordinator.protocol.messages import (
    ErrorCode,
    HighWatermark,
    LeaveRequest,
    Message,
    MetadataRequest,
    MetadataResponse,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from coordinator.protocol.wire import positions_from_wire, positions_to_wire, ranges_from_wire
from coordinator.security.tls import ClientTls

log = logging.getLogger(__name__)


class ConsumerError(RuntimeError):
    """A condition the consumer cannot recover from by re-registering (bad config,
    unknown topic, wrong token)."""


FATAL_CODES = {
    ErrorCode.UNKNOWN_TOPIC,
    ErrorCode.AUTHENTICATION_FAILED,
    ErrorCode.INCONSISTENT_TOPICS,
    ErrorCode.INVALID_MESSAGE,
    ErrorCode.INVALID_RANGES,
}


class MemberHooks(Protocol):
    def ping_reply(self) -> tuple[PositionUpdate, dict[int, int], list[HighWatermark]]:
        """Positions, per-bucket load since the last ping, and seen high watermarks."""
        ...

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None: ...

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]: ...

    async def session_lost(self) -> None:
        """docs/protocol.md, §6.1 LOST: stop fetchers, drop queues, forget ownership."""
        ...


class Membership:
    def __init__(
        self,
        hooks: MemberHooks,
        *,
        group: str,
        topics: list[str],
        coordinators: list[tuple[str, int]],
        name: str,
        session_timeout_ms: int,
        capacity: int,
        auth_token: str | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.hooks = hooks
        self.group = group
        self.topics = topics
        self.coordinators = coordinators
        self.name = name
        self.session_timeout_ms = session_timeout_ms
        self.capacity = capacity
        self.auth_token = auth_token
        self.tls = tls
        # Built now: a missing or bad file is a TlsConfigError when the consumer is made.
        self._ssl = tls.context() if tls is not None else None
        self._tls_closes = 0  # closes right after our TLS handshake, in a row
        self.member_id: str | None = None
        self.epoch = 0
        self.session = 0  # bumped on every registration: work of older sessions is stale
        self.closing = False
        self.registered = asyncio.Event()
        self.channel: Channel | None = None
        self._last_heard = 0.0
        self.tasks: set[asyncio.Task[None]] = set()  # StopFetcher drains in progress

    async def run(self) -> None:
        """Register, watch, and after a loss start over, until `closing`; a fatal refusal
        raises `ConsumerError`."""
        backoff = 0.1
        while not self.closing:
            try:
                channel = await self._register()
            except ConsumerError:
                raise
            except (OSError, ChannelClosed, RemoteError, TimeoutError) as err:
                log.info("%s: coordinator not reachable yet: %s", self.name, err)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            reason = await self._watch(channel)
            if self.closing:
                return
            log.warning("%s: lost the coordinator (%s); stopping fetchers", self.name, reason)
            self.registered.clear()
            self.member_id = None
            await self.hooks.session_lost()

    async def leave(self, positions: PositionUpdate) -> None:
        """Graceful exit: report exact positions so the next owners start where we stopped."""
        self.closing = True
        channel = self.channel
        if channel is not None and not channel.is_closed and self.member_id is not None:
            leave = LeaveRequest(
                correlation_id=0,
                member_id=self.member_id,
                member_epoch=self.epoch,
                positions=positions_to_wire(positions),
            )
            with contextlib.suppress(ChannelClosed, RemoteError, TimeoutError):
                await channel.request(leave, timeout=5.0)
            await channel.aclose("consumer closed")

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.channel is not None:
            await self.channel.aclose()

    async def _register(self) -> Channel:
        """docs/protocol.md, §6.1 DISCOVER and REGISTER: ask each known address in turn who
        the active coordinator is, connect to it and register; a refusal that
        re-registering cannot fix raises `ConsumerError`, anything else is retried by
        `run`."""
        last_error: Exception | None = None
        for host, port in self.coordinators:
            try:
                probe = await self._connect(host, port, f"{self.name}-probe")
                probe.start()
                try:
                    meta = await probe.request(MetadataRequest(correlation_id=0), timeout=5.0)
                except ChannelClosed:
                    self._check_refusal(probe, host, port)
                    raise
                finally:
                    await probe.aclose()
                if not isinstance(meta, MetadataResponse) or not meta.active:
                    raise ChannelClosed(f"{host}:{port} is not an active coordinator")
                # A coordinator listening on every interface cannot advertise where it is
                # reachable: then it is where the probe reached it.
                target_host, target_port = parse_host_port(meta.coordinator)
                if target_host in ("0.0.0.0", "::"):
                    target_host, target_port = host, port
                channel = await self._connect(target_host, target_port, f"{self.name}-connector")
                channel.set_request_handler(self._on_request)
                channel.start()
                request = RegisterRequest(
                    correlation_id=0,
                    group=self.group,
                    topics=self.topics,
                    consumer_name=self.name,
                    session_timeout_ms=self.session_timeout_ms,
                    capacity=self.capacity,
                    auth_token=self.auth_token,
                )
                self._last_heard = time.monotonic()
                try:
                    response = await channel.request(request, timeout=10.0)
                except RemoteError as err:
                    await channel.aclose()
                    if err.code in FATAL_CODES:
                        raise ConsumerError(f"coordinator refused registration: {err}") from err
                    raise
                except ChannelClosed:
                    self._check_refusal(channel, target_host, target_port)
                    raise
                if not isinstance(response, RegisterResponse):
                    await channel.aclose()
                    raise ChannelClosed(f"unexpected reply to register: {response.type}")
                self.session += 1
                self._tls_closes = 0
                self.member_id = response.member_id
                self.epoch = response.member_epoch
                self.channel = channel
                self.registered.set()
                log.info("%s: registered as %s", self.name, self.member_id)
                return channel
            except ConsumerError:
                raise
            except (OSError, ChannelClosed, RemoteError, TimeoutError) as err:
                last_error = err
        raise ChannelClosed(f"no coordinator reachable: {last_error}")

    async def _connect(self, host: str, port: int, name: str) -> Channel:
        """A channel to the coordinator, over TLS when `tls` is set; a handshake failure
        that no retry can fix (an untrusted certificate, a peer without TLS) raises
        `ConsumerError` saying which setting to change."""
        try:
            return await Channel.connect(host, port, name=name, ssl=self._ssl)
        except ssl.SSLError as err:
            problem = handshake_problem(err, self.tls, f"{host}:{port}")
            if problem is not None:
                raise ConsumerError(problem) from err
            raise

    def _check_refusal(self, channel: Channel, host: str, port: int) -> None:
        """`channel` closed before answering: raise `ConsumerError` when that says our
        TLS settings are wrong. A close right after the handshake must happen twice in a
        row: once, it may be a coordinator shutting down at that moment."""
        problem = closed_problem(channel, self.tls, f"{host}:{port}")
        if problem is None:
            return
        if channel.peer_error is None:
            self._tls_closes += 1
            if self._tls_closes < 2:
                raise ChannelClosed(problem)
        raise ConsumerError(problem)

    async def _watch(self, channel: Channel) -> str:
        """docs/protocol.md, §7.1 (the lease rule, consumer side): no request from the
        coordinator for a session timeout means lost; the clock restarts at every request
        (`_on_request`), and before the first one runs from the Register."""
        timeout = self.session_timeout_ms / 1000
        while True:
            remaining = self._last_heard + timeout - time.monotonic()
            if remaining <= 0:
                channel.close("no request from the coordinator within the session timeout")
                return "session timeout"
            try:
                return await asyncio.wait_for(channel.wait_closed(), remaining)
            except TimeoutError:
                continue

    def _on_request(self, channel: Channel, message: Message) -> None:
        self._last_heard = time.monotonic()
        match message:
            case PingRequest():
                self.epoch = max(self.epoch, message.member_epoch)
                positions, load, high_watermarks = self.hooks.ping_reply()
                channel.reply(
                    message,
                    PingResponse(
                        correlation_id=0,
                        member_epoch=message.member_epoch,
                        positions=positions_to_wire(positions),
                        load=load,
                        high_watermarks=high_watermarks,
                    ),
                )
            case StartFetcherRequest():
                self.epoch = max(self.epoch, message.member_epoch)
                self.hooks.start_fetcher(
                    ranges_from_wire(message.ranges), positions_from_wire(message.positions)
                )
                channel.reply(
                    message,
                    StartFetcherResponse(correlation_id=0, member_epoch=message.member_epoch),
                )
            case StopFetcherRequest():
                self.epoch = max(self.epoch, message.member_epoch)
                drained = self.hooks.stop_fetcher(ranges_from_wire(message.ranges))
                task = asyncio.create_task(self._finish_stop(channel, message, drained))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            case _:
                channel.fail(
                    ErrorCode.UNEXPECTED_MESSAGE,
                    f"a coordinator may not send {message.type}",
                    message.correlation_id,
                )

    async def _finish_stop(
        self, channel: Channel, request: StopFetcherRequest, drained: Awaitable[PositionUpdate]
    ) -> None:
        final = await drained
        channel.reply(
            request,
            StopFetcherResponse(
                correlation_id=0,
                member_epoch=request.member_epoch,
                positions=positions_to_wire(final),
            ),
        )
