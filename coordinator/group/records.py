"""The records that change a group: every change of state is one of these values.

Handlers return them, `replay` applies them, the runtime logs them; none of them is ever
mutated. A record says what happened (a member joined, ranges were granted), not what to
do next: what follows from it is the next `reconcile`'s business.
"""

from __future__ import annotations

from dataclasses import dataclass

from keyshard.coordinator.group.state import (
    ANONYMOUS_PRINCIPAL,
    AuditEntry,
    GroupConfig,
    HandoffKind,
    PendingClaim,
    Transition,
)
from keyshard.core.model.positions import Position, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange

# (partition, start, end, ((bucket, records), ...)): what a member's fetches examined in
# offsets [start, end) of the partition (coordinator.group.demand).
FetchedCounts = tuple[TopicPartition, int, int, tuple[tuple[int, int], ...]]


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
    topic_pattern: str | None = None
    principal: str = ANONYMOUS_PRINCIPAL


@dataclass(frozen=True, slots=True)
class MemberHeard:
    member_id: str
    at: float
    load: tuple[tuple[int, int], ...] = ()
    # (partition, offset, stable): stable when the offset is a last stable offset.
    high_watermarks: tuple[tuple[TopicPartition, int, bool], ...] = ()
    fetched: tuple[FetchedCounts, ...] = ()
    ping: bool = False  # a Ping reply: `load` is everything completed since the last one
    # A Ping reply's (records completed in lanes, their handler time in ms), if reported.
    busy: tuple[int, int] | None = None
    # Offsets the same reply's positions moved: the member's credit for completions, of
    # which `load` (and `busy`) spend what they count (coordinator.group.reports).
    advanced: int = 0
    # A Ping reply's: since when the member has made no progress while records wait in
    # its slots (None: it progresses, or nothing waits; coordinator.group.stalls).
    stalled_since: float | None = None


@dataclass(frozen=True, slots=True)
class MemberContacted:
    member_id: str
    at: float


@dataclass(frozen=True, slots=True)
class PositionsAdvanced:
    """Done offsets reported by an owner; merged by union, so positions never go back."""

    updates: tuple[tuple[TopicPartition, tuple[tuple[SlotRange, Position], ...]], ...]


@dataclass(frozen=True, slots=True)
class PositionsReset:
    """An operator moved the positions of `slots` of `tp` to `position`, backwards or
    forwards (coordinator.group.resets): unlike PositionsAdvanced it replaces, and the
    state log keeps it as a marker that older position chunks yield to."""

    tp: TopicPartition
    slots: RangeSet
    position: Position
    at: float


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
    reason: HandoffKind  # LEAVE, LOST or FENCED: the kind of the handoff it opens
    quarantine_until: float | None
    at: float
    # It may come back for its quarantined ranges (a PendingClaim): its channel closed
    # without a Leave, so it keeps processing while its lease lasts. Not when fenced.
    reclaimable: bool = False


@dataclass(frozen=True, slots=True)
class ClaimAwaited:
    """A member the state log says owned ranges, found by a replica taking the group
    over: its ranges wait (quarantined) for it to come back with a matching claim."""

    claim: PendingClaim


@dataclass(frozen=True, slots=True)
class MemberAdopted:
    """A member came back with a claim that matches: it keeps `owned` (what both it and
    we say it owns) with no StopFetcher, no StartFetcher, no pause."""

    member_id: str
    name: str
    capacity: int
    session_timeout_ms: int
    topics: tuple[str, ...]
    partitions: tuple[TopicPartition, ...]
    member_epoch: int
    owned: RangeSet
    at: float
    fixed_ranges: RangeSet | None = None
    topic_pattern: str | None = None
    principal: str = ANONYMOUS_PRINCIPAL


@dataclass(frozen=True, slots=True)
class QuarantineLifted:
    at: float


@dataclass(frozen=True, slots=True)
class GrantsHeld:
    """Free slots are not granted under a target that has not placed every member yet
    (members joined after its inputs): the recompute that places them is due and would
    revoke a piece of each grant. Held from `at`, for a bounded time."""

    at: float


@dataclass(frozen=True, slots=True)
class PositionsLoaded:
    tp: TopicPartition
    positions: RangePositionMap


@dataclass(frozen=True, slots=True)
class GroupConfigChanged:
    """An operator changed the group's knobs; they apply from the next decision on."""

    config: GroupConfig
    at: float


@dataclass(frozen=True, slots=True)
class AdminActed:
    """An admin call changed the group: its audit trail keeps who, what and when."""

    entry: AuditEntry


@dataclass(frozen=True, slots=True)
class PartitionsChanged:
    """The group's topics and partitions as the cluster has them now (a partition added,
    a topic created that matches the group's pattern, a topic deleted), and the
    transitions that follow (coordinator.group.growth). A partition left out is no longer
    the group's: its positions go with it."""

    topics: tuple[str, ...]
    partitions: tuple[TopicPartition, ...]
    transitions: tuple[Transition, ...]
    at: float
    topic_pattern: str | None = None


@dataclass(frozen=True, slots=True)
class TransitionsChanged:
    """A transition got its fence, or ended (coordinator.group.growth.transitions_due)."""

    transitions: tuple[Transition, ...]


@dataclass(frozen=True, slots=True)
class EndsObserved:
    """Partition ends the coordinator read itself (ListOffsets checked by a fetch), for
    partitions no member may have reported yet: lag covers a partition from the moment
    it exists. Read by a read_committed reader: last stable offsets."""

    ends: tuple[tuple[TopicPartition, int], ...]


Record = (
    MemberJoined
    | MemberHeard
    | MemberContacted
    | PositionsAdvanced
    | PositionsReset
    | TargetComputed
    | RebalanceRequested
    | ImbalanceObserved
    | RangesRevoked
    | DrainStarted
    | RangesReleased
    | RangesGranted
    | GrantAcknowledged
    | MemberRemoved
    | ClaimAwaited
    | MemberAdopted
    | QuarantineLifted
    | GrantsHeld
    | PositionsLoaded
    | GroupConfigChanged
    | AdminActed
    | PartitionsChanged
    | TransitionsChanged
    | EndsObserved
)
