"""StopFetcher and StartFetcher to one member, in the order they were decided.

A StopFetcher overtaking an earlier StartFetcher to the same member would start slots
already handed on, so every request to a member waits for the ones decided before it
(one lock per member). A StartFetcher also waits until the positions it carries and the
grant itself are in the state log: a range always starts from a stored position, and a
replica taking the group over knows the grant, even if this one dies right after; a
write refused because the partition was taken over sends nothing, one Kafka could not
take yet is tried again. Every request carries the
coordinator epoch of the group's state partition, so a consumer can refuse a fenced
replica's. The replies go back through the runtime's apply path as handler results.

A request belongs to the group state that decided it. When the replica lets the group's
partition go while the request waits (for its write, for an earlier request, for its
reply), that state is gone for good: if the partition comes back, the group served by the
same name is a new state, adopted from the log, with its own pending claims, and nothing
decided by the old one is sent for it or applied to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from keyshard.coordinator.group import handlers
from keyshard.coordinator.group.effects import Result, SendStart, SendStop
from keyshard.coordinator.group.records import MemberHeard
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.durability import NotOwned, StateWriter
from keyshard.coordinator.runtime.judges import stop_judge
from keyshard.coordinator.runtime.report_order import Judge
from keyshard.coordinator.runtime.timers import Clock
from keyshard.coordinator.runtime.verdicts import MemberKey, PendingReplies
from keyshard.coordinator.storage.base import Fenced
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.channel import Channel, ChannelClosed, RemoteError
from keyshard.core.protocol.messages import (
    ErrorCode,
    Message,
    PartitionRef,
    PartitionTransition,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from keyshard.core.protocol.wire import positions_to_wire, ranges_to_wire

log = logging.getLogger(__name__)
STORE_RETRY_S = 0.5  # between two tries to store a grant Kafka could not take


def transitions_to_wire(state: GroupState) -> list[PartitionTransition]:
    return [
        PartitionTransition(topic=t.topic, counts=list(t.counts), until_ms=t.until_ms)
        for t in sorted(state.transitions.values())
    ]


def reply_timeout(session_timeout_ms: int) -> float:
    """How long to wait for a reply before dropping it: a safety net only. The session
    timer judges silence, after reading what already arrived; a reply timeout as short
    as the session would drop a reply that sat unread on a busy coordinator, and the
    member would then be judged silent."""
    return 2 * session_timeout_ms / 1000


class OrderedSender:
    def __init__(
        self,
        *,
        groups: Mapping[str, GroupState],
        channels: Mapping[MemberKey, Channel],
        writer: StateWriter,
        replies: PendingReplies,
        activity: Activity,
        clock: Clock,
        run: Callable[[str, Result], None],
        report: Callable[[str, str, Judge], None],
        contacted: Callable[[str, str], None],
        epoch_of: Callable[[str], int],
        write_failed: Callable[[str, BaseException], None],
    ) -> None:
        self._groups = groups
        self._channels = channels
        self._writer = writer
        self._replies = replies
        self._activity = activity
        self._clock = clock
        self._run = run  # the runtime's apply path: replay, reconcile, effects
        self._report = report  # a report with numbers to check first (ReportJudge.submit)
        self._contacted = contacted  # records that we are sending the member a request
        self._epoch_of = epoch_of  # the group's coordinator epoch
        self._write_failed = write_failed  # the state log refused a write (fenced)
        self._locks: dict[MemberKey, asyncio.Lock] = {}

    def forget(self, group: str, member_id: str) -> None:
        """The member's channel is gone: nothing more will be sent to it."""
        self._locks.pop((group, member_id), None)

    async def send_stop(
        self, group: str, state: GroupState, effect: SendStop, decided: float
    ) -> None:
        request = StopFetcherRequest(
            correlation_id=0, member_epoch=effect.epoch, ranges=ranges_to_wire(effect.ranges),
            coordinator_epoch=self._epoch_of(group),
        )  # fmt: skip
        # No timeout on the reply: the drain deadline timer fences a member that never answers.
        reply = await self._send_in_order(
            group, state, effect.member_id, request, decided=decided, bounded=False,
            stops=effect.ranges,
        )  # fmt: skip
        if reply is None or self._groups.get(group) is not state:
            return
        if not isinstance(reply, StopFetcherResponse):
            self._fail_member(group, effect.member_id, reply)
            return
        judge = stop_judge(
            self._groups, group, effect.member_id, effect.ranges, reply, self._clock()
        )
        self._report(group, effect.member_id, judge)

    async def send_start(
        self, group: str, state: GroupState, effect: SendStart, decided: float
    ) -> None:
        request = StartFetcherRequest(
            correlation_id=0,
            member_epoch=effect.epoch,
            ranges=ranges_to_wire(effect.ranges),
            positions=positions_to_wire(effect.positions),
            coordinator_epoch=self._epoch_of(group),
            dropped=[PartitionRef(topic=t, partition=p) for t, p in effect.dropped],
        )
        reply = await self._send_in_order(
            group, state, effect.member_id, request, decided=decided, durable=True
        )
        if reply is None or self._groups.get(group) is not state:
            return
        if not isinstance(reply, StartFetcherResponse):
            self._fail_member(group, effect.member_id, reply)
            return
        if effect.extends:  # not a grant: nothing to acknowledge, only a sign of life
            if effect.member_id in state.members:
                self._run(group, Result(records=[MemberHeard(effect.member_id, self._clock())]))
            return
        self._run(
            group,
            handlers.start_completed(
                state, member_id=effect.member_id, ranges=effect.ranges, now=self._clock()
            ),
        )

    async def _send_in_order(
        self,
        group: str,
        state: GroupState,
        member_id: str,
        request: StopFetcherRequest | StartFetcherRequest,
        *,
        decided: float,
        durable: bool = False,
        bounded: bool = True,
        stops: RangeSet | None = None,
    ) -> Message | None:
        """Write `request` after every request decided before it, then await the reply.

        With `durable`, first the group as of now (this grant and the positions where the
        previous owners stopped) is stored. A bounded request waits for its reply at most
        `reply_timeout`. None: the member is gone, the write failed, or `state` (the
        group that decided the request) was let go of meanwhile.
        """
        lock = self._locks.setdefault((group, member_id), asyncio.Lock())
        async with lock:
            if durable and not await self._stored(group, state):
                return None
            if self._groups.get(group) is not state:
                return None
            channel = self._channels.get((group, member_id))
            member = state.members.get(member_id)
            if channel is None or member is None or channel.is_closed:
                return None
            if isinstance(request, StartFetcherRequest):
                # The transitions as of the send, not the decision: a grant must never
                # leave without one that started meanwhile.
                request = request.model_copy(update={"transitions": transitions_to_wire(state)})
            self._contacted(group, member_id)
            future = channel.submit(request)
            written = time.perf_counter()
            self._activity.timed(f"{request.type[:-8]} queued", written - decided)
            if stops is not None:
                self._run(
                    group,
                    handlers.stop_written(
                        state, member_id=member_id, ranges=stops, now=self._clock()
                    ),
                )
        timeout = reply_timeout(member.session_timeout_ms) if bounded else None
        # Until the caller has handled the reply (synchronously after this returns), a
        # timer verdict on this member waits for it (coordinator.runtime.verdicts).
        with self._replies.awaiting(group, member_id, future):
            try:
                reply = await channel.response(future, timeout=timeout)
            except (ChannelClosed, RemoteError, TimeoutError) as err:
                log.info("%s to %s failed: %s", request.type, member_id, err)
                return None
            self._activity.timed(f"{request.type[:-8]} round trip", time.perf_counter() - written)
            return reply

    async def _stored(self, group: str, state: GroupState) -> bool:
        """Store the group before a grant leaves. A write Kafka could not take (the state
        partition had no leader for a while: a broker went away) is tried again while the
        group is served here, so the grant waits for durability instead of being dropped.
        False: fenced, or `state` was let go of (the writer's NotOwned): nothing is sent."""
        while True:
            if self._groups.get(group) is not state:
                return False
            try:
                await self._writer.flush(group)
                return True
            except (Fenced, NotOwned) as err:
                self._write_failed(group, err)
                return False
            except Exception as err:
                if self._groups.get(group) is not state:
                    return False
                log.warning("group %s: storing a grant failed, trying again: %s", group, err)
                await asyncio.sleep(STORE_RETRY_S)

    def _fail_member(self, group: str, member_id: str, reply: Message) -> None:
        channel = self._channels.get((group, member_id))
        if channel is not None:
            channel.fail(ErrorCode.UNEXPECTED_MESSAGE, f"unexpected reply {reply.type}")
