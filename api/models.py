"""Request and response models of the admin API, built from the coordinator's group state.

Every route declares one of these as its response model so the OpenAPI document is the
contract: the CLI, the dashboard and the schemathesis test all rely on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from keyshard.coordinator.group.resets import Move, ResetTarget, ResetTo
from keyshard.coordinator.group.state import (
    GroupConfig,
    GroupState,
    Handoff,
    MemberPhase,
    OffsetReset,
)
from keyshard.coordinator.group.targets import speed_factors_of
from keyshard.coordinator.strategies.registry import known_assignors
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange


class PositionSegment(BaseModel):
    start: int
    end: int
    next_offset: int
    acked: list[tuple[int, int]]


class PartitionView(BaseModel):
    """Every partition of the group, those nobody has read yet included (low watermark 0):
    `lag` is the partition's end (as the members' fetches, or the coordinator's own
    reads, last saw it) minus its low watermark; None until the end is known."""

    topic: str
    partition: int
    low_watermark: int
    segments: list[PositionSegment]
    end_offset: int | None = None
    lag: int | None = None


class TransitionView(BaseModel):
    """A topic whose partition count changed lately: members admit its records in
    timestamp order until the group's positions pass `fence` (docs/protocol.md §9.5)."""

    topic: str
    counts: list[int]  # the partition counts it went through, oldest first
    seen_at_ms: int  # wall clock, ms since the epoch
    until_ms: int
    fence: dict[str, int] | None  # partition -> end read after until_ms


class DrainView(BaseModel):
    ranges: list[tuple[int, int]]
    deadline_in_s: float | None
    blocking_offsets: dict[str, int]  # "topic/partition" -> lowest unfinished offset


class RangeLag(BaseModel):
    """Records of one partition not yet done in one owned range: the partition's high
    watermark (as the members' own fetches last saw it) minus the range's lowest next
    offset. Absent until a member has reported a high watermark for the partition."""

    start: int
    end: int
    topic: str
    partition: int
    next_offset: int
    high_watermark: int
    # What lag counts to: the last stable offset (members read committed data, the
    # default) or the high watermark (read_uncommitted members).
    counted_to: Literal["last_stable_offset", "high_watermark"]
    lag: int


class MemberView(BaseModel):
    member_id: str
    name: str
    # Who its connection authenticated as (User:ANONYMOUS when nothing authenticates).
    principal: str
    phase: MemberPhase  # draining > starting > running > idle (see MemberPhase)
    epoch: int
    capacity: int
    session_timeout_ms: int
    ranges: list[tuple[int, int]]
    slots: int
    starting: list[tuple[int, int]]
    draining: DrainView | None
    processed: int
    # Records per second over the last few seconds of polling; None until two samples.
    processed_per_s: float | None = None
    # Records per second of handler time (its speed when busy), from its Ping replies;
    # None until measured. `speed_factor`: what the load-aware balance weighs its capacity
    # with (its speed per unit of capacity against the group's median; 1.0 within the
    # dead band or unmeasured).
    measured_speed: float | None = None
    speed_factor: float = 1.0
    last_heard_s_ago: float
    lag: int | None = None  # sum over `range_lag`; None before any high watermark
    range_lag: list[RangeLag] = []


class HandoffView(BaseModel):
    handoff_id: int
    kind: str
    from_member: str
    to_members: list[str]
    ranges: list[tuple[int, int]]
    waiting: list[tuple[int, int]]
    started_at: float  # coordinator's CLOCK_MONOTONIC seconds
    resumed_at: float | None
    released_after_s: float | None
    pause_s: float | None


class QuarantineView(BaseModel):
    former_member: str
    ranges: list[tuple[int, int]]
    until_in_s: float


class GroupConfigView(BaseModel):
    """Mirrors coordinator.group.state.GroupConfig field for field."""

    assignor: str
    drain_timeout_ms: int
    lost_member_margin_ms: int
    ping_interval_ms: int | None
    # No progress this long while records wait in its slots, a member is fenced (None:
    # its session timeout).
    stall_timeout_ms: int | None
    rebalance_threshold: float
    rebalance_hold_ms: int
    backlog_hold_ms: int
    backlog_records: int
    demand_horizon_ms: int
    balance_check_ms: int
    load_half_life_ms: int
    # Where the group started when it was new (it has positions now, so this no longer
    # moves it): earliest or latest, as Kafka's auto.offset.reset.
    auto_offset_reset: OffsetReset


class ServedByView(BaseModel):
    """The coordinator replica that serves the group: the owner of its state partition."""

    replica_id: str
    state_partition: int
    coordinator_epoch: int


class GroupView(BaseModel):
    group: str
    served_by: ServedByView
    topics: list[str]
    topic_pattern: str | None = None  # the group subscribes by pattern: what it matches now
    assignor: str
    config: GroupConfigView
    members: list[MemberView]
    unowned: list[tuple[int, int]]
    unassigned: list[tuple[int, int]]  # the strategy gives these to nobody: records wait
    # Membership changed and the new target is not computed yet: slots are about to move.
    target_pending: bool
    notes: list[str]  # what the strategy reported, e.g. a slot hotter than a fair share
    imbalanced_for_s: float | None  # load imbalance above the threshold for this long
    quarantined: list[QuarantineView]
    partitions: list[PartitionView]
    handoffs: list[HandoffView]
    transitions: list[TransitionView] = []


def partition_view(
    tp: tuple[str, int], pmap: RangePositionMap, end: int | None = None
) -> PartitionView:
    low = pmap.minimum_offset()
    return PartitionView(
        topic=tp[0],
        partition=tp[1],
        low_watermark=low,
        segments=[
            PositionSegment(
                start=s.start, end=s.end, next_offset=p.next_offset, acked=list(p.acked)
            )
            for s, p in pmap.segments()
        ],
        end_offset=end,
        lag=None if end is None else max(0, end - low),
    )


def partition_views(state: GroupState) -> list[PartitionView]:
    """Every partition of the group and every one it has positions of, in order."""
    every = sorted(set(state.partitions) | set(state.positions))
    return [
        partition_view(tp, state.position_map(tp), state.high_watermarks.get(tp)) for tp in every
    ]


def transition_views(state: GroupState) -> list[TransitionView]:
    return [
        TransitionView(
            topic=t.topic,
            counts=list(t.counts),
            seen_at_ms=t.seen_at_ms,
            until_ms=t.until_ms,
            fence=None if t.fence is None else {str(p): end for p, end in t.fence},
        )
        for t in sorted(state.transitions.values())
    ]


def _lag_of(state: GroupState, owned: RangeSet) -> dict[str, Any]:
    lags = []
    for tp in state.partitions:
        high = state.high_watermarks.get(tp)
        if high is None:
            continue
        pmap = state.position_map(tp)
        for slots in owned:
            next_offset = pmap.minimum_offset(RangeSet((slots,)))
            lags.append(
                RangeLag(
                    start=slots.start, end=slots.end, topic=tp[0], partition=tp[1],
                    next_offset=next_offset, high_watermark=high,
                    counted_to="last_stable_offset" if state.stable_ends.get(tp)
                    else "high_watermark",
                    lag=max(0, high - next_offset),
                )
            )  # fmt: skip
    return {"lag": sum(r.lag for r in lags) if lags else None, "range_lag": lags}


def handoff_view(h: Handoff) -> HandoffView:
    return HandoffView(
        handoff_id=h.handoff_id,
        kind=h.kind,
        from_member=h.from_member,
        to_members=list(h.to_members),
        ranges=h.ranges.to_pairs(),
        waiting=h.waiting.to_pairs(),
        started_at=h.started_at,
        resumed_at=h.resumed_at,
        released_after_s=None if h.released_at is None else h.released_at - h.started_at,
        pause_s=h.pause_s,
    )


def config_view(config: GroupConfig) -> GroupConfigView:
    return GroupConfigView(**dataclasses.asdict(config))


def drain_view(state: GroupState, member_id: str, now: float) -> DrainView | None:
    m = state.members[member_id]
    if not m.draining:
        return None
    return DrainView(
        ranges=m.draining.to_pairs(),
        deadline_in_s=None if m.drain_deadline is None else m.drain_deadline - now,
        blocking_offsets={
            f"{t}/{p}": state.position_map((t, p)).minimum_offset(m.draining)
            for t, p in state.partitions
        },
    )


def group_view(
    state: GroupState,
    now: float,
    served_by: ServedByView,
    rates: Mapping[str, float | None] | None = None,
) -> GroupView:
    rates = rates or {}
    factors = speed_factors_of(state)
    members = []
    for m in sorted(state.members.values(), key=lambda m: m.member_id):
        drain = drain_view(state, m.member_id, now)
        members.append(
            MemberView(
                member_id=m.member_id,
                name=m.name,
                principal=m.principal,
                phase=m.phase,
                epoch=m.epoch,
                capacity=m.capacity,
                session_timeout_ms=m.session_timeout_ms,
                ranges=m.owned.to_pairs(),
                slots=m.owned.size,
                starting=m.starting.to_pairs(),
                draining=drain,
                processed=m.processed,
                processed_per_s=rates.get(m.member_id),
                measured_speed=m.speed.speed,
                speed_factor=factors[m.member_id],
                last_heard_s_ago=now - m.last_heard,
                **_lag_of(state, m.owned),
            )
        )
    return GroupView(
        group=state.group,
        served_by=served_by,
        topics=list(state.topics),
        topic_pattern=state.topic_pattern,
        assignor=state.config.assignor,
        config=config_view(state.config),
        members=members,
        unowned=state.busy().complement().to_pairs(),
        unassigned=state.unassigned.to_pairs(),
        target_pending=bool(state.members) and state.target_version != state.inputs_version,
        notes=list(state.notes),
        imbalanced_for_s=None if state.imbalanced_since is None else now - state.imbalanced_since,
        quarantined=[
            QuarantineView(
                former_member=q.former_member, ranges=q.ranges.to_pairs(), until_in_s=q.until - now
            )
            for q in state.quarantined
        ],
        partitions=partition_views(state),
        handoffs=[handoff_view(h) for h in reversed(state.handoffs)],
        transitions=transition_views(state),
    )


# ---- the rest of the admin surface ----------------------------------------------------


class ErrorView(BaseModel):
    """Body of every 4xx answer except request validation (422)."""

    error: str  # machine-readable: "unauthorized", "forbidden", "not_found", ...
    detail: str


class HealthView(BaseModel):
    status: str


class ReadyView(BaseModel):
    ready: bool
    reason: str | None = None


class GroupSummary(BaseModel):
    group: str
    served_by: str  # the replica id
    topics: list[str]
    members: int
    owned_slots: int
    unowned_slots: int
    draining_ranges: int
    open_handoffs: int


class GroupsView(BaseModel):
    groups: list[GroupSummary]
    # Replicas that did not answer: their groups are missing from `groups`.
    unreachable: list[str] = []
    # Replicas not asked, their admin URL not verified (no replica secret): their groups
    # are missing too; ask each directly.
    unverified: list[str] = []


class GroupConfigUpdate(BaseModel):
    """Knobs an operator may change at run time; absent fields stay as they are.

    Session timeouts are absent on purpose: each member picks its own at Register.
    """

    model_config = ConfigDict(extra="forbid")

    drain_timeout_ms: int | None = Field(default=None, ge=100, le=3_600_000)
    lost_member_margin_ms: int | None = Field(default=None, ge=0, le=600_000)
    ping_interval_ms: int | None = Field(default=None, ge=100, le=600_000)
    stall_timeout_ms: int | None = Field(default=None, ge=1000, le=3_600_000)
    rebalance_threshold: float | None = Field(default=None, gt=1.0, le=100.0)
    rebalance_hold_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    backlog_hold_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    backlog_records: int | None = Field(default=None, ge=1, le=1_000_000_000)
    demand_horizon_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    balance_check_ms: int | None = Field(default=None, ge=100, le=600_000)
    # Applies only while the group has no positions: one that has them keeps them.
    auto_offset_reset: OffsetReset | None = None
    # A str checked against the registry (not a Literal): assignors are pluggable, and
    # the document still lists the known names as an enum.
    assignor: Annotated[
        str | None,
        WithJsonSchema({"anyOf": [{"enum": known_assignors()}, {"type": "null"}]}),
    ] = None

    @field_validator("assignor")
    @classmethod
    def _known_assignor(cls, value: str | None) -> str | None:
        if value is not None and value not in known_assignors():
            raise ValueError(f"unknown assignor; known: {', '.join(known_assignors())}")
        return value


class RebalanceView(BaseModel):
    group: str
    moved_slots: int
    target: dict[str, list[tuple[int, int]]]


Slot = Annotated[int, Field(ge=0, le=MAX_SLOT)]


class _ResetScope(BaseModel):
    """What a reset covers, and whether to apply it."""

    model_config = ConfigDict(extra="forbid")

    # Every partition of the group; a topic's; a partition of each topic, or of `topic`.
    topic: str | None = Field(default=None, min_length=1, max_length=249)
    partition: int | None = Field(default=None, ge=0, le=2**31 - 1)
    slots: tuple[Slot, Slot] | None = None  # the two ends of a slot range, inclusive
    execute: bool = False  # else a dry run, which changes nothing

    def slot_range(self) -> RangeSet | None:
        if self.slots is None:
            return None
        return RangeSet((SlotRange(min(self.slots), max(self.slots)),))


class ResetToEdge(_ResetScope):
    to: Literal[ResetTo.EARLIEST, ResetTo.LATEST, ResetTo.COMMITTED]

    def target(self) -> ResetTarget:
        return ResetTarget(self.to)


class ResetToOffset(_ResetScope):
    to: Literal[ResetTo.OFFSET]
    offset: int = Field(ge=0, le=2**53 - 1)  # what a JSON number holds exactly

    def target(self) -> ResetTarget:
        return ResetTarget(self.to, offset=self.offset)


class ResetToDatetime(_ResetScope):
    to: Literal[ResetTo.DATETIME]
    datetime: dt.datetime  # ISO 8601; without a zone, UTC

    def target(self) -> ResetTarget:
        at = self.datetime if self.datetime.tzinfo else self.datetime.replace(tzinfo=dt.UTC)
        # Kafka reads negative times as "earliest" and "latest": a time before 1970 is
        # before every record, as 0 is.
        return ResetTarget(self.to, timestamp_ms=max(0, int(at.timestamp() * 1000)))


#: A reset of a group's positions, as `kafka-consumer-groups --reset-offsets`: where to
#: (`to`, with `offset` or `datetime`), what (every partition of the group, a topic's or
#: one; every slot or one range), and whether to apply it.
PositionsResetRequest = Annotated[
    ResetToEdge | ResetToOffset | ResetToDatetime, Field(discriminator="to")
]


class PositionMoveView(BaseModel):
    topic: str
    partition: int
    start: int  # first slot
    end: int  # last slot, inclusive
    before: int  # next offset now
    after: int  # next offset after the reset


class PositionsResetView(BaseModel):
    group: str
    to: str
    executed: bool  # false: a dry run, nothing changed
    moves: list[PositionMoveView]


def positions_reset_view(
    group: str, target: ResetTarget, moves: list[Move], executed: bool
) -> PositionsResetView:
    return PositionsResetView(
        group=group,
        to=str(target),
        executed=executed,
        moves=[
            PositionMoveView(
                topic=m.tp[0],
                partition=m.tp[1],
                start=m.slots.start,
                end=m.slots.end,
                before=m.before,
                after=m.after,
            )
            for m in moves
        ],
    )


class AuditEntryView(BaseModel):
    at: str  # ISO 8601, UTC
    principal: str  # who made the call (User:keyshard-admin: the --admin-token)
    action: Literal["config", "rebalance", "fence", "reset"]
    detail: str


class AuditView(BaseModel):
    group: str
    entries: list[AuditEntryView]  # newest first; the latest 200 changes


def audit_view(state: GroupState) -> AuditView:
    return AuditView(
        group=state.group,
        entries=[
            AuditEntryView(
                at=_iso(e.at_ms),
                principal=e.principal,
                action=e.action,  # type: ignore[arg-type]
                detail=e.detail,
            )
            for e in reversed(state.audit)
        ],
    )


def _iso(at_ms: int) -> str:
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


class FenceView(BaseModel):
    group: str
    member_id: str
    fenced: bool


class KeyPosition(BaseModel):
    topic: str
    partition: int
    next_offset: int


class KeyView(BaseModel):
    group: str
    key: str
    slot: int
    owner: str | None
    draining: bool
    starting: bool
    quarantined: bool
    blocked: bool
    positions: list[KeyPosition]


class DrainingRangesView(BaseModel):
    member_id: str
    drain: DrainView


class HandoffsView(BaseModel):
    group: str
    handoffs: list[HandoffView]
    draining: list[DrainingRangesView]


def summary_view(state: GroupState, served_by: str) -> GroupSummary:
    owned = sum(m.owned.size for m in state.members.values())
    return GroupSummary(
        group=state.group,
        served_by=served_by,
        topics=list(state.topics),
        members=len(state.members),
        owned_slots=owned,
        unowned_slots=state.busy().complement().size,
        draining_ranges=sum(len(m.draining) for m in state.members.values()),
        open_handoffs=len(state.open_handoffs()),
    )


def handoffs_view(state: GroupState, now: float) -> HandoffsView:
    draining = []
    for member_id in sorted(state.members):
        drain = drain_view(state, member_id, now)
        if drain is not None:
            draining.append(DrainingRangesView(member_id=member_id, drain=drain))
    return HandoffsView(
        group=state.group,
        handoffs=[handoff_view(h) for h in reversed(state.handoffs)],
        draining=draining,
    )
