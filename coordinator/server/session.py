"""One consumer connection: what it may send, in which order, and what ends it.

A connection may ask Metadata any time, must Register before anything else, and ends
with a Leave or by closing. Every bad input is answered with an ErrorResponse naming the
problem, then the connection is closed; nothing else in the group is disturbed. Until
its Register succeeds the channel holds the connection to what the listener allows an
unauthenticated peer (`coordinator.server.preauth`); after, to the normal frame limit.
"""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum
from typing import Any

from keyshard.coordinator.runtime.errors import CoordinatorError
from keyshard.coordinator.runtime.location import Replicas
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.server.admission import (
    DEFAULT_MAX_PENDING_REGISTERS,
    PendingRegisters,
)
from keyshard.coordinator.server.authentication import Authentication, AuthenticationFailed
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.messages import (
    ErrorCode,
    LeaveRequest,
    LeaveResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    RegisterRequest,
)
from keyshard.core.security.log_safety import ThrottledLog

log = logging.getLogger(__name__)


class ConnectionState(StrEnum):
    """Where one consumer connection stands; each request is checked against it."""

    OPEN = "open"  # may ask Metadata; must Register before anything else
    REGISTERING = "registering"  # a Register is being validated
    REGISTERED = "registered"  # a member of `group`: pinged, may Leave
    LEFT = "left"  # it sent Leave: its member is gone
    CLOSED = "closed"


class MemberSession:
    def __init__(
        self,
        runtime: CoordinatorRuntime,
        channel: Channel,
        replicas: Replicas,
        refusals: ThrottledLog | None = None,
        authentication: Authentication | None = None,
        registers: PendingRegisters | None = None,
    ) -> None:
        self.runtime = runtime
        # Registers in flight at the whole listener (`admission`): over its bounds, one
        # is told to come back (TOO_MANY_CONNECTIONS) rather than queued.
        self.registers = registers or PendingRegisters(DEFAULT_MAX_PENDING_REGISTERS)
        self.authentication = authentication or Authentication()
        self.replicas = replicas
        self.channel = channel
        # Refused Registers, a line per peer per interval (a flood of wrong tokens, or a
        # fleet asking the wrong replica in a failover, is counted, not logged each).
        self._refusals = refusals or ThrottledLog(log, "Register refusals", burst=5, per_peer=1)
        self.state = ConnectionState.OPEN
        self.group: str | None = None
        self.member_id: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def on_request(self, channel: Channel, message: Message) -> None:
        match message:
            case MetadataRequest():
                channel.reply(message, self._metadata(message.group))
            case RegisterRequest():
                if self.state is not ConnectionState.OPEN:
                    channel.fail(
                        ErrorCode.UNEXPECTED_MESSAGE,
                        "this connection is already registered; open a new one to register again",
                        message.correlation_id,
                    )
                    return
                now = asyncio.get_running_loop().time()
                refused = self.registers.refusal(now)
                if refused is not None:
                    self.runtime.activity.count("registers refused (busy)")
                    self._refusals.from_peer(
                        channel.peer_host, "register from %s refused: %s", channel.peer, refused
                    )
                    channel.fail(ErrorCode.TOO_MANY_CONNECTIONS, refused)
                    return
                self.state = ConnectionState.REGISTERING
                ticket = self.registers.enter(now)
                task = asyncio.create_task(self._register(message))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                task.add_done_callback(lambda _: self.registers.leave(ticket))
            case LeaveRequest():
                if (
                    self.state is not ConnectionState.REGISTERED
                    or self.group is None
                    or message.member_id != self.member_id
                ):
                    channel.fail(
                        ErrorCode.UNKNOWN_MEMBER,
                        f"member {message.member_id!r} is not registered on this connection",
                        message.correlation_id,
                    )
                    return
                self.state = ConnectionState.LEFT
                task = asyncio.create_task(self._leave(self.group, message))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            case _:
                channel.fail(
                    ErrorCode.UNEXPECTED_MESSAGE,
                    f"a consumer may not send {message.type}",
                    message.correlation_id,
                )

    async def _leave(self, group: str, message: LeaveRequest) -> None:
        """Answered once its final positions are judged (checked with Kafka if need be)."""
        error = await self.runtime.leave(group, message.member_id, message.positions)
        if error is None:
            self.channel.reply(message, LeaveResponse(correlation_id=0))
        else:
            self.channel.fail(
                error, f"leave of {message.member_id!r} failed", message.correlation_id
            )

    def _metadata(self, group: str | None) -> MetadataResponse:
        """Who serves `group`: the replica that owns its state partition (any replica can
        answer). Without a group, or while nobody serves it yet, this one (inactive in
        the latter case: ask again)."""
        config = self.runtime.config
        where = self.replicas.locate(group) if group is not None else None
        if where is None or where.replica_id is None or where.address is None:
            return MetadataResponse(
                correlation_id=0, coordinator_id=config.coordinator_id,
                coordinator=config.advertised_address,
                active=self.runtime.ready and where is None,
                coordinator_epoch=where.epoch if where is not None else 0,
            )  # fmt: skip
        return MetadataResponse(
            correlation_id=0, coordinator_id=where.replica_id, coordinator=where.address,
            active=where.active, coordinator_epoch=where.epoch,
        )  # fmt: skip

    async def _register(self, request: RegisterRequest) -> None:
        try:
            principal = await self.authentication.principal(
                request.auth_token, self.channel.peer_certificate()
            )
            response = await self.runtime.register(self.channel, request, principal)
        except AuthenticationFailed as err:
            self._refusals.from_peer(
                self.channel.peer_host, "register from %s refused: %s", self.channel.peer, err
            )
            self.channel.fail(ErrorCode.AUTHENTICATION_FAILED, str(err), request.correlation_id)
            return
        except CoordinatorError as err:
            self._refusals.from_peer(
                self.channel.peer_host, "register from %s refused: %s", self.channel.peer, err
            )
            self.channel.fail(err.code, err.message, request.correlation_id)
            return
        except Exception as err:
            log.exception("register from %s failed", self.channel.peer)
            self.channel.fail(ErrorCode.INTERNAL, f"register failed: {err}", request.correlation_id)
            return
        self.group, self.member_id = request.group, response.member_id
        if self.channel.is_closed:  # closed while we were validating
            self.state = ConnectionState.CLOSED
            self.runtime.channel_closed(self.group, self.member_id, "closed during register")
            return
        self.state = ConnectionState.REGISTERED
        self.channel.authenticated()
        self.channel.reply(request, response)

    def closed(self) -> None:
        """The channel is gone: a registered member is lost (not left)."""
        for task in self._tasks:
            task.cancel()
        if self.state is ConnectionState.REGISTERED:
            assert self.group is not None and self.member_id is not None
            reason = self.channel.close_reason or "closed"
            self.runtime.channel_closed(self.group, self.member_id, reason)
        log.debug("connection from %s closed (%s)", self.channel.peer, self.state)
        self.state = ConnectionState.CLOSED
