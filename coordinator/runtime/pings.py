"""Pinging registered members: the coordinator's half of liveness.

Each member gets one loop on its channel, at the interval its Register answer named. A
reply carries the member's positions, load and high watermarks and goes through the
runtime's apply path like any other handler result; a silent member is not judged here
but by its session timer, which reads what already arrived first.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Mapping

from keyshard.coordinator.group import growth, handlers
from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.sender import reply_timeout
from keyshard.coordinator.runtime.timers import Clock
from keyshard.coordinator.runtime.verdicts import PendingReplies
from keyshard.core.protocol.channel import Channel, ChannelClosed, RemoteError
from keyshard.core.protocol.messages import ErrorCode, Message, PingRequest, PingResponse
from keyshard.core.protocol.wire import positions_from_wire

log = logging.getLogger(__name__)
PING_TICK_S = 0.1
# A member of a small group is first pinged about this soon after it registers: its first
# reply carries the demand its first fetches saw (a backlog's key distribution), which the
# balance check needs before the backlog drains unevenly. A large group keeps the spread
# over a whole interval (pinging a join storm in its middle only adds to it).
FIRST_PING_S = 1.0
SMALL_GROUP = 64


def ping_interval_ms(state: GroupState, session_timeout_ms: int) -> int:
    return state.config.ping_interval_ms or max(100, session_timeout_ms // 3)


class Pinger:
    def __init__(
        self,
        *,
        groups: Mapping[str, GroupState],
        replies: PendingReplies,
        activity: Activity,
        clock: Clock,
        run: Callable[[str, Result], None],
        contacted: Callable[[str, str], None],
        epoch_of: Callable[[str], int],
        hint: Callable[[], None] | None = None,
    ) -> None:
        self._groups = groups
        self._replies = replies
        self._activity = activity
        self._clock = clock
        self._run = run  # the runtime's apply path: replay, reconcile, effects
        self._contacted = contacted  # records that we are sending the member a request
        self._epoch_of = epoch_of  # the group's coordinator epoch
        # A member reported a partition its group does not know: the topic may have grown.
        self._hint = hint

    async def loop(self, group: str, member_id: str, channel: Channel, interval: float) -> None:
        """Ping until the channel closes or the member is gone."""
        # A random phase: members that registered together (a join storm, everyone
        # reconnecting after a restart) would otherwise be pinged together forever, and
        # every interval the loop would stall for a whole group's worth of replies. Not
        # sooner than half an interval: pings in the middle of the storm only add to it.
        # Sent on ticks (a twentieth of the interval, at most 100 ms), so each loop turn
        # still serves a batch: one ping per turn costs twice the CPU for steady pings.
        joined = self._groups.get(group)
        small = joined is not None and len(joined.members) <= SMALL_GROUP
        first = min(interval, FIRST_PING_S) if small else interval
        delay = random.uniform(0.5 * first, 1.5 * first)
        tick = min(PING_TICK_S, interval / 20)
        loop = asyncio.get_running_loop()
        while not channel.is_closed:
            now = loop.time()
            await asyncio.sleep(math.ceil((now + delay) / tick) * tick - now)
            delay = interval
            state = self._groups.get(group)
            member = state.members.get(member_id) if state else None
            if state is None or member is None:
                return
            self._contacted(group, member_id)
            sent = time.perf_counter()
            try:
                future = channel.submit(
                    PingRequest(
                        correlation_id=0,
                        member_epoch=member.epoch,
                        coordinator_epoch=self._epoch_of(group),
                    )
                )
                with self._replies.awaiting(group, member_id, future):
                    reply = await channel.response(
                        future, timeout=reply_timeout(member.session_timeout_ms)
                    )
                    self._answered(group, state, member_id, channel, reply, sent)
            except (TimeoutError, RemoteError) as err:
                log.info("ping of %s failed: %s", member_id, err)
                continue
            except ChannelClosed:
                return

    def _answered(
        self,
        group: str,
        state: GroupState,
        member_id: str,
        channel: Channel,
        reply: Message,
        sent: float,
    ) -> None:
        if not isinstance(reply, PingResponse):
            channel.fail(
                ErrorCode.UNEXPECTED_MESSAGE, f"expected a ping_response, got {reply.type}"
            )
            return
        self._activity.timed("ping round trip", time.perf_counter() - sent)
        reported = [(h.topic, h.partition) for h in reply.high_watermarks]
        reported += [(f.topic, f.partition) for f in reply.fetched]
        if self._hint is not None and growth.unknown_partitions(state, reported):
            self._hint()
        result = handlers.ping_answered(
            state,
            member_id=member_id,
            epoch=reply.member_epoch,
            positions=positions_from_wire(reply.positions),
            load=sorted(reply.load.items()),
            now=self._clock(),
            high_watermarks=[
                ((h.topic, h.partition), h.offset, h.stable) for h in reply.high_watermarks
            ],
            fetched=[
                ((f.topic, f.partition), f.start, f.end, tuple(sorted(f.buckets.items())))
                for f in reply.fetched
            ],
            busy=None if reply.busy_ms is None else (reply.busy_records, reply.busy_ms),
        )
        if result.error is not None and result.error[0] != ErrorCode.STALE_EPOCH:
            log.info("ping reply of %s rejected: %s", member_id, result.error[1])
        self._run(group, result)
