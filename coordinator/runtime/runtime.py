"""The coordinator's I/O shell around the pure group handlers.

Every event (a Register, a reply, a closed channel, a timer) becomes one handler call; the
returned records are replayed into the group state, then `reconcile` runs and its records
and effects are applied the same way. Effects are the only place this module talks to the
outside: requests to members, closing channels, timers and the state store. Positions are
made durable before any StartFetcher leaves, so a range always starts from a stored
position even if this process dies right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import random
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from coordinator.group import handlers
from coordinator.group.effects import (
    BALANCE_KEY,
    GRACE_KEY,
    CancelTimer,
    CloseMember,
    Result,
    SendStart,
    SendStop,
    SetTimer,
)
from coordinator.group.load import BucketLoad
from coordinator.group.records import (
    DrainStarted,
    GrantsDeferred,
    MemberContacted,
    MemberHeard,
    MemberRemoved,
    PositionsAdvanced,
    PositionsLoaded,
    RebalanceRequested,
    TargetComputed,
)
from coordinator.group.replay import replay
from coordinator.group.state import GroupState
from coordinator.model.ranges import RangeSet
from coordinator.protocol.channel import Channel, ChannelClosed, RemoteError
from coordinator.protocol.messages import (
    ErrorCode,
    Message,
    PingRequest,
    PingResponse,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from coordinator.protocol.wire import (
    positions_from_wire,
    positions_to_wire,
    ranges_from_wire,
    ranges_to_wire,
)
from coordinator.runtime.activity import Activity, report_loop, watch_loop
from coordinator.runtime.durability import PositionWriter
from coordinator.runtime.metadata import CoalescedPartitionCounts
from coordinator.runtime.recompute import TargetRecomputer
from coordinator.runtime.settings import RuntimeSettings
from coordinator.runtime.timers import AsyncioTimers, Clock, Timers
from coordinator.runtime.verdicts import PendingReplies, settled
from coordinator.storage.base import ClusterMetadata, StateStore
from coordinator.strategies.registry import strategy_named

log = logging.getLogger(__name__)
PING_TICK_S = 0.1
PROGRESS_RECORDS = (MemberHeard, MemberContacted, PositionsAdvanced, DrainStarted)


class CoordinatorError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class CoordinatorRuntime:
    def __init__(
        self,
        settings: RuntimeSettings,
        store: StateStore,
        *,
        metadata: ClusterMetadata,
        clock: Clock = time.monotonic,
        timers: Timers | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.timers: Timers = timers or AsyncioTimers(clock)
        self.groups: dict[str, GroupState] = {}
        self.channels: dict[tuple[str, str], Channel] = {}
        self.ready = False
        self.started_at = clock()
        self._tasks: set[asyncio.Task[Any]] = set()
        # Requests to one member must leave in the order they were decided: a StopFetcher
        # overtaking an earlier StartFetcher would start slots already handed on.
        self._send_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._grants_allowed_at = 0.0
        self.metadata = metadata
        self._partition_counts = CoalescedPartitionCounts(metadata)
        self.activity = Activity()
        self.writer = PositionWriter(store, self.groups, self.activity, self._spawn)
        self._recomputer = TargetRecomputer(
            self._adopt_target,
            self.activity,
            clock,
            quiet_s=settings.recompute_quiet_ms / 1000,
            max_defer_s=settings.recompute_max_defer_ms / 1000,
        )
        self._replies = PendingReplies()

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        await self.store.start()
        loaded = await self.store.load()
        self._grants_allowed_at = self.clock() + self.settings.startup_grace_ms / 1000
        for group, positions in loaded.items():
            state = self._group(group)
            for tp, pmap in positions.items():
                replay(state, PositionsLoaded(tp, pmap))
            self.writer.durable(group, state.positions_version)
        log.info("state loaded: %d group(s) from %s", len(loaded), self.settings.state_topic)
        self.ready = True
        self._spawn(self.writer.run(self.settings.flush_interval_ms / 1000), "flush-loop")
        self._spawn(watch_loop(self.activity), "loop-lag")
        self._spawn(report_loop(self.activity, self._gauges), "activity-report")

    async def stop(self) -> None:
        self.ready = False
        self._recomputer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in list(self.channels.values()):
            channel.close("coordinator shutting down")
        self.timers.cancel_all()
        with contextlib.suppress(Exception):
            await self.writer.flush_all()
        await self.store.stop()

    # ---- events from channels -----------------------------------------------------

    async def register(self, channel: Channel, request: RegisterRequest) -> RegisterResponse:
        """Validate a Register, admit the member and start pinging it."""
        if not self.ready:
            raise CoordinatorError(ErrorCode.NOT_COORDINATOR, "coordinator is still starting")
        expected = self.settings.auth_token
        if expected is not None and not hmac.compare_digest(
            (request.auth_token or "").encode(), expected.encode()
        ):
            raise CoordinatorError(ErrorCode.AUTHENTICATION_FAILED, "invalid or missing auth token")
        topics = tuple(request.topics)
        counts = await self._partition_counts.get(topics)
        missing = [t for t in topics if t not in counts]
        if missing:
            raise CoordinatorError(
                ErrorCode.UNKNOWN_TOPIC,
                f"topic(s) {missing} do not exist on {self.settings.bootstrap_servers}",
            )
        partitions = tuple((t, p) for t in sorted(topics) for p in range(counts[t]))
        state = self._group(request.group)
        member_id = f"{request.consumer_name}-{uuid.uuid4().hex[:8]}"
        result = handlers.register(
            state,
            member_id=member_id,
            name=request.consumer_name,
            capacity=request.capacity,
            session_timeout_ms=request.session_timeout_ms,
            topics=topics,
            partitions=partitions,
            now=self.clock(),
            fixed_ranges=(
                None if request.fixed_ranges is None else ranges_from_wire(request.fixed_ranges)
            ),
            validate_ranges=strategy_named(state.config.assignor).validate_ranges,
        )
        if result.error is not None:
            raise CoordinatorError(*result.error)
        self.channels[(request.group, member_id)] = channel
        self._run(request.group, result)
        member = state.members[member_id]
        interval_ms = self._ping_interval_ms(state, member.session_timeout_ms)
        self._spawn(
            self._ping_loop(request.group, member_id, channel, interval_ms / 1000),
            f"ping-{member_id}",
        )
        self.activity.count("joined")
        log.info("member %s joined group %s (%s)", member_id, request.group, channel.peer)
        return RegisterResponse(
            correlation_id=0,
            member_id=member_id,
            member_epoch=member.epoch,
            ping_interval_ms=interval_ms,
            session_timeout_ms=member.session_timeout_ms,
        )

    def leave(self, group: str, member_id: str, positions: list[Any]) -> ErrorCode | None:
        state = self.groups.get(group)
        if state is None:
            return ErrorCode.UNKNOWN_GROUP
        result = handlers.leave(
            state, member_id=member_id, positions=positions_from_wire(positions), now=self.clock()
        )
        self.channels.pop((group, member_id), None)
        self._run(group, result)
        log.info("member %s left group %s", member_id, group)
        return result.error[0] if result.error else None

    def channel_closed(self, group: str, member_id: str, reason: str) -> None:
        self.channels.pop((group, member_id), None)
        self._send_locks.pop((group, member_id), None)
        state = self.groups.get(group)
        if state is None or member_id not in state.members:
            return
        log.warning("member %s of group %s lost: %s", member_id, group, reason)
        self._run(group, handlers.connection_lost(state, member_id=member_id, now=self.clock()))

    def fence(self, group: str, member_id: str, reason: str) -> bool:
        """Operator fence: like a drain timeout, the member is removed and its ranges move
        once it must have stopped."""
        state = self.groups.get(group)
        if state is None or member_id not in state.members:
            return False
        result = handlers.connection_lost(state, member_id=member_id, now=self.clock())
        result.effects.append(CloseMember(member_id, ErrorCode.FENCED_MEMBER, reason))
        self._run(group, result)
        return True

    # ---- the apply loop -----------------------------------------------------------

    def _group(self, group: str) -> GroupState:
        state = self.groups.get(group)
        if state is None:
            config = self.settings.config_for(group)
            state = self.groups[group] = GroupState(
                group, config, load=BucketLoad(config.load_half_life_ms / 1000)
            )
            # A new group has no positions: nothing to write before its first grants.
            self.writer.durable(group, state.positions_version)
            self.timers.set(
                f"{group}/{BALANCE_KEY}",
                self.clock() + config.balance_check_ms / 1000,
                self._on_timer,
            )
            if self._grants_allowed_at > self.clock():
                replay(state, GrantsDeferred(self._grants_allowed_at))
                self.timers.set(f"{group}/{GRACE_KEY}", self._grants_allowed_at, self._on_timer)
        return state

    def _run(self, group: str, result: Result) -> None:
        state = self.groups[group]
        self._apply(group, state, result)
        # Progress reports change no ownership; skipping reconcile for them keeps a ping
        # O(1) instead of O(members). (An empty result, e.g. the grace timer, reconciles.)
        if result.records and all(isinstance(r, PROGRESS_RECORDS) for r in result.records):
            return
        self._reconcile(group, state)

    def _reconcile(self, group: str, state: GroupState) -> None:
        """Reconcile now against the current target (cheap: it costs what changed); a
        stale target is recomputed later, off the loop (coordinator/recompute.py)."""
        assignor = strategy_named(state.config.assignor).assignor
        self._apply(
            group,
            state,
            handlers.reconcile(state, now=self.clock(), assignor=assignor, recompute=False),
        )
        # A group without members has nothing to recompute: scheduling it anyway would
        # spin the loop for a group replayed from the store.
        if state.members and state.target_version != state.inputs_version:
            self._recomputer.stale(group, state)

    def _adopt_target(self, group: str, state: GroupState, record: TargetComputed) -> None:
        if self.ready:
            self._apply(group, state, Result(records=[record]))
            self._reconcile(group, state)

    def _apply(self, group: str, state: GroupState, result: Result) -> None:
        for record in result.records:
            log.debug("%s: %s", group, record)
            replay(state, record)
            if isinstance(record, RebalanceRequested):
                log.info("group %s: rebalancing: %s", group, record.reason)
            elif isinstance(record, TargetComputed) and record.notes:
                log.warning("group %s: %s", group, "; ".join(record.notes))
        for effect in result.effects:
            match effect:
                case SendStop():
                    self.activity.count("stop decided")
                    self._spawn(
                        self._send_stop(group, effect, time.perf_counter()),
                        f"stop-{effect.member_id}",
                    )
                case SendStart():
                    self.activity.count("start decided")
                    self._spawn(
                        self._send_start(group, effect, time.perf_counter()),
                        f"start-{effect.member_id}",
                    )
                case CloseMember():
                    channel = self.channels.pop((group, effect.member_id), None)
                    if channel is not None:
                        log.warning("closing member %s: %s", effect.member_id, effect.message)
                        channel.fail(effect.code, effect.message)
                case SetTimer():
                    self.timers.set(f"{group}/{effect.key}", effect.at, self._on_timer)
                case CancelTimer():
                    self.timers.cancel(f"{group}/{effect.key}")

    def _on_timer(self, full_key: str) -> None:
        group, _, key = full_key.partition("/")
        state = self.groups.get(group)
        if state is None:
            return
        if key == BALANCE_KEY:
            imbalance = strategy_named(state.config.assignor).imbalance
            self._run(group, handlers.balance_check(state, now=self.clock(), imbalance=imbalance))
        else:
            result = handlers.timer_fired(state, key=key, now=self.clock())
            member_id = key.partition(":")[2]
            channel = self.channels.get((group, member_id))
            if not any(isinstance(r, MemberRemoved) for r in result.records):
                self._run(group, result)
            elif channel is None or channel.is_closed:
                self._expired(group, key, result)
            else:
                self._spawn(self._judge_after_input(group, key, channel), f"judge-{key}")

    async def _judge_after_input(self, group: str, key: str, channel: Channel) -> None:
        """Decide an expired session or drain deadline only after reading what the member
        already sent.

        A timer fires on the coordinator's clock; when the loop is behind, the reply that
        answers it may be sitting unread in the socket, or read and not yet handled.
        Fencing then would punish the member for our lag (and an overloaded coordinator
        would fence hundreds at once, each one more work). So: read and handle everything
        received so far, then judge again with what is known. Bounded by the session
        timeout, so a member that keeps talking without answering is still judged.
        """
        member_id = key.partition(":")[2]
        state = self.groups.get(group)
        member = state.members.get(member_id) if state else None
        if state is None or member is None:
            return
        await settled(channel, self._replies, group, member_id, member.session_timeout_ms / 1000)
        if self.groups.get(group) is not state:
            return
        result = handlers.timer_fired(state, key=key, now=self.clock())
        if any(isinstance(r, MemberRemoved) for r in result.records):
            self._expired(group, key, result)
        else:
            self.activity.count("verdict spared")
            self._run(group, result)

    def _expired(self, group: str, key: str, result: Result) -> None:
        self.activity.count(f"{key.partition(':')[0]} expired")
        self._run(group, result)

    # ---- effects ------------------------------------------------------------------

    async def _send_stop(self, group: str, effect: SendStop, decided: float) -> None:
        request = StopFetcherRequest(
            correlation_id=0, member_epoch=effect.epoch, ranges=ranges_to_wire(effect.ranges)
        )
        # No timeout on the reply: the drain deadline timer fences a member that never answers.
        reply = await self._send_in_order(
            group, effect.member_id, request, decided=decided, bounded=False, stops=effect.ranges
        )
        if reply is None:
            return
        if not isinstance(reply, StopFetcherResponse):
            self._fail_member(group, effect.member_id, reply)
            return
        state = self.groups[group]
        self._run(
            group,
            handlers.stop_completed(
                state,
                member_id=effect.member_id,
                ranges=effect.ranges,
                positions=positions_from_wire(reply.positions),
                now=self.clock(),
            ),
        )

    async def _send_start(self, group: str, effect: SendStart, decided: float) -> None:
        request = StartFetcherRequest(
            correlation_id=0,
            member_epoch=effect.epoch,
            ranges=ranges_to_wire(effect.ranges),
            positions=positions_to_wire(effect.positions),
        )
        reply = await self._send_in_order(
            group, effect.member_id, request, decided=decided, durable=effect.durable_version
        )
        if reply is None:
            return
        if not isinstance(reply, StartFetcherResponse):
            self._fail_member(group, effect.member_id, reply)
            return
        state = self.groups[group]
        self._run(
            group,
            handlers.start_completed(
                state, member_id=effect.member_id, ranges=effect.ranges, now=self.clock()
            ),
        )

    async def _send_in_order(
        self,
        group: str,
        member_id: str,
        request: StopFetcherRequest | StartFetcherRequest,
        *,
        decided: float,
        durable: int | None = None,
        bounded: bool = True,
        stops: RangeSet | None = None,
    ) -> Message | None:
        """Write `request` after every request decided before it, then await the reply.

        A StartFetcher first waits until positions up to `durable` (where the previous
        owners stopped) are stored, so a range always starts from a stored position even
        if this process dies right after. A bounded request waits for its reply at most
        a session timeout. None: the member is gone.
        """
        lock = self._send_locks.setdefault((group, member_id), asyncio.Lock())
        async with lock:
            if durable is not None:
                await self.writer.flush(group, durable)
            channel = self.channels.get((group, member_id))
            member = self.groups[group].members.get(member_id)
            if channel is None or member is None or channel.is_closed:
                return None
            self._contacted(group, member_id)
            future = channel.submit(request)
            written = time.perf_counter()
            self.activity.timed(f"{request.type[:-8]} queued", written - decided)
            if stops is not None:
                state = self.groups[group]
                self._run(
                    group,
                    handlers.stop_written(
                        state, member_id=member_id, ranges=stops, now=self.clock()
                    ),
                )
        timeout = _reply_timeout(member.session_timeout_ms) if bounded else None
        # Until the caller has handled the reply (synchronously after this returns), a
        # timer verdict on this member waits for it (see `_judge_after_input`).
        with self._replies.awaiting(group, member_id, future):
            try:
                reply = await channel.response(future, timeout=timeout)
            except (ChannelClosed, RemoteError, TimeoutError) as err:
                log.info("%s to %s failed: %s", request.type, member_id, err)
                return None
            self.activity.timed(f"{request.type[:-8]} round trip", time.perf_counter() - written)
            return reply

    def _fail_member(self, group: str, member_id: str, reply: Message) -> None:
        channel = self.channels.get((group, member_id))
        if channel is not None:
            channel.fail(ErrorCode.UNEXPECTED_MESSAGE, f"unexpected reply {reply.type}")

    async def _ping_loop(
        self, group: str, member_id: str, channel: Channel, interval: float
    ) -> None:
        # A random phase: members that registered together (a join storm, everyone
        # reconnecting after a restart) would otherwise be pinged together forever, and
        # every interval the loop would stall for a whole group's worth of replies. Not
        # sooner than half an interval: pings in the middle of the storm only add to it.
        # Sent on ticks (a twentieth of the interval, at most 100 ms), so each loop turn
        # still serves a batch: one ping per turn doubled the CPU of steady pings.
        delay = random.uniform(0.5 * interval, 1.5 * interval)
        tick = min(PING_TICK_S, interval / 20)
        loop = asyncio.get_running_loop()
        while not channel.is_closed:
            now = loop.time()
            await asyncio.sleep(math.ceil((now + delay) / tick) * tick - now)
            delay = interval
            state = self.groups.get(group)
            member = state.members.get(member_id) if state else None
            if state is None or member is None:
                return
            self._contacted(group, member_id)
            sent = time.perf_counter()
            try:
                future = channel.submit(PingRequest(correlation_id=0, member_epoch=member.epoch))
                with self._replies.awaiting(group, member_id, future):
                    reply = await channel.response(
                        future, timeout=_reply_timeout(member.session_timeout_ms)
                    )
                    self._ping_answered(group, state, member_id, channel, reply, sent)
            except (TimeoutError, RemoteError) as err:
                log.info("ping of %s failed: %s", member_id, err)
                continue
            except ChannelClosed:
                return

    def _ping_answered(
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
        self.activity.timed("ping round trip", time.perf_counter() - sent)
        result = handlers.ping_answered(
            state,
            member_id=member_id,
            epoch=reply.member_epoch,
            positions=positions_from_wire(reply.positions),
            load=sorted(reply.load.items()),
            now=self.clock(),
            high_watermarks=[((h.topic, h.partition), h.offset) for h in reply.high_watermarks],
        )
        if result.error is not None and result.error[0] != ErrorCode.STALE_EPOCH:
            log.info("ping reply of %s rejected: %s", member_id, result.error[1])
        self._run(group, result)

    def _contacted(self, group: str, member_id: str) -> None:
        state = self.groups[group]
        self._apply(group, state, handlers.contacted(state, member_id=member_id, now=self.clock()))

    def _ping_interval_ms(self, state: GroupState, session_timeout_ms: int) -> int:
        return state.config.ping_interval_ms or max(100, session_timeout_ms // 3)

    def _gauges(self) -> dict[str, int]:
        members = [m for s in self.groups.values() for m in s.members.values()]
        return {
            "members": len(members),
            "waiting for flush": self.writer.waiting,
            "draining": sum(1 for m in members if m.draining),
            "starting": sum(1 for m in members if m.starting),
        }

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())


def _reply_timeout(session_timeout_ms: int) -> float:
    """How long to wait for a reply before dropping it: a safety net only. The session
    timer judges silence, after reading what already arrived; a reply timeout as short
    as the session would drop a reply that sat unread on a busy coordinator, and the
    member would then be judged silent."""
    return 2 * session_timeout_ms / 1000
