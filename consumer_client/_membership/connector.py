"""Group membership over the coordinator channel: the *connector* of docs/protocol.md.

`Membership` is the I/O shell over the member's state machine (`_membership.state`): it
opens the channels, reads the clock, runs the tasks, and carries out what the machine
decides — register (with a claim after losing the coordinator), answer Ping,
StopFetcher and StartFetcher through the `MemberHooks` given to `run`, ask the other
addresses about a silent coordinator, ride through a lost channel or run the LOST
procedure, leave. The member (`member`: id, epochs, lease) is made with the membership
and outlives its channels; the hooks are what one run does with its ranges.

When the coordinator goes away (its channel closes, or it falls silent and another replica
says the group is served elsewhere) the member does not stop: it keeps running the ranges
it owns while its lease lasts, finds who serves the group now (Metadata, asked of any
address it knows) and registers again with a claim. A coordinator that adopts the claim
lets it keep its ranges, with no pause and no duplicates. Only a fence (FENCED_MEMBER,
UNKNOWN_MEMBER) or a lease that ran out stops everything (docs/protocol.md §6.1, §7.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from functools import partial

from keyshard.consumer_client._errors import ConsumerError
from keyshard.consumer_client._membership.member_hooks import MemberHooks
from keyshard.consumer_client._membership.state import (
    PROBE_TIMEOUT_S,
    Adopted,
    Apply,
    Expired,
    Fresh,
    Hold,
    Ignore,
    Lose,
    MemberStateMachine,
    Probe,
    Refuse,
    RideThrough,
    Unexpected,
    ping_response,
    start_response,
    stop_response,
    topics_change,
)
from keyshard.consumer_client._membership.unreachable import Unreachable
from keyshard.consumer_client._membership.wrong_settings import (
    closed_problem,
    handshake_problem,
    wrong_port_problem,
)
from keyshard.core.model.addresses import parse_host_port
from keyshard.core.model.durations import renamed_seconds
from keyshard.core.model.positions import PositionUpdate
from keyshard.core.protocol.channel import Channel, ChannelClosed, RemoteError
from keyshard.core.protocol.messages import (
    ErrorCode,
    LeaveRequest,
    Message,
    MetadataRequest,
    MetadataResponse,
    PingRequest,
    RegisterResponse,
    StartFetcherRequest,
    StopFetcherRequest,
)
from keyshard.core.protocol.wire import positions_from_wire, ranges_from_wire
from keyshard.core.security.tls import ClientTls

log = logging.getLogger(__name__)

__all__ = ["Membership"]

#: How long connecting, a Metadata answer and a Register answer may take.
CONNECT_TIMEOUT_S = 5.0
METADATA_TIMEOUT_S = 5.0
REGISTER_TIMEOUT_S = 10.0
LEAVE_TIMEOUT_S = 5.0


class Membership:
    """One member of `group` and its channel to the group's coordinator.

    Args:
        group, topics: the group to join and the topics it consumes.
        topic_pattern: instead of `topics`, a regular expression: the group consumes every
            topic whose whole name matches it, those created later included.
        coordinators: the coordinator addresses to ask (any replica, or all of them).
        name: this member's name in the group's views and logs.
        session_timeout_ms: the lease: without a request from a coordinator for this long
            the member stops everything, and a coordinator may give its ranges to others
            (docs/protocol.md §7.1).
        capacity: this member's weight in the assignment.
        auth_token: the credentials the coordinator requires (a token or a JWT), if any.
        tls: the coordinator channel's TLS settings (None: plain TCP).
        connect_timeout_ms: how long the coordinator may stay unreachable before `run`
            raises `ConsumerError` (None: retry forever, warning at once and every 30 s).

    `connect_timeout_s` (seconds) is a deprecated name of `connect_timeout_ms`.
    """

    @renamed_seconds(connect_timeout_s="connect_timeout_ms")
    def __init__(
        self,
        *,
        group: str,
        topics: list[str],
        coordinators: list[tuple[str, int]],
        name: str,
        session_timeout_ms: int,
        capacity: int,
        auth_token: str | None = None,
        tls: ClientTls | None = None,
        connect_timeout_ms: int | None = None,
        topic_pattern: str | None = None,
    ) -> None:
        self.member = MemberStateMachine[Channel](
            group=group,
            topics=topics,
            topic_pattern=topic_pattern,
            name=name,
            session_timeout_ms=session_timeout_ms,
            capacity=capacity,
            auth_token=auth_token,
        )
        self.coordinators = coordinators
        self.tls = tls
        # Built now: a missing or bad file is a TlsConfigError when the consumer is made.
        self._ssl = tls.context() if tls is not None else None
        self.registered = asyncio.Event()
        # Cleared while the member stands aside (it cannot read Kafka): no registration.
        self.readable = asyncio.Event()
        self.readable.set()
        self.tasks: set[asyncio.Task[None]] = set()  # StopFetcher drains in progress
        self.unreachable = Unreachable(
            log, "the coordinator", connect_timeout_ms=connect_timeout_ms
        )

    @property
    def name(self) -> str:
        return self.member.registration.name

    @property
    def channel(self) -> Channel | None:
        """The channel registered on (None: between registrations)."""
        return self.member.channel

    @property
    def addresses(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self.coordinators)

    async def run(self, hooks: MemberHooks) -> None:
        """Register, watch, and after a loss register again (with a claim while the lease
        lasts), until the member closes; a fatal refusal raises `ConsumerError`. `hooks`
        answer the coordinator's requests for this run."""
        try:
            await self._run(hooks)
        except ConsumerError:
            self.member.failed()
            raise

    async def _run(self, hooks: MemberHooks) -> None:
        member = self.member
        while not member.closing:
            if member.aside:
                await self.readable.wait()
                member.rejoin()
                continue
            if (loss := member.lease_ran_out(time.monotonic())) is not None:
                await self._lose(hooks, loss)
            deadline = member.begin_discovery(time.monotonic())
            try:
                channel = await asyncio.wait_for(self._register(hooks), deadline)
            except ConsumerError:
                raise
            except (OSError, ChannelClosed, RemoteError, TimeoutError) as err:
                self.unreachable.failed(self.addresses, err)  # ConsumerError past the timeout
                await asyncio.sleep(member.retry_delay(time.monotonic()))
                continue
            self.unreachable.succeeded()
            reason, error = await self._watch(channel)
            if member.closing:
                return
            self.registered.clear()
            if member.aside:
                continue
            match member.disconnected(reason, error, time.monotonic()):
                case Lose() as loss:
                    await self._lose(hooks, loss)
                case RideThrough(lease_left_s=left):
                    log.warning(
                        "%s: lost the coordinator (%s); running on while the lease lasts "
                        "(%.1f s) and looking for it", self.name, reason, left,
                    )  # fmt: skip

    def heard_ago(self) -> float | None:
        """Seconds since a coordinator last spoke to this member (None: never did)."""
        return self.member.heard_ago(time.monotonic())

    async def _lose(self, hooks: MemberHooks, loss: Lose) -> None:
        """docs/protocol.md §6.1 LOST (the machine has forgotten the member id already)."""
        log.warning("%s: lost the coordinator (%s); stopping fetchers", self.name, loss.reason)
        await hooks.session_lost()

    async def leave(self, positions: PositionUpdate) -> None:
        """Graceful exit: report exact positions so the next owners start where we stopped."""
        channel = self.channel
        await self._send_leave(channel, self.member.leave_request(positions), "consumer closed")

    async def step_aside(
        self, positions: PositionUpdate, forget: Callable[[], Awaitable[None]]
    ) -> None:
        """This member cannot read Kafka (docs/protocol.md §7.6): hand `positions` to the
        members that can in a Leave, and register no more until `readable` is set.
        `forget` drops everything it holds: done before the Leave lets the next owners
        start, and after the coordinator's requests are no longer applied."""
        self.readable.clear()
        channel = self.channel
        leave = self.member.step_aside(positions)
        await forget()
        await self._send_leave(channel, leave, "the consumer cannot read Kafka")

    @staticmethod
    async def _send_leave(channel: Channel | None, leave: LeaveRequest | None, why: str) -> None:
        if channel is not None and not channel.is_closed and leave is not None:
            with contextlib.suppress(ChannelClosed, RemoteError, TimeoutError):
                await channel.request(leave, timeout=LEAVE_TIMEOUT_S)
            await channel.aclose(why)

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.channel is not None:
            await self.channel.aclose()

    async def _register(self, hooks: MemberHooks) -> Channel:
        """docs/protocol.md, §6.1 DISCOVER and REGISTER: ask each known address in turn who
        the active coordinator is, connect to it and register; a refusal that
        re-registering cannot fix raises `ConsumerError`, anything else is retried by
        `run`."""
        last_error: Exception | None = None
        for host, port in self.member.probe_order(self.coordinators):
            try:
                meta = await self._ask_metadata(host, port, METADATA_TIMEOUT_S, check=True)
                if not isinstance(meta, MetadataResponse) or not meta.active:
                    raise ChannelClosed(f"{host}:{port} is not an active coordinator")
                # A coordinator listening on every interface cannot advertise where it is
                # reachable: then it is where the probe reached it.
                target_host, target_port = parse_host_port(meta.coordinator)
                if target_host in ("0.0.0.0", "::"):
                    target_host, target_port = host, port
                channel = await self._connect(target_host, target_port, f"{self.name}-connector")
                try:
                    await self._register_on(
                        hooks, channel, target_host, target_port, meta.coordinator
                    )
                except BaseException:
                    # Timed out, refused or cancelled (the lease ran out): a channel left
                    # open would answer the coordinator's pings for a member that is gone.
                    self.member.abandon_registration()
                    await channel.aclose()
                    raise
                return channel
            except ConsumerError:
                raise
            except (OSError, ChannelClosed, RemoteError, TimeoutError) as err:
                last_error = err
        # run() names the addresses tried; this is the last error, in words.
        raise ChannelClosed(str(last_error) or type(last_error).__name__)

    async def _register_on(
        self, hooks: MemberHooks, channel: Channel, host: str, port: int, served_by: str
    ) -> None:
        """Register (with a claim, after a loss) on a connected channel and settle."""
        member = self.member
        member.begin_registration()
        channel.set_request_handler(partial(self._on_request, hooks))
        channel.start()
        if member.claims and self.tasks:
            # A range still draining is in no claim, so the new owner frees it at once:
            # let its records finish first (the caller bounds this by the lease).
            await asyncio.wait(list(self.tasks))
        held = hooks.held() if member.claims else None
        request = member.register_request(time.monotonic(), held)
        try:
            response = await channel.request(request, timeout=REGISTER_TIMEOUT_S)
        except RemoteError as err:
            if member.refusal_is_fatal(err.code):
                raise ConsumerError(f"coordinator refused registration: {err}") from err
            raise
        except ChannelClosed:
            self._check_refusal(channel, host, port)
            raise
        if not isinstance(response, RegisterResponse):
            raise ChannelClosed(f"unexpected reply to register: {response.type}")
        await self._settle(hooks, channel, response, served_by)

    async def _settle(
        self, hooks: MemberHooks, channel: Channel, response: RegisterResponse, served_by: str
    ) -> None:
        """Take the registration in: with an adopted claim keep what was adopted (and stop
        the rest at once), else start a fresh session. Requests that arrived meanwhile are
        handled after, in order."""
        match self.member.settle(response):
            case Adopted(kept=kept):
                extra = hooks.held()[0] - kept
                if extra:
                    await hooks.stop_fetcher(extra)  # nobody else has them yet: no report
                log.info("%s: back as %s, keeping %s", self.name, response.member_id, kept)
            case Fresh(loss=loss):
                if loss is not None:  # the claim was not taken
                    await self._lose(hooks, loss)
                log.info("%s: registered as %s", self.name, response.member_id)
        held = self.member.registered(response, channel, served_by, time.monotonic())
        self.registered.set()
        for held_channel, message in held:
            self._on_request(hooks, held_channel, message)

    async def _connect(self, host: str, port: int, name: str) -> Channel:
        """A channel to the coordinator, over TLS when `tls` is set; a handshake failure
        that no retry can fix (an untrusted certificate, a peer without TLS) raises
        `ConsumerError` saying which setting to change."""
        try:
            return await Channel.connect(
                host, port, name=name, ssl=self._ssl, timeout=CONNECT_TIMEOUT_S
            )
        except ssl.SSLError as err:
            problem = handshake_problem(err, self.tls, f"{host}:{port}")
            if problem is not None:
                raise ConsumerError(problem) from err
            raise

    def _check_refusal(self, channel: Channel, host: str, port: int) -> None:
        """`channel` closed before answering: raise `ConsumerError` when that says our
        settings are wrong (the address, TLS). A close right after the TLS handshake must
        happen twice in a row: once, it may be a coordinator shutting down at that moment."""
        wrong_port = wrong_port_problem(channel, f"{host}:{port}")
        if wrong_port is not None:
            raise ConsumerError(wrong_port)
        problem = closed_problem(channel, self.tls, f"{host}:{port}")
        if problem is None:
            return
        if channel.peer_error is None and not self.member.tls_close_is_final():
            raise ChannelClosed(problem)
        raise ConsumerError(problem)

    async def _watch(self, channel: Channel) -> tuple[str, ErrorCode | None]:
        """Until the channel is lost: why, and the error the coordinator closed it with
        (docs/protocol.md §7.1 and §7.4). While the coordinator is silent the other
        addresses are asked who serves the group: when another replica does, the channel
        is dropped and `run` registers there with a claim."""
        while True:
            match self.member.watch(time.monotonic()):
                case Expired():
                    channel.close("no request from the coordinator within the session timeout")
                    return "session timeout", None
                case Probe(within_s=within, then_wait_s=then_wait):
                    try:  # not past the lease, however many addresses keep us waiting
                        moved = await asyncio.wait_for(self._served_elsewhere(), within)
                    except TimeoutError:
                        continue
                    if moved:
                        channel.close("the group is served by another coordinator now")
                        return "the group moved to another coordinator", None
                    wait = then_wait
                case step:
                    wait = step.seconds
            try:
                reason = await asyncio.wait_for(channel.wait_closed(), wait)
            except TimeoutError:
                continue
            error = channel.peer_error
            return reason, None if error is None else error.code

    async def _served_elsewhere(self) -> bool:
        """Ask the known addresses who serves the group: True when another coordinator
        does, or this one at a newer coordinator epoch. The silent one is asked last (its
        answer would only come after the probe's timeout)."""
        for host, port in self.member.probe_order(self.coordinators):
            try:
                meta = await self._ask_metadata(host, port, PROBE_TIMEOUT_S, check=False)
            except (OSError, ChannelClosed, RemoteError, TimeoutError, ConsumerError):
                continue
            if isinstance(meta, MetadataResponse):
                moved = self.member.moved(meta)
                if moved is not None:
                    return moved
        return False

    async def _ask_metadata(self, host: str, port: int, timeout: float, *, check: bool) -> Message:
        """Who serves our group, asked of `host:port` on a channel of its own. `check`: a
        close before the answer is examined for a TLS mismatch (`ConsumerError`)."""
        probe = await self._connect(host, port, f"{self.name}-probe")
        probe.start()
        try:
            return await probe.request(
                MetadataRequest(correlation_id=0, group=self.member.registration.group),
                timeout=timeout,
            )
        except ChannelClosed:
            if check:
                self._check_refusal(probe, host, port)
            raise
        finally:
            await probe.aclose()

    def _on_request(self, hooks: MemberHooks, channel: Channel, message: Message) -> None:
        match self.member.on_request(channel, message, time.monotonic()):
            case Hold() | Ignore():
                return
            case Refuse(error=error):
                channel.reply(message, error)
            case Unexpected(message=text):
                channel.fail(ErrorCode.UNEXPECTED_MESSAGE, text, message.correlation_id)
            case Apply():
                self._apply(hooks, channel, message)

    def _apply(self, hooks: MemberHooks, channel: Channel, message: Message) -> None:
        match message:
            case PingRequest():
                channel.reply(message, ping_response(message, hooks.ping_reply()))
            case StartFetcherRequest():
                if message.transitions or message.dropped:
                    hooks.topics_changed(topics_change(message))
                hooks.start_fetcher(
                    ranges_from_wire(message.ranges), positions_from_wire(message.positions)
                )
                channel.reply(message, start_response(message))
            case StopFetcherRequest():
                drained = hooks.stop_fetcher(ranges_from_wire(message.ranges))
                task = asyncio.create_task(self._finish_stop(channel, message, drained))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _finish_stop(
        self, channel: Channel, request: StopFetcherRequest, drained: Awaitable[PositionUpdate]
    ) -> None:
        final = await drained
        self.member.released(final)  # until a coordinator is known to have them
        channel.reply(request, stop_response(request, final))
