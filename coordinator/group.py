"""Group state, the records that change it, and `replay`: the only code that mutates it.

Shaped like Kafka's new group coordinator: handlers (`coordinator.handlers`) are pure
functions that read the state and return records plus effects; the runtime applies each
record with `replay` and then carries out the effects. Keeping mutation in one place makes
the handoff rules testable with a fake clock and no sockets, and makes every change of
ownership a value that can be logged, persisted and asserted on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from coordinator.hashing import MAX_SLOT
from coordinator.load import BucketLoad
from coordinator.positions import Position, RangePositionMap
from coordinator.ranges import EMPTY, RangeSet, SlotRange

TopicPartition = tuple[str, int]
PositionUpdate = dict[TopicPartition, list[tuple[SlotRange, Position]]]
MAX_HANDOFF_HISTORY = 200


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Per-group knobs; defaults come from the daemon's flags."""

    assignor: str = "load-aware"
    drain_timeout_ms: int = 10_000
    # Load-driven rebalancing (strategies that read load): move boundaries only when the
    # busiest member's load share / capacity share exceeds this factor, measured with every
    # slot counted at most as the smallest member's share (no assignment can split a
    # hotter slot, so chasing it only thrashes)...
    rebalance_threshold: float = 1.25
    # ...continuously for this long (hysteresis: no thrashing on bursts).
    rebalance_hold_ms: int = 30_000
    balance_check_ms: int = 5_000
    load_half_life_ms: int = 30_000
    # Extra wait past a lost member's session timeout before its ranges move, covering
    # clock skew and the member's own detection delay.
    lost_member_margin_ms: int = 500
    ping_interval_ms: int | None = None  # None: a third of each member's session timeout


@dataclass(slots=True)
class Member:
    member_id: str
    name: str
    capacity: int
    session_timeout_ms: int
    joined_at: float
    last_heard: float
    epoch: int = 1
    owned: RangeSet = EMPTY  # granted (start sent) and not yet released, includes draining
    draining: RangeSet = EMPTY  # StopFetcher sent, final positions not yet back
    # One deadline per StopFetcher: a later stop gets its own full drain timeout.
    drains: list[tuple[RangeSet, float]] = field(default_factory=list)
    starting: RangeSet = EMPTY  # StartFetcher sent, not yet acknowledged
    # When we last sent it a request: it restarts its own session clock on every one.
    last_contacted: float = 0.0
    fixed_ranges: RangeSet | None = None  # declared at Register (sticky strategy)
    load: dict[int, int] = field(default_factory=dict)
    processed: int = 0

    @property
    def drain_deadline(self) -> float | None:
        return min((deadline for _, deadline in self.drains), default=None)

    def must_have_stopped_by(self) -> float:
        """Without contact a member stops itself one session timeout after the last thing
        it heard from us, which is no earlier than our last request or its last reply."""
        return max(self.last_heard, self.last_contacted) + self.session_timeout_ms / 1000


@dataclass(slots=True)
class Quarantine:
    """Ranges of a lost member that may not move before `until`: by then it has stopped."""

    ranges: RangeSet
    until: float
    former_member: str


@dataclass(slots=True)
class Handoff:
    """One movement of ranges away from a member, until they run again elsewhere."""

    handoff_id: int
    kind: str  # "revoke" | "leave" | "lost" | "fenced"
    from_member: str
    ranges: RangeSet
    started_at: float
    released_at: float | None = None
    resumed_at: float | None = None
    waiting: RangeSet = EMPTY  # part of `ranges` not yet running on a new owner
    to_members: list[str] = field(default_factory=list)

    @property
    def pause_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.started_at


@dataclass(slots=True)
class GroupState:
    group: str
    config: GroupConfig = field(default_factory=GroupConfig)
    topics: tuple[str, ...] = ()
    partitions: tuple[TopicPartition, ...] = ()
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, RangeSet] = field(default_factory=dict)
    unassigned: RangeSet = EMPTY  # slots the strategy gives nobody: their records wait
    notes: tuple[str, ...] = ()  # what the strategy reported (e.g. a slot too hot to split)
    load: BucketLoad = field(default_factory=BucketLoad)
    imbalanced_since: float | None = None
    # The imbalance that set off the last load rebalance, until the group is back under the
    # threshold: while the measure is no worse than this (+5%), asking again would only
    # recompute what the strategy already placed (a load it cannot pack any better).
    rebalanced_at: float | None = None
    # Partition ends as the members' fetches last saw them: what lag is measured against.
    high_watermarks: dict[TopicPartition, int] = field(default_factory=dict)
    quarantined: list[Quarantine] = field(default_factory=list)
    positions: dict[TopicPartition, RangePositionMap] = field(default_factory=dict)
    handoffs: deque[Handoff] = field(default_factory=lambda: deque(maxlen=MAX_HANDOFF_HISTORY))
    grants_allowed_at: float = 0.0
    next_handoff_id: int = 1
    inputs_version: int = 0  # bumped by whatever should make the target be recomputed
    target_version: int = -1
    positions_version: int = 0
    # The positions_version when slots last stopped being owned: a StartFetcher needs the
    # positions durable up to here (where the previous owners stopped), not up to the
    # newest ping's progress on slots it does not touch.
    handoff_version: int = 0
    # Derived indexes kept by `replay` so that `reconcile` costs what changed, not the
    # group's size (thousands of members would otherwise make every reply O(members)):
    # slots nobody owns or quarantines (== busy().complement()),
    free: RangeSet = field(default_factory=RangeSet.full)
    # members owning slots outside their target and not yet draining them,
    excess: set[str] = field(default_factory=set)
    # every target range as (start, end, member), by start, for "whose target is slot s",
    target_index: list[tuple[int, int, str]] = field(default_factory=list)
    # and the handoffs not yet resumed (a subset of `handoffs`).
    open: list[Handoff] = field(default_factory=list)

    def position_map(self, tp: TopicPartition) -> RangePositionMap:
        pmap = self.positions.get(tp)
        if pmap is None:
            pmap = self.positions[tp] = RangePositionMap()
        return pmap

    def busy(self) -> RangeSet:
        """Slots that someone owns or that are waiting out a lost member's quarantine."""
        ranges = [r for m in self.members.values() for r in m.owned]
        ranges += [r for q in self.quarantined for r in q.ranges]
        return RangeSet(ranges)

    def open_handoffs(self) -> list[Handoff]:
        return list(self.open)

    def target_owners(self, slots: RangeSet) -> dict[str, RangeSet]:
        """The part of `slots` in each present member's target: O(pieces touched)."""
        index = self.target_index
        parts: dict[str, list[SlotRange]] = {}
        for r in slots:
            i = max(0, bisect_right(index, (r.start, MAX_SLOT + 1, "")) - 1)
            while i < len(index) and index[i][0] <= r.end:
                start, end, mid = index[i]
                lo, hi = max(start, r.start), min(end, r.end)
                if lo <= hi and mid in self.members:
                    parts.setdefault(mid, []).append(SlotRange(lo, hi))
                i += 1
        return {mid: RangeSet(rs) for mid, rs in parts.items()}


# ---- records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberJoined:
    member_id: str
    name: str
    capacity: int
    session_timeout_ms: int
    topics: tuple[str, ...]
    partitions: tuple[TopicPartition, ...]
    at: float
    fixed_ranges: RangeSet | None = None


@dataclass(frozen=True, slots=True)
class MemberHeard:
    member_id: str
    at: float
    load: tuple[tuple[int, int], ...] = ()
    high_watermarks: tuple[tuple[TopicPartition, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MemberContacted:
    member_id: str
    at: float


@dataclass(frozen=True, slots=True)
class PositionsAdvanced:
    """Done offsets reported by an owner; merged by union, so positions never go back."""

    updates: tuple[tuple[TopicPartition, tuple[tuple[SlotRange, Position], ...]], ...]


@dataclass(frozen=True, slots=True)
class TargetComputed:
    target: tuple[tuple[str, RangeSet], ...]
    inputs_version: int
    unassigned: RangeSet = EMPTY
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RebalanceRequested:
    """Recompute the target with the current inputs (load moved, or an operator asked);
    the assignor still starts from the current target, so only what must move moves."""

    reason: str
    at: float
    imbalance: float | None = None  # what set it off, when the load did (not an operator)


@dataclass(frozen=True, slots=True)
class ImbalanceObserved:
    since: float | None  # None: balanced again (under the threshold)


@dataclass(frozen=True, slots=True)
class RangesRevoked:
    member_id: str
    ranges: RangeSet
    epoch: int
    deadline: float
    at: float


@dataclass(frozen=True, slots=True)
class DrainStarted:
    """The StopFetcher for `ranges` was written: the member's drain time runs from here,
    not from the decision, which can be seconds earlier on a busy coordinator."""

    member_id: str
    ranges: RangeSet
    deadline: float


@dataclass(frozen=True, slots=True)
class RangesReleased:
    member_id: str
    ranges: RangeSet
    at: float


@dataclass(frozen=True, slots=True)
class RangesGranted:
    member_id: str
    ranges: RangeSet
    epoch: int
    at: float


@dataclass(frozen=True, slots=True)
class GrantAcknowledged:
    member_id: str
    ranges: RangeSet
    at: float


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    member_id: str
    reason: str  # "leave" | "lost" | "fenced"
    quarantine_until: float | None
    at: float


@dataclass(frozen=True, slots=True)
class QuarantineLifted:
    at: float


@dataclass(frozen=True, slots=True)
class GrantsDeferred:
    """After a coordinator (re)start nothing is granted until earlier owners must have
    stopped: their sessions with the previous coordinator could still be running."""

    until: float


@dataclass(frozen=True, slots=True)
class PositionsLoaded:
    tp: TopicPartition
    positions: RangePositionMap


@dataclass(frozen=True, slots=True)
class GroupConfigChanged:
    """An operator changed the group's knobs; they apply from the next decision on."""

    config: GroupConfig
    at: float


Record = (
    MemberJoined
    | MemberHeard
    | MemberContacted
    | PositionsAdvanced
    | TargetComputed
    | RebalanceRequested
    | ImbalanceObserved
    | RangesRevoked
    | DrainStarted
    | RangesReleased
    | RangesGranted
    | GrantAcknowledged
    | MemberRemoved
    | QuarantineLifted
    | GrantsDeferred
    | PositionsLoaded
    | RebalanceRequested
    | GroupConfigChanged
)


def replay(state: GroupState, record: Record) -> None:
    """Apply one record. The only function that mutates a GroupState."""
    match record:
        case MemberJoined():
            state.members[record.member_id] = Member(
                member_id=record.member_id,
                name=record.name,
                capacity=record.capacity,
                session_timeout_ms=record.session_timeout_ms,
                joined_at=record.at,
                last_heard=record.at,
                fixed_ranges=record.fixed_ranges,
            )
            state.topics = record.topics
            state.partitions = record.partitions
            state.inputs_version += 1
        case MemberHeard():
            member = state.members.get(record.member_id)
            if member is not None:
                member.last_heard = record.at
                if record.load:
                    member.load = dict(record.load)
                    member.processed += sum(c for _, c in record.load)
                    state.load.add(record.load, record.at)
                for tp, offset in record.high_watermarks:
                    state.high_watermarks[tp] = max(state.high_watermarks.get(tp, 0), offset)
        case MemberContacted():
            member = state.members.get(record.member_id)
            if member is not None:
                member.last_contacted = max(member.last_contacted, record.at)
        case PositionsAdvanced():
            for tp, segments in record.updates:
                pmap = state.position_map(tp)
                for seg, pos in segments:
                    merged = [
                        (part, old.union(pos)) for part, old in pmap.segments(RangeSet((seg,)))
                    ]
                    pmap.update(merged)
            state.positions_version += 1
        case TargetComputed():
            state.target = dict(record.target)
            state.target_version = record.inputs_version
            state.unassigned = record.unassigned
            state.notes = record.notes
            state.target_index = sorted(
                (r.start, r.end, mid) for mid, ranges in record.target for r in ranges
            )
            state.excess = {mid for mid in state.members if _has_excess(state, mid)}
        case RebalanceRequested():
            state.inputs_version += 1
            state.imbalanced_since = None
            state.rebalanced_at = record.imbalance
        case ImbalanceObserved():
            state.imbalanced_since = record.since
            if record.since is None:
                state.rebalanced_at = None
        case RangesRevoked():
            member = state.members[record.member_id]
            member.draining = member.draining | record.ranges
            member.epoch = record.epoch
            member.last_contacted = max(member.last_contacted, record.at)
            member.drains.append((record.ranges, record.deadline))
            _refresh_excess(state, record.member_id)
            _open_handoff(state, "revoke", record.member_id, record.ranges, record.at)
        case DrainStarted():
            member = state.members.get(record.member_id)
            if member is not None:
                member.drains = [
                    (ranges, deadline if ranges - record.ranges else max(deadline, record.deadline))
                    for ranges, deadline in member.drains
                ]
        case RangesReleased():
            member = state.members[record.member_id]
            state.free = state.free | (record.ranges & member.owned)
            state.handoff_version = state.positions_version
            member.owned = member.owned - record.ranges
            member.draining = member.draining - record.ranges
            member.starting = member.starting - record.ranges
            member.drains = [
                (left, deadline)
                for ranges, deadline in member.drains
                if (left := ranges - record.ranges)
            ]
            _refresh_excess(state, record.member_id)
            _mark_released(state, record.ranges, record.at)
        case RangesGranted():
            member = state.members[record.member_id]
            member.owned = member.owned | record.ranges
            member.starting = member.starting | record.ranges
            member.epoch = record.epoch
            member.last_contacted = max(member.last_contacted, record.at)
            state.free = state.free - record.ranges
            _refresh_excess(state, record.member_id)
            for h in state.open:
                if h.waiting.overlaps(record.ranges) and record.member_id not in h.to_members:
                    h.to_members.append(record.member_id)
        case GrantAcknowledged():
            member = state.members[record.member_id]
            member.starting = member.starting - record.ranges
            for h in list(state.open):
                if h.waiting.overlaps(record.ranges):
                    h.waiting = h.waiting - record.ranges
                    if not h.waiting:
                        h.resumed_at = record.at
                        state.open.remove(h)
        case MemberRemoved():
            member = state.members.pop(record.member_id)
            state.target.pop(record.member_id, None)
            state.excess.discard(record.member_id)
            if member.owned:
                state.handoff_version = state.positions_version
                kind = record.reason
                if record.quarantine_until is not None:
                    state.quarantined.append(
                        Quarantine(member.owned, record.quarantine_until, member.member_id)
                    )
                # Ranges already draining have an open "revoke" handoff; the rest open one.
                fresh = member.owned - member.draining
                if fresh:
                    _open_handoff(state, kind, member.member_id, fresh, record.at)
                if record.quarantine_until is None:
                    state.free = state.free | member.owned
                    _mark_released(state, member.owned, record.at)
            state.inputs_version += 1
        case QuarantineLifted():
            lifted = [q for q in state.quarantined if q.until <= record.at]
            state.quarantined = [q for q in state.quarantined if q.until > record.at]
            for q in lifted:
                state.free = state.free | q.ranges
                _mark_released(state, q.ranges, record.at)
        case GrantsDeferred():
            state.grants_allowed_at = record.until
        case PositionsLoaded():
            state.positions[record.tp] = record.positions.copy()
        case GroupConfigChanged():
            state.config = record.config


def _open_handoff(
    state: GroupState, kind: str, member_id: str, ranges: RangeSet, at: float
) -> None:
    if len(state.handoffs) == state.handoffs.maxlen and state.handoffs[0] in state.open:
        state.open.remove(state.handoffs[0])  # forgotten: history is bounded
    handoff = Handoff(state.next_handoff_id, kind, member_id, ranges, at, waiting=ranges)
    state.handoffs.append(handoff)
    state.open.append(handoff)
    state.next_handoff_id += 1


def _has_excess(state: GroupState, member_id: str) -> bool:
    member = state.members[member_id]
    return bool(member.owned - state.target.get(member_id, EMPTY) - member.draining)


def _refresh_excess(state: GroupState, member_id: str) -> None:
    if member_id in state.members and _has_excess(state, member_id):
        state.excess.add(member_id)
    else:
        state.excess.discard(member_id)


def _mark_released(state: GroupState, ranges: RangeSet, at: float) -> None:
    for h in state.open:
        if h.released_at is None and h.ranges.overlaps(ranges):
            h.released_at = at
