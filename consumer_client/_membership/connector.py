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

When the coordinator goes away (its channel closes, or it falls silent and another replica
says the group is served elsewhere) the member does not stop: it keeps running the ranges
it owns while its lease lasts (a session timeout since it last heard from a coordinator),
finds who serves the group now (Metadata, asked of any address it knows) and registers
again with a claim: its member id, epoch, owned ranges and exact positions. A coordinator
that adopts the claim lets it keep its ranges, with no pause and no duplicates. Only a
fence (FENCED_MEMBER, UNKNOWN_MEMBER) or a lease that ran out stops everything, as the
lost-connection procedure of docs/protocol.md §6.1 says (§7.4: riding through).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

from keyshard.consumer_client._errors import ConsumerError
from keyshard.consumer_client._membership.tls_errors import closed_problem, handshake_problem
from keyshard.consumer_client._membership.unreachable import Unreachable
from keyshard.core.model.addresses import parse_host_port
from keyshard.core.model.positions import PositionUpdate, TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.channel import Channel, ChannelClosed, RemoteError
from keyshard.core.protocol.messages import (
    ErrorCode,
    ErrorResponse,
    FetchedWindow,
    HighWatermark,
    LeaveRequest,
    MemberClaim,
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
from keyshard.core.protocol.wire import (
    positions_from_wire,
    positions_to_wire,
    ranges_from_wire,
    ranges_to_wire,
)
from keyshard.core.security.tls import ClientTls

log = logging.getLogger(__name__)

__all__ = ["ConsumerError", "MemberHooks", "Membership"]


#: A channel closed with one of these means this member is out: stop everything.
FENCED_CODES = {ErrorCode.FENCED_MEMBER, ErrorCode.UNKNOWN_MEMBER}
#: Silent this long (as a share of the session timeout), a member asks around whether its
#: group is served elsewhere now (pings come every third of it).
SUSPECT_SHARE = 0.5
#: How often a member that suspects its coordinator asks around, and how long it waits
#: for each answer.
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 2.0

FATAL_CODES = {
    ErrorCode.UNKNOWN_TOPIC,
    ErrorCode.AUTHENTICATION_FAILED,
    ErrorCode.INCONSISTENT_TOPICS,
    ErrorCode.INVALID_MESSAGE,
    ErrorCode.INVALID_RANGES,
}


@dataclass(frozen=True, slots=True)
class Fetched:
    """Records examined in offsets [start, end) of one partition, per load bucket (owned
    or not): the demand a Ping reply reports (`FetchedWindow` on the wire)."""

    tp: TopicPartition
    start: int
    end: int
    buckets: dict[int, int]


@dataclass(frozen=True, slots=True)
class PingReport:
    """What a Ping reply tells the coordinator (docs/protocol.md §4)."""

    positions: PositionUpdate
    load: dict[int, int] = field(default_factory=dict)  # completions per load bucket
    high_watermarks: list[HighWatermark] = field(default_factory=list)
    fetched: list[Fetched] = field(default_factory=list)  # demand seen by the fetches
    # Records completed in lanes since the last reply, and their handler time (whole
    # concurrency, ms): the member's speed (docs/protocol.md §8.7).
    busy_records: int = 0
    busy_ms: int | None = None


class MemberHooks(Protocol):
    def ping_reply(self) -> PingReport:
        """Positions, per-bucket load and demand since the last ping, seen partition ends."""
        ...

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None: ...

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]: ...

    async def session_lost(self) -> None:
        """docs/protocol.md, §6.1 LOST: stop fetchers, drop queues, forget ownership."""
        ...

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        """The ranges this member runs and their exact positions: its claim."""
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
        connect_timeout_s: float | None = None,
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
        # The newest coordinator epoch heard: requests of an older one (a fenced replica)
        # are refused.
        self.coordinator_epoch = 0
        # Bumped on every fresh registration: work of older sessions is stale. Not when a
        # claim is adopted: the work in flight is still this member's.
        self.session = 0
        self.closing = False
        self.registered = asyncio.Event()
        self.channel: Channel | None = None
        self._last_heard = 0.0
        # Final positions of ranges stopped since the last registration: their replies
        # may have gone to a coordinator that died; a claim carries them again.
        self._released: PositionUpdate = {}
        # The address of the coordinator we registered with, as Metadata names it.
        self._served_by = ""
        # Requests that arrived while a registration was being settled, in order.
        self._held_requests: list[tuple[Channel, Message]] | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # StopFetcher drains in progress
        self.unreachable = Unreachable(log, "the coordinator", connect_timeout_s=connect_timeout_s)

    async def run(self) -> None:
        """Register, watch, and after a loss register again (with a claim while the lease
        lasts), until `closing`; a fatal refusal raises `ConsumerError`."""
        backoff = 0.1
        while not self.closing:
            if self.member_id is not None and self._lease_left() <= 0:
                await self._lose("the lease ran out before a coordinator took the claim")
            try:
                if self.member_id is None:
                    channel = await self._register()
                else:  # with a claim: not past the lease, whatever the addresses make us wait
                    channel = await asyncio.wait_for(self._register(), self._lease_left())
            except ConsumerError:
                raise
            except (OSError, ChannelClosed, RemoteError, TimeoutError) as err:
                self.unreachable.failed(self.addresses, err)  # ConsumerError past the timeout
                # Riding on a lease, look again before it runs out; otherwise back off (a
                # wrong address is not worth 20 connection attempts a second).
                lease = self._lease_left() if self.member_id is not None else backoff
                await asyncio.sleep(min(backoff, max(0.05, lease)))
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            self.unreachable.succeeded()
            reason, fenced = await self._watch(channel)
            if self.closing:
                return
            self.registered.clear()
            if fenced or self._lease_left() <= 0:
                await self._lose(reason)
            else:
                log.warning(
                    "%s: lost the coordinator (%s); running on while the lease lasts "
                    "(%.1f s) and looking for it", self.name, reason, self._lease_left(),
                )  # fmt: skip

    @property
    def addresses(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self.coordinators)

    def heard_ago(self) -> float | None:
        """Seconds since a coordinator last spoke to this member (None: never did)."""
        return None if self._last_heard == 0.0 else time.monotonic() - self._last_heard

    def _lease_left(self) -> float:
        """docs/protocol.md §7.1: a member may run its ranges for a session timeout after
        it last heard from a coordinator."""
        return self._last_heard + self.session_timeout_ms / 1000 - time.monotonic()

    async def _lose(self, reason: str) -> None:
        log.warning("%s: lost the coordinator (%s); stopping fetchers", self.name, reason)
        self.member_id = None
        self._released = {}
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
        for host, port in self._silent_last():
            try:
                probe = await self._connect(host, port, f"{self.name}-probe")
                probe.start()
                try:
                    meta = await probe.request(
                        MetadataRequest(correlation_id=0, group=self.group), timeout=5.0
                    )
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
                try:
                    await self._register_on(channel, target_host, target_port)
                except BaseException:
                    # Timed out, refused or cancelled (the lease ran out): a channel left
                    # open would answer the coordinator's pings for a member that is gone.
                    self._held_requests = None
                    await channel.aclose()
                    raise
                self._served_by = meta.coordinator
                return channel
            except ConsumerError:
                raise
            except (OSError, ChannelClosed, RemoteError, TimeoutError) as err:
                last_error = err
        # run() names the addresses tried; this is the last error, in words.
        raise ChannelClosed(str(last_error) or type(last_error).__name__)

    async def _register_on(self, channel: Channel, host: str, port: int) -> None:
        """Register (with a claim, after a loss) on a connected channel and settle."""
        self._held_requests = []  # until the registration is settled
        channel.set_request_handler(self._on_request)
        channel.start()
        if self.member_id is not None and self.tasks:
            # A range still draining is in no claim, so the new owner frees it at once:
            # let its records finish first (the caller bounds this by the lease).
            await asyncio.wait(list(self.tasks))
        claim = self._claim()
        request = RegisterRequest(
            correlation_id=0,
            group=self.group,
            topics=self.topics,
            consumer_name=self.name,
            session_timeout_ms=self.session_timeout_ms,
            capacity=self.capacity,
            auth_token=self.auth_token,
            claim=claim,
        )
        if claim is None:
            self._last_heard = time.monotonic()
        try:
            response = await channel.request(request, timeout=10.0)
        except RemoteError as err:
            if err.code in FATAL_CODES:
                raise ConsumerError(f"coordinator refused registration: {err}") from err
            raise
        except ChannelClosed:
            self._check_refusal(channel, host, port)
            raise
        if not isinstance(response, RegisterResponse):
            raise ChannelClosed(f"unexpected reply to register: {response.type}")
        await self._settle(channel, response, claim)

    def _claim(self) -> MemberClaim | None:
        """What to register with after losing the coordinator: what we still run."""
        if self.member_id is None:
            return None
        owned, positions = self.hooks.held()
        for tp, segments in self._released.items():
            positions.setdefault(tp, []).extend(segments)
        return MemberClaim(
            member_id=self.member_id,
            member_epoch=self.epoch,
            owned=ranges_to_wire(owned),
            positions=positions_to_wire(positions),
            coordinator_epoch=self.coordinator_epoch,
        )

    async def _settle(
        self, channel: Channel, response: RegisterResponse, claim: MemberClaim | None
    ) -> None:
        """Take the registration in: with an adopted claim keep what was adopted (and stop
        the rest at once), else start a fresh session. Requests that arrived meanwhile are
        handled after, in order."""
        adopted = claim is not None and response.member_id == claim.member_id
        if adopted:
            kept = ranges_from_wire(response.adopted)
            extra = self.hooks.held()[0] - kept
            if extra:
                await self.hooks.stop_fetcher(extra)  # nobody else has them yet: no report
            log.info("%s: back as %s, keeping %s", self.name, response.member_id, kept)
        else:
            if claim is not None:
                await self._lose("the new coordinator did not take our claim")
            self.session += 1
            log.info("%s: registered as %s", self.name, response.member_id)
        self._last_heard = time.monotonic()
        self._released = {}
        self._tls_closes = 0
        self.member_id = response.member_id
        self.epoch = response.member_epoch
        self.coordinator_epoch = max(self.coordinator_epoch, response.coordinator_epoch)
        self.channel = channel
        self.registered.set()
        held, self._held_requests = self._held_requests or [], None
        for held_channel, message in held:
            self._on_request(held_channel, message)

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

    async def _watch(self, channel: Channel) -> tuple[str, bool]:
        """Until the channel is lost: why, and whether we are fenced (docs/protocol.md §7.1
        and §7.4). A coordinator silent for half the session is asked around about, again
        and again until it speaks: when another replica serves the group now, the channel
        is dropped and the caller registers there with a claim; past the session timeout
        the lease is over."""
        timeout = self.session_timeout_ms / 1000
        while True:
            silent = time.monotonic() - self._last_heard
            if silent >= timeout:
                channel.close("no request from the coordinator within the session timeout")
                return "session timeout", True
            if silent >= SUSPECT_SHARE * timeout:
                # The replicas notice a dead one within their timeout: asked too early, the
                # others still name it; so ask until they do not.
                try:  # not past the lease, however many addresses keep us waiting
                    moved = await asyncio.wait_for(self._served_elsewhere(), timeout - silent)
                except TimeoutError:
                    continue
                if moved:
                    channel.close("the group is served by another coordinator now")
                    return "the group moved to another coordinator", False
                wait = min(PROBE_INTERVAL_S, timeout - silent)
            else:
                wait = SUSPECT_SHARE * timeout - silent
            try:
                reason = await asyncio.wait_for(channel.wait_closed(), max(0.01, wait))
            except TimeoutError:
                continue
            error = channel.peer_error
            return reason, error is not None and error.code in FENCED_CODES

    def _silent_last(self) -> list[tuple[str, int]]:
        """The known addresses, the coordinator we last registered with at the end: when
        it went silent (frozen, cut off) it may still accept a connection and then answer
        nothing until a timeout, which a claim has no time for."""
        return sorted(self.coordinators, key=lambda a: f"{a[0]}:{a[1]}" == self._served_by)

    async def _served_elsewhere(self) -> bool:
        """Ask the known addresses who serves the group: True when it is not the silent
        coordinator, or it is at a newer coordinator epoch. The silent one is asked last
        (its answer would only come after the probe's timeout)."""
        silent = self._served_by
        for host, port in self._silent_last():
            try:
                probe = await self._connect(host, port, f"{self.name}-probe")
                probe.start()
                try:
                    meta = await probe.request(
                        MetadataRequest(correlation_id=0, group=self.group), timeout=PROBE_TIMEOUT_S
                    )
                finally:
                    await probe.aclose()
            except (OSError, ChannelClosed, RemoteError, TimeoutError, ConsumerError):
                continue
            if isinstance(meta, MetadataResponse) and meta.active:
                newer = meta.coordinator_epoch > self.coordinator_epoch
                return newer or meta.coordinator != silent
        return False

    def _on_request(self, channel: Channel, message: Message) -> None:
        if self._held_requests is not None:
            self._held_requests.append((channel, message))
            return
        if channel is not self.channel:
            return  # a channel given up on: answering would speak for a member that is gone
        epoch = getattr(message, "coordinator_epoch", None)
        if epoch is not None and epoch < self.coordinator_epoch:
            # A replica that lost the group (fenced) still talking: refuse, do nothing.
            channel.reply(
                message,
                ErrorResponse(
                    correlation_id=0,
                    code=ErrorCode.STALE_COORDINATOR,
                    message=f"coordinator epoch {epoch} is older than {self.coordinator_epoch}",
                ),
            )
            return
        if epoch is not None:
            self.coordinator_epoch = epoch
        self._last_heard = time.monotonic()
        match message:
            case PingRequest():
                self.epoch = max(self.epoch, message.member_epoch)
                report = self.hooks.ping_reply()
                channel.reply(
                    message,
                    PingResponse(
                        correlation_id=0,
                        member_epoch=message.member_epoch,
                        positions=positions_to_wire(report.positions),
                        load=report.load,
                        high_watermarks=report.high_watermarks,
                        fetched=[
                            FetchedWindow(
                                topic=f.tp[0], partition=f.tp[1], start=f.start, end=f.end,
                                buckets=f.buckets,
                            )
                            for f in report.fetched
                        ],
                        busy_records=report.busy_records,
                        busy_ms=report.busy_ms,
                    ),
                )  # fmt: skip
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
        for tp, segments in final.items():  # until a coordinator is known to have them
            self._released.setdefault(tp, []).extend(segments)
        channel.reply(
            request,
            StopFetcherResponse(
                correlation_id=0,
                member_epoch=request.member_epoch,
                positions=positions_to_wire(final),
            ),
        )
