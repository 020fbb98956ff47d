"""The coordinator's I/O shell around the pure group handlers.

Every event (a Register, a reply, a closed channel, a timer) becomes one handler call; the
returned records are replayed into the group state, then `reconcile` runs and its records
and effects are applied the same way. Effects are the only place this module talks to the
outside: requests to members (`coordinator.runtime.sender`), closing channels, timers and
the state log. A group's positions and grants are made durable before any StartFetcher
leaves, so a range always starts from a stored position even if this process dies right
after, and a replica taking the group over knows who runs what.

Groups live in the state log's partitions, and this runtime serves the groups of the
partitions its replica owns (`adopt_partition` / `release_partition`, driven by
`coordinator.replication`), each under that partition's coordinator epoch. A member whose
coordinator went away re-registers with a claim and keeps its ranges (`handlers.reclaim`).

The admin side gets two public doors and nothing else: `group_states()` to read, and
`apply_records()` (used by `coordinator.runtime.operations`) to act, through the same
replay -> reconcile -> effects path as a consumer's request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from keyshard.coordinator.group import balance, growth, handlers, starting
from keyshard.coordinator.group.effects import (
    BalanceTimer,
    CancelTimer,
    CloseMember,
    DrainTimer,
    Result,
    SendStart,
    SendStop,
    SessionTimer,
    SetTimer,
    TimerKey,
)
from keyshard.coordinator.group.load import BucketLoad
from keyshard.coordinator.group.records import (
    DrainStarted,
    EndsObserved,
    MemberContacted,
    MemberHeard,
    PositionsAdvanced,
    RebalanceRequested,
    Record,
    TargetComputed,
)
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.state import GroupState, MemberPhase
from keyshard.coordinator.runtime.activity import Activity, report_loop, watch_loop
from keyshard.coordinator.runtime.authorization import DEFAULT_ACL_CACHE_MS, AllowAll, Authorizer
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.confirmed_ends import ConfirmedEnds
from keyshard.coordinator.runtime.durability import NotOwned, StateWriter
from keyshard.coordinator.runtime.errors import CoordinatorError
from keyshard.coordinator.runtime.judges import claim_judge, claim_owned_by, leave_judge
from keyshard.coordinator.runtime.partition_ends import (
    PartitionEndsUnknown,
    SharedPartitionEnds,
    describe,
)
from keyshard.coordinator.runtime.partition_watch import PartitionWatcher
from keyshard.coordinator.runtime.pings import Pinger, ping_interval_ms
from keyshard.coordinator.runtime.reauthorize import reauthorize_loop
from keyshard.coordinator.runtime.recompute import Pacing, TargetRecomputer
from keyshard.coordinator.runtime.register_gate import RegisterGate
from keyshard.coordinator.runtime.report_order import ReportJudge
from keyshard.coordinator.runtime.sender import OrderedSender
from keyshard.coordinator.runtime.takeover import takeover_result
from keyshard.coordinator.runtime.timers import AsyncioTimers, Clock, Timers
from keyshard.coordinator.runtime.verdicts import MemberKey, PendingReplies, TimerVerdicts
from keyshard.coordinator.storage.base import ClusterMetadata, Fenced, StateLog, partition_of
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.strategies.registry import strategy_named
from keyshard.core.protocol.channel import Channel
from keyshard.core.protocol.messages import (
    ErrorCode,
    PartitionPositions,
    RegisterRequest,
    RegisterResponse,
)
from keyshard.core.protocol.wire import ranges_from_wire, ranges_to_wire
from keyshard.core.security.identity import ANONYMOUS, Principal

log = logging.getLogger(__name__)
PROGRESS_RECORDS = (MemberHeard, MemberContacted, PositionsAdvanced, DrainStarted, EndsObserved)
# How long stopping waits for the last offset commits (tooling only) before closing.
COMMIT_ON_STOP_S = 5.0
TimerId = tuple[str, TimerKey]  # (group, key)


class CoordinatorRuntime:
    def __init__(
        self,
        config: RuntimeConfig,
        log: StateLog,
        *,
        metadata: ClusterMetadata,
        partitions: int = 1,
        clock: Clock = time.monotonic,
        timers: Timers[TimerId] | None = None,
        wall_clock: Callable[[], float] = time.time,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.config = config
        # Who may join which group (coordinator.runtime.authorization).
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.log = log
        self.metadata = metadata
        self.partitions = partitions  # of the state log: a group lives in partition_of()
        self.clock = clock
        self.wall_clock = wall_clock  # record timestamps are wall-clock ms (transitions)
        self.timers: Timers[TimerId] = timers or AsyncioTimers(clock)
        self.channels: dict[MemberKey, Channel] = {}
        self.ready = False
        self._groups: dict[str, GroupState] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # State partitions this replica owns -> their coordinator epoch, and their groups.
        self._epochs: dict[int, int] = {}
        self._partition_groups: dict[int, set[str]] = {}
        # Told when a write was refused because another replica took the partition over.
        self.on_fenced: Callable[[int], None] | None = None
        # Why this replica should not get traffic yet, beyond the runtime's own view (the
        # replication layer: not caught up on the state log), or None.
        self.not_ready: Callable[[], str | None] = lambda: None
        self._gate = RegisterGate(config, metadata, self._groups, self.authorizer)
        self._partition_ends = SharedPartitionEnds(metadata)
        self.activity = Activity()
        self.writer = StateWriter(
            log, metadata, self._groups, self.activity, self._spawn, self.owner_of,
            write_failed=self._write_failed,
        )  # fmt: skip
        pacing = Pacing(
            quiet_s=config.recompute_quiet_ms / 1000,
            max_defer_s=config.recompute_max_defer_ms / 1000,
            idle_quiet_s=config.recompute_idle_quiet_ms / 1000,
        )
        # Registers received and not answered yet (the listener counts them): joins on
        # their way, which a forming group's first target waits for.
        self.registers_in_flight: Callable[[], int] = lambda: 0
        self._recomputer = TargetRecomputer(
            self._adopt_target, self.activity, clock, pacing,
            arriving=lambda: self.registers_in_flight(),
        )  # fmt: skip
        self._replies = PendingReplies()
        # Partition ends from Kafka, and members' reports judged against them in order.
        self.ends = ConfirmedEnds(metadata)
        self.reports = ReportJudge(
            ends=self.ends, replies=self._replies, run=self._run, heard=self._heard,
            spawn=self._spawn,
        )  # fmt: skip
        self._sender = OrderedSender(
            groups=self._groups,
            channels=self.channels,
            writer=self.writer,
            replies=self._replies,
            activity=self.activity,
            clock=clock,
            run=self._run,
            report=self.reports.submit,
            contacted=self._contacted,
            epoch_of=self.epoch_of,
            write_failed=self._write_failed,
        )
        self._pinger = Pinger(
            groups=self._groups,
            replies=self._replies,
            activity=self.activity,
            clock=clock,
            report=self.reports.submit,
            contacted=self._contacted,
            epoch_of=self.epoch_of,
            hint=lambda: self.watcher.hint(),
        )
        self.watcher = PartitionWatcher(
            self._groups, metadata, self._run, self.owner_of, clock, wall_clock, config
        )
        self._verdicts = TimerVerdicts(
            groups=self._groups, channels=self.channels, replies=self._replies,
            activity=self.activity, clock=clock, run=self._run, spawn=self._spawn,
        )  # fmt: skip

    # ---- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Serve: groups arrive with the partitions this replica takes over."""
        self.ready = True
        self._spawn(self.writer.run(self.config.flush_interval_ms / 1000), "flush-loop")
        self._spawn(watch_loop(self.activity), "loop-lag")
        self._spawn(report_loop(self.activity, self._gauges), "activity-report")
        if self.config.metadata_refresh_ms > 0:
            self._spawn(self.watcher.run(), "partition-watch")
        if not isinstance(self.authorizer, AllowAll):
            interval = getattr(self.authorizer, "cache_s", DEFAULT_ACL_CACHE_MS / 1000)
            self._spawn(reauthorize_loop(self, interval), "reauthorize")

    async def stop(self) -> None:
        """Stop deciding, close the members' channels, store the last positions and let
        the offset commits that write set off land: in that order, so nothing is still
        using the log's or the cluster's clients when the daemon closes them."""
        self.ready = False
        self._recomputer.cancel()
        await self._cancel_tasks()
        for channel in list(self.channels.values()):
            channel.close("coordinator shutting down")
        self.timers.cancel_all()
        with contextlib.suppress(Exception):
            await self.writer.flush_all()
        if self._tasks:  # the low-watermark commits of that last write
            await asyncio.wait(list(self._tasks), timeout=COMMIT_ON_STOP_S)
        await self._cancel_tasks()

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- the admin side's doors -----------------------------------------------------

    def group_states(self) -> Mapping[str, GroupState]:
        """Every group's live state, read-only: views read it in place (same loop, no
        copies); changing it goes through `apply_records`."""
        return MappingProxyType(self._groups)

    def apply_records(
        self, group: str, records: Sequence[Record], *, reconcile: bool = True
    ) -> None:
        """An operator's action, as records, through the one apply path: replayed, then
        (unless `reconcile` is False: nothing that moves ownership) reconciled, and the
        effects carried out. So no operator action can bypass the handoff rules."""
        result = Result(records=list(records))
        if reconcile:
            self._run(group, result)
        else:
            self._apply(group, self._groups[group], result)

    # ---- state partitions: which groups are served here -----------------------------

    def owner_of(self, group: str) -> tuple[int, int] | None:
        """(state partition, coordinator epoch) of `group` if this replica serves it."""
        partition = partition_of(group, self.partitions)
        epoch = self._epochs.get(partition)
        return None if epoch is None else (partition, epoch)

    def epoch_of(self, group: str) -> int:
        owner = self.owner_of(group)
        return 0 if owner is None else owner[1]

    def owned_partitions(self) -> dict[int, int]:
        return dict(self._epochs)

    def groups_in(self, partition: int) -> list[str]:
        return sorted(self._partition_groups.get(partition, ()))

    def adopt_partition(self, partition: int, epoch: int, image: PartitionImage) -> None:
        """Serve the groups of `partition`, as the log has them (the replica claimed it at
        `epoch`): positions as stored, and members that owned ranges as pending claims,
        their ranges quarantined until each comes back or must have stopped."""
        self._epochs[partition] = epoch
        groups = self._partition_groups.setdefault(partition, set())
        now = self.clock()
        for group, group_image in image.groups().items():
            state = self._group(group)
            groups.add(group)
            margin = state.config.lost_member_margin_ms / 1000
            self._apply(group, state, takeover_result(group_image, now, margin))
            chunks = {tp: image.chunk_count(group, tp) for tp in group_image.positions}
            self.writer.adopted(group, state, set(group_image.members), chunks)
        log.info(
            "state partition %d taken over at epoch %d: %d group(s), %d record(s) of a "
            "fenced replica ignored", partition, epoch, len(groups), image.fenced_records,
        )  # fmt: skip

    def release_partition(self, partition: int, reason: str) -> None:
        """Stop serving the groups of `partition` (handed over, or fenced): their members'
        channels close with NOT_COORDINATOR, and the members keep running their ranges
        while their lease lasts and find the new owner (docs/protocol.md §7.4)."""
        if self._epochs.pop(partition, None) is None:
            return
        for group in self._partition_groups.pop(partition, set()):
            state = self._groups.pop(group, None)
            if state is None:
                continue
            for member_id in list(state.members):
                channel = self.channels.pop((group, member_id), None)
                self._sender.forget(group, member_id)
                if channel is not None:
                    channel.fail(ErrorCode.NOT_COORDINATOR, reason)
            self.writer.forget(group)
            self.watcher.forget(group)
        log.info("state partition %d released: %s", partition, reason)

    def _write_failed(self, group: str, err: BaseException) -> None:
        """A state write was refused: another replica owns the group's partition now."""
        owner = self.owner_of(group)
        if owner is None or isinstance(err, NotOwned):
            return
        log.warning("group %s: state write failed (%s)", group, err)
        if isinstance(err, Fenced):
            self.release_partition(owner[0], "fenced: another coordinator took the group over")
            if self.on_fenced is not None:
                self.on_fenced(owner[0])

    # ---- events from channels -----------------------------------------------------

    async def register(
        self, channel: Channel, request: RegisterRequest, principal: Principal = ANONYMOUS
    ) -> RegisterResponse:
        """Validate a Register of a connection authenticated as `principal`, admit the
        member and start pinging it."""
        if not self.ready:
            raise CoordinatorError(ErrorCode.NOT_COORDINATOR, "coordinator is still starting")
        self._require_owned(request.group)
        counts = await self._gate.admit(request, principal, channel.peer_host)
        pattern = request.topic_pattern
        partitions = growth.partitions_of(counts)
        existing = self._groups.get(request.group)
        config = existing.config if existing else self.config.config_for(request.group)
        try:
            ends = await self._partition_ends.if_new(request.group, config, existing, partitions)
        except PartitionEndsUnknown as err:
            raise CoordinatorError(ErrorCode.INTERNAL, str(err)) from err
        # Again: the partition may have been handed over while we asked Kafka, and a group
        # created now would be served by nobody's authority.
        self._require_owned(request.group)
        state = self._group(request.group)
        counts = self.watcher.before_join(state, counts, tuple(request.topics), pattern)
        topics, partitions = tuple(sorted(counts)), growth.partitions_of(counts)
        if ends is not None and (started := starting.start_positions(state, ends)).records:
            self.ends.learned(ends)
            self._apply(request.group, state, started)
            log.info(
                "new group %s starts at the partitions' ends: %s", request.group, describe(ends)
            )
        fixed = None if request.fixed_ranges is None else ranges_from_wire(request.fixed_ranges)
        claim = request.claim
        result: Result | None = None
        if claim is not None and not claim_owned_by(state, claim.member_id, principal):
            claim = None  # another principal's: an ordinary Register, the claim waits
        if claim is not None:
            member_id = claim.member_id
            judge = claim_judge(state, request, topics, partitions, fixed, self.clock())
            result = await self.reports.verdict(judge)  # None: its lease ran out meanwhile
            if self._groups.get(request.group) is not state:  # handed over meanwhile
                raise CoordinatorError(ErrorCode.NOT_COORDINATOR, "the group moved: try again")
        if result is None:
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
                fixed_ranges=fixed,
                validate_ranges=strategy_named(state.config.assignor).validate_ranges,
                topic_pattern=pattern,
                principal=str(principal),
            )
        if result.error is not None:
            raise CoordinatorError(*result.error)
        previous = self.channels.pop((request.group, member_id), None)
        if previous is not None:  # its old channel, if that is still open: superseded
            previous.close("the member registered again on a new connection")
        self.channels[(request.group, member_id)] = channel
        self._run(request.group, result)
        if claim is not None and claim.member_id == member_id:  # adopted: what it runs
            runs = {(p.topic, p.partition) for p in claim.positions}
            self._run(request.group, growth.extend_member(state, member_id, runs))
        member = state.members[member_id]
        interval_ms = ping_interval_ms(state, member.session_timeout_ms)
        self._spawn(
            self._pinger.loop(request.group, member_id, channel, interval_ms / 1000),
            f"ping-{member_id}",
        )
        adopted = member.owned if claim is not None and claim.member_id == member_id else None
        self.activity.count("joined" if adopted is None else "adopted")
        log.info(
            "member %s %s group %s (%s, %s)", member_id,
            "joined" if adopted is None else f"came back to, keeping {adopted},", request.group,
            principal, channel.peer,
        )  # fmt: skip
        return RegisterResponse(
            correlation_id=0,
            member_id=member_id,
            member_epoch=member.epoch,
            ping_interval_ms=interval_ms,
            session_timeout_ms=member.session_timeout_ms,
            adopted=ranges_to_wire(adopted) if adopted is not None else [],
            coordinator_epoch=self.epoch_of(request.group),
        )

    async def leave(
        self, group: str, member_id: str, positions: list[PartitionPositions]
    ) -> ErrorCode | None:
        """A Leave, judged after the member's earlier reports (its final positions are
        checked like any): the error to answer, or None."""
        if self._groups.get(group) is None:
            return ErrorCode.UNKNOWN_GROUP
        judge = leave_judge(self._groups, group, member_id, positions, self.clock())
        result = await self.reports.submitted(group, member_id, judge)
        self.channels.pop((group, member_id), None)
        if result is None:
            return ErrorCode.UNKNOWN_GROUP
        if result.error is not None:
            return result.error[0]
        log.info("member %s left group %s", member_id, group)
        return None

    def channel_closed(self, group: str, member_id: str, reason: str) -> None:
        self.channels.pop((group, member_id), None)
        self._sender.forget(group, member_id)
        state = self._groups.get(group)
        if state is None or member_id not in state.members:
            return
        phase = state.members[member_id].phase
        log.warning("member %s of group %s lost (%s): %s", member_id, group, phase, reason)
        self._run(group, handlers.connection_lost(state, member_id=member_id, now=self.clock()))

    def fence(self, group: str, member_id: str, reason: str) -> bool:
        """Operator fence: like a drain timeout, the member is removed and its ranges move
        once it must have stopped."""
        state = self._groups.get(group)
        if state is None or member_id not in state.members:
            return False
        result = handlers.connection_lost(
            state, member_id=member_id, now=self.clock(), reclaimable=False
        )
        result.effects.append(CloseMember(member_id, ErrorCode.FENCED_MEMBER, reason))
        self._run(group, result)
        return True

    # ---- the apply loop -----------------------------------------------------------

    def _require_owned(self, group: str) -> None:
        if self.owner_of(group) is None:
            raise CoordinatorError(
                ErrorCode.NOT_COORDINATOR,
                f"group {group!r} is not coordinated here: ask Metadata for its owner",
            )

    def _group(self, group: str) -> GroupState:
        state = self._groups.get(group)
        if state is None:
            config = self.config.config_for(group)
            state = self._groups[group] = GroupState(
                group, config, self.config.bounds, load=BucketLoad(config.load_half_life_ms / 1000)
            )
            owner = self.owner_of(group)
            if owner is not None:
                self._partition_groups.setdefault(owner[0], set()).add(group)
            self._arm(group, BalanceTimer(), self.clock() + config.balance_check_ms / 1000)
        return state

    def _run(self, group: str, result: Result) -> None:
        state = self._groups.get(group)
        if state is None:  # released while the result was being made (a reply, a read)
            return
        self._apply(group, state, result)
        # Progress reports change no ownership; skipping reconcile for them keeps a ping
        # O(1) instead of O(members). (An empty result, e.g. the grace timer, reconciles.)
        if result.records and all(isinstance(r, PROGRESS_RECORDS) for r in result.records):
            return
        self._reconcile(group, state)

    def _reconcile(self, group: str, state: GroupState) -> None:
        """Reconcile now against the current target (cheap: it costs what changed); a
        stale target is recomputed later, off the loop (coordinator.runtime.recompute)."""
        assignor = strategy_named(state.config.assignor).assignor
        self._apply(
            group,
            state,
            handlers.reconcile(
                state,
                now=self.clock(),
                assignor=assignor,
                recompute=False,
                hold_s=2 * self.config.recompute_max_defer_ms / 1000,
            ),
        )
        # A group without members has nothing to recompute: scheduling it anyway would
        # spin the loop for a group replayed from the state log.
        if state.members and state.target_version != state.inputs_version:
            self._recomputer.stale(group, state)

    def _adopt_target(self, group: str, state: GroupState, record: TargetComputed) -> None:
        # (A group released meanwhile is another replica's now: its timers and late
        # recomputes find it gone and do nothing.)
        if self.ready and self._groups.get(group) is state:
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
                        self._sender.send_stop(group, state, effect, time.perf_counter()),
                        f"stop-{effect.member_id}",
                    )
                case SendStart():
                    self.activity.count("start decided")
                    self._spawn(
                        self._sender.send_start(group, state, effect, time.perf_counter()),
                        f"start-{effect.member_id}",
                    )
                case CloseMember():
                    channel = self.channels.pop((group, effect.member_id), None)
                    if channel is not None:
                        log.warning("closing member %s: %s", effect.member_id, effect.message)
                        channel.fail(effect.code, effect.message)
                case SetTimer(key, at):
                    self._arm(group, key, at)
                case CancelTimer(key):
                    self.timers.cancel((group, key))

    def _heard(self, group: str, member_id: str) -> None:
        state = self._groups.get(group)
        if state is not None:
            self._run(group, handlers.heard(state, member_id=member_id, now=self.clock()))

    def _contacted(self, group: str, member_id: str) -> None:
        state = self._groups.get(group)
        if state is None:
            return
        self._apply(group, state, handlers.contacted(state, member_id=member_id, now=self.clock()))

    # ---- timers -------------------------------------------------------------------

    def _arm(self, group: str, key: TimerKey, at: float) -> None:
        self.timers.set((group, key), at, self._on_timer)

    def _on_timer(self, timer: TimerId) -> None:
        group, key = timer
        state = self._groups.get(group)
        if state is None:
            return
        match key:
            case BalanceTimer():
                imbalance = strategy_named(state.config.assignor).imbalance
                self._run(
                    group, balance.balance_check(state, now=self.clock(), imbalance=imbalance)
                )
            case SessionTimer() | DrainTimer():
                self._verdicts.fired(group, state, key)
            case _:
                self._run(group, handlers.timer_fired(state, key=key, now=self.clock()))

    # ---- housekeeping -------------------------------------------------------------

    def _gauges(self) -> dict[str, int]:
        phases = Counter(m.phase for s in self._groups.values() for m in s.members.values())
        return {
            "members": sum(phases.values()),
            "waiting for flush": self.writer.waiting,
            "draining": phases[MemberPhase.DRAINING],
            "starting": phases[MemberPhase.STARTING],
        }

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())
