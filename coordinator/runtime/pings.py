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

from keyshard.coordinator.group import growth
from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.judges import ping_judge
from keyshard.coordinator.runtime.report_order import Judge
from keyshard.coordinator.runtime.sender import reply_timeout
from keyshard.coordinator.runtime.timers import Clock
from keyshard.coordinator.runtime.verdicts import PendingReplies
from keyshard.core.protocol.channel import Channel, ChannelClosed, RemoteError
from keyshard.core.protocol.messages import ErrorCode, Message, PingRequest, PingResponse

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
        report: Callable[[str, str, Judge, Callable[[Result | None], None]], None],
        contacted: Callable[[str, str], None],
        epoch_of: Callable[[str], int],
        hint: Callable[[], None] | None = None,
    ) -> None:
        self._groups = groups
        self._replies = replies
        self._activity = activity
        self._clock = clock
        self._report = report  # judged in order, checked first (ReportJudge.submit)
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
                    self._answered(group, member_id, channel, reply, sent)
            except (TimeoutError, RemoteError) as err:
                log.info("ping of %s failed: %s", member_id, err)
                continue
            except ChannelClosed:
                return

    def _answered(
        self,
        group: str,
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
        state = self._groups.get(group)
        reported = [(h.topic, h.partition) for h in reply.high_watermarks]
        reported += [(f.topic, f.partition) for f in reply.fetched]
        if self._hint and state is not None and growth.unknown_partitions(state, reported):
            self._hint()

        def judged(result: Result | None) -> None:
            error = None if result is None else result.error
            if error is not None and error[0] != ErrorCode.STALE_EPOCH:
                log.info("ping reply of %s rejected: %s", member_id, error[1])

        judge = ping_judge(self._groups, group, member_id, reply, self._clock())
        self._report(group, member_id, judge, judged)
