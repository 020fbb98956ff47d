"""A group's state: its members, their ranges, the target, positions and handoffs.

Plain data read by the pure handlers (`coordinator.group.handlers`) and changed only by
`coordinator.group.replay`; the derived indexes at the bottom of `GroupState` are kept
by `replay` so that `reconcile` costs what changed, not the group's size.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from keyshard.coordinator.group.bounds import Bounds
from keyshard.coordinator.group.demand import BucketDemand
from keyshard.coordinator.group.load import BucketLoad
from keyshard.coordinator.group.speed import SpeedMeter
from keyshard.coordinator.strategies.registry import DEFAULT_STRATEGY
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import Position, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange

MAX_HANDOFF_HISTORY = 200
MAX_AUDIT_HISTORY = 200
#: Who a member is when nothing authenticated its connection (Kafka's PLAINTEXT principal).
ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"


class OffsetReset(StrEnum):
    """Where a new group starts reading (Kafka's `auto.offset.reset`). A group is new
    until it has positions; the positions it starts from are then stored like any other,
    so this never moves a group that has them (coordinator.group.starting)."""

    EARLIEST = "earliest"  # every record already in its topics
    LATEST = "latest"  # the partitions' ends when the group is created


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Per-group knobs; defaults come from the daemon's flags."""

    assignor: str = DEFAULT_STRATEGY
    drain_timeout_ms: int = 10_000
    # Load-driven rebalancing (strategies that read load): move boundaries only when the
    # busiest member's load share / capacity share exceeds this factor, measured with every
    # slot counted at most as the smallest member's share (no assignment can split a
    # hotter slot, so chasing it only thrashes)...
    rebalance_threshold: float = 1.25
    # ...continuously for this long (hysteresis: no thrashing on bursts).
    rebalance_hold_ms: int = 30_000
    # A backlog is not noise: when the busiest member has at least `backlog_records`
    # records waiting beyond its share of the group's backlog, the imbalance must hold
    # only this long (work waiting now, that the others could take over now).
    backlog_hold_ms: int = 1_000
    backlog_records: int = 200
    # Demand = records waiting + this long of records at the measured rate: what each
    # member is expected to drain, balanced against its capacity.
    demand_horizon_ms: int = 2_000
    balance_check_ms: int = 1_000
    load_half_life_ms: int = 30_000
    # Extra wait past a lost member's session timeout before its ranges move, covering
    # clock skew and the member's own detection delay.
    lost_member_margin_ms: int = 500
    ping_interval_ms: int | None = None  # None: a third of each member's session timeout
    # A member with records waiting in its slots whose positions stand still this long
    # has failed: fenced, its ranges moved (coordinator.group.stalls). None: its session
    # timeout.
    stall_timeout_ms: int | None = None
    auto_offset_reset: OffsetReset = OffsetReset.EARLIEST


class MemberPhase(StrEnum):
    """Where a member stands in the handoff, as the logs and the admin API show it.

    Derived from its range sets (`Member.phase`), in this order of precedence: a member
    that is draining some ranges while others start is shown draining, because that is
    what a handoff waits for.
    """

    DRAINING = "draining"  # a StopFetcher is out: ranges wait for its final positions
    STARTING = "starting"  # a StartFetcher is out and not yet acknowledged
    RUNNING = "running"  # owns ranges, nothing in flight
    IDLE = "idle"  # owns nothing: just joined, or everything it had moved away


class HandoffKind(StrEnum):
    """Why ranges left a member: a revoke it drains, or how the member itself left."""

    REVOKE = "revoke"  # the target moved them: StopFetcher, drain, final positions
    LEAVE = "leave"  # a graceful Leave with final positions
    LOST = "lost"  # its channel closed, its session expired, or an operator fenced it
    FENCED = "fenced"  # it missed a drain deadline


@dataclass(slots=True)
class Member:
    member_id: str
    name: str
    capacity: int
    session_timeout_ms: int
    last_heard: float
    epoch: int = 1
    # The principal its connection authenticated as (keyshard.core.security.identity):
    # only that principal may adopt its claim after a failover.
    principal: str = ANONYMOUS_PRINCIPAL
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
    # Its last Ping reply, and its records completed per second between the last two:
    # how much of the backlog counted against it is already gone (`handlers.backlog_now`).
    pinged_at: float | None = None
    processed_per_s: float = 0.0
    # Records per second of handler time, from its Ping replies (coordinator.group.speed).
    speed: SpeedMeter = field(default_factory=SpeedMeter)
    # Offsets its positions moved that no completion has counted yet: what it may still
    # say it completed (coordinator.group.reports.counted_completions).
    credit: int = 0
    # Since when it has made no progress while records wait in its slots, as of its last
    # Ping reply (None: it progresses, or nothing waits; coordinator.group.stalls).
    stalled_since: float | None = None

    @property
    def phase(self) -> MemberPhase:
        if self.draining:
            return MemberPhase.DRAINING
        if self.starting:
            return MemberPhase.STARTING
        return MemberPhase.RUNNING if self.owned else MemberPhase.IDLE

    @property
    def drain_deadline(self) -> float | None:
        return min((deadline for _, deadline in self.drains), default=None)

    def completed_since_ping(self, now: float) -> float:
        """Records it has likely completed since its last Ping reply, at its last measured
        rate: a member that stopped answering is not assumed to go on completing them for
        longer than half its session (after a whole one it is removed anyway)."""
        if self.pinged_at is None or now <= self.pinged_at:
            return 0.0
        return self.processed_per_s * min(now - self.pinged_at, self.session_timeout_ms / 2000)

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


@dataclass(frozen=True, slots=True)
class PendingClaim:
    """A member that owned ranges and may come back for them: its channel closed (the
    network, or its coordinator handed the group over or died), and it keeps processing
    while its lease lasts. Re-registering with a claim that matches this, it keeps
    its ranges with no pause and no duplicates; otherwise they move at `until`, when
    it must have stopped (the quarantine of the same ranges)."""

    member_id: str
    name: str
    member_epoch: int
    owned: RangeSet
    until: float
    # Only a connection of this principal may adopt the claim (docs/protocol.md §7.4).
    principal: str = ANONYMOUS_PRINCIPAL


@dataclass(slots=True)
class Handoff:
    """One movement of ranges away from a member, until they run again elsewhere."""

    handoff_id: int
    kind: HandoffKind
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


@dataclass(frozen=True, slots=True, order=True)
class Transition:
    """A topic whose partition count changed while the group read it (docs/protocol.md
    §9.5). A keyed producer writes a key to the partition the count it last saw gives it,
    and sees a new count only at its next metadata refresh: until `until_ms` (when the
    change was seen plus the growth window) one key's records may be in two partitions,
    so members admit the topic's records in timestamp order (`consumer_client._datapath
    .merge`). It ends once the group's positions passed `fence`, the partitions' ends
    read after `until_ms`: nothing older can still be waiting then."""

    topic: str
    counts: tuple[int, ...]  # the partition counts it went through, oldest first
    seen_at_ms: int  # wall clock, ms since the epoch: when the last change was seen
    until_ms: int
    fence: tuple[tuple[int, int], ...] | None = None  # (partition, end) read after until_ms


@dataclass(frozen=True, slots=True)
class Reset:
    """The latest reset of one partition's positions (coordinator.group.resets): the
    durability writer stores it as a marker ahead of the positions it changed."""

    slots: RangeSet
    position: Position
    # Two resets to the same place are two markers: the later one must supersede what
    # was written between them.
    at: float


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """A state-changing admin call on the group: who made it, what, when."""

    at_ms: int  # wall clock, ms since the epoch
    principal: str
    action: str  # "config", "rebalance", "fence", "reset"
    detail: str
    # Its place in the group's trail, counted from 0 and carried over by a replica
    # taking the group over: the order of the stored entries, and their log keys.
    seq: int = 0


@dataclass(slots=True)
class GroupState:
    group: str
    config: GroupConfig = field(default_factory=GroupConfig)
    # The server's bounds on what members declare and report (coordinator.group.bounds).
    bounds: Bounds = field(default_factory=Bounds)
    topics: tuple[str, ...] = ()
    partitions: tuple[TopicPartition, ...] = ()
    # The regular expression the group subscribes with (its topics are what it matches
    # now), or None for topics by name.
    topic_pattern: str | None = None
    # Topics whose partition count changed lately, by topic (see Transition).
    transitions: dict[str, Transition] = field(default_factory=dict)
    # Partitions that left the group (topic deleted, or no longer matching): a member may
    # still report them until it has read the StartFetcher that drops them, so their
    # reports are ignored, not taken for lies (coordinator.group.reports).
    dropped: set[TopicPartition] = field(default_factory=set)
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, RangeSet] = field(default_factory=dict)
    unassigned: RangeSet = EMPTY  # slots the strategy gives nobody: their records wait
    notes: tuple[str, ...] = ()  # what the strategy reported (e.g. a slot too hot to split)
    load: BucketLoad = field(default_factory=BucketLoad)
    demand: BucketDemand = field(default_factory=BucketDemand)  # the backlog, per bucket
    imbalanced_since: float | None = None
    # The imbalance that set off the last load rebalance, until the group is back under the
    # threshold: while the measure is no worse than this (+5%), asking again would only
    # recompute what the strategy already placed (a load it cannot pack any better).
    last_rebalance_imbalance: float | None = None
    # The two members that last reported fetched records, newest first, with when: whether
    # members other than one judged read what waits in its slots (coordinator.group.stalls).
    readers: tuple[tuple[str, float], ...] = ()
    # Partition ends as the members' fetches last saw them, or the coordinator read them
    # (coordinator.runtime.partition_watch), whichever is further: what lag is measured
    # against.
    high_watermarks: dict[TopicPartition, int] = field(default_factory=dict)
    # The members' fetches' part of it alone: whether the group has caught up with what it
    # fetched (the demand check settles then) is judged on it, not on ends read at another
    # instant, which under steady traffic are always a little ahead of every position.
    fetched_ends: dict[TopicPartition, int] = field(default_factory=dict)
    # Partitions whose reported end is a last stable offset (read_committed members).
    stable_ends: dict[TopicPartition, bool] = field(default_factory=dict)
    quarantined: list[Quarantine] = field(default_factory=list)
    # Members that may come back for their quarantined ranges (see PendingClaim).
    claims: dict[str, PendingClaim] = field(default_factory=dict)
    positions: dict[TopicPartition, RangePositionMap] = field(default_factory=dict)
    # The latest reset of each partition this coordinator made (see Reset).
    resets: dict[TopicPartition, Reset] = field(default_factory=dict)
    handoffs: deque[Handoff] = field(default_factory=lambda: deque(maxlen=MAX_HANDOFF_HISTORY))
    # The latest admin changes, oldest first (coordinator.runtime.operations.audit).
    audit: deque[AuditEntry] = field(default_factory=lambda: deque(maxlen=MAX_AUDIT_HISTORY))
    next_audit_seq: int = 0  # the `seq` of the next entry
    next_handoff_id: int = 1
    inputs_version: int = 0  # bumped by whatever should make the target be recomputed
    target_version: int = -1
    # The inputs_version of the latest join: a target computed from older inputs has not
    # placed every member, and the one that does will move slots of every target.
    joined_version: int = 0
    # Since when `reconcile` holds grants back for such a target (GrantsHeld), if it does.
    grants_held_since: float | None = None
    # Whether a slot ran on a member since the group last had none (granted, or claimed
    # back after a takeover): a group without it is forming (see `forming`).
    ran_since_formed: bool = False
    positions_version: int = 0
    # The positions_version that last changed each partition's positions: a write of
    # the group carries only the partitions changed since the one before it.
    position_changes: dict[TopicPartition, int] = field(default_factory=dict)
    # Bumped by every change the state log must hold (positions, who owns what): the
    # durability writer stores the group as of a version; `member_changes` says which
    # member each version touched, so a write carries only the members that changed.
    log_version: int = 0
    member_changes: dict[str, int] = field(default_factory=dict)
    # Bumped when its topics, partitions or transitions change: the state log holds them
    # (a replica taking the group over must know a transition it cannot see any more).
    topology_version: int = 0
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

    @property
    def forming(self) -> bool:
        """No slot ran on any member since the group last had none: its members are the
        first of a join storm, whose tail may still be coming (Kafka's initial rebalance
        delay). Waiting for that tail costs nothing here, while a target granted before it
        came would be cut into by the next one, a piece from every member."""
        return not self.ran_since_formed

    def position_map(self, tp: TopicPartition) -> RangePositionMap:
        """The positions of `tp`, for reading: a partition nobody reported on yet is
        everywhere at offset 0 (a fresh map, not stored: only `replay` adds maps)."""
        pmap = self.positions.get(tp)
        return RangePositionMap() if pmap is None else pmap

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

    def has_target_owner(self, slots: RangeSet) -> bool:
        """Whether any of `slots` is in a present member's target: stops at the first."""
        index = self.target_index
        for r in slots:
            i = max(0, bisect_right(index, (r.start, MAX_SLOT + 1, "")) - 1)
            while i < len(index) and index[i][0] <= r.end:
                start, end, mid = index[i]
                if max(start, r.start) <= min(end, r.end) and mid in self.members:
                    return True
                i += 1
        return False
