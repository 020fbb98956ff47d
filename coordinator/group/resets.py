"""Resetting a group's positions: the operator's repair, as `kafka-consumer-groups
--reset-offsets` is Kafka's.

A reset moves the positions of some slots of some partitions to one offset per partition
(earliest, latest, an offset, a timestamp's, the group's committed Kafka offset: the
runtime asks Kafka which, `coordinator.runtime.operations`), backwards or forwards. It
is refused while a member owns any of those slots, or may come back for them (a pending
claim): such a member reports positions from where it runs, and positions merge by
union, so its next report would undo a backward reset. This is Kafka's rule, which
refuses a reset for an active group; a member fenced first (or stopped) no longer counts:
its reports are refused, and its quarantined slots wait out its lease as always.

The reset is one `PositionsReset` record per partition, which replaces rather than
unites. The state log loads a partition's positions as the union of its chunks, where a
stale chunk can only say less, except across a backward reset; so the reset is stored as
a marker ahead of the rewritten positions, and a load lets a chunk older than the marker
say nothing about the slots it reset (`coordinator.storage.image`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.records import PositionsReset, Record
from keyshard.coordinator.group.state import GroupState
from keyshard.core.model.positions import Position, TopicPartition
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.messages import ErrorCode


class ResetTo(StrEnum):
    """Where a reset moves positions to (kafka-consumer-groups' --to-* options)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSET = "offset"
    DATETIME = "datetime"
    COMMITTED = "committed"


@dataclass(frozen=True, slots=True)
class ResetTarget:
    to: ResetTo
    offset: int | None = None  # with ResetTo.OFFSET
    timestamp_ms: int | None = None  # with ResetTo.DATETIME: ms since the epoch

    def __str__(self) -> str:
        if self.to is ResetTo.OFFSET:
            return f"offset {self.offset}"
        if self.to is ResetTo.DATETIME:
            return f"timestamp {self.timestamp_ms} ms"
        return str(self.to)


class ResetTargetMissing(LookupError):
    """A reset names what is not there: a topic or partition the group does not read, or
    a committed Kafka offset that does not exist."""


@dataclass(frozen=True, slots=True)
class ResetScope:
    """The partitions and slots a reset covers."""

    partitions: tuple[TopicPartition, ...]
    slots: RangeSet


@dataclass(frozen=True, slots=True)
class Move:
    """One slot range of one partition: where it resumes now, and after the reset."""

    tp: TopicPartition
    slots: SlotRange
    before: int
    after: int


def scope_of(
    state: GroupState,
    topic: str | None = None,
    partition: int | None = None,
    slots: RangeSet | None = None,
) -> ResetScope:
    """The group's partitions a reset names (all; a topic's; partition `partition` of
    each topic, or of `topic`), and its slots (all unless given). Raises
    ResetTargetMissing when that is no partition of the group."""
    partitions = tuple(
        tp
        for tp in sorted(state.partitions)
        if (topic is None or tp[0] == topic) and (partition is None or tp[1] == partition)
    )
    if not partitions:
        what = "any partition" if topic is None else topic
        if partition is not None:
            what = f"{what}:{partition}" if topic is not None else f"a partition {partition}"
        raise ResetTargetMissing(f"group {state.group!r} does not read {what}")
    return ResetScope(partitions, RangeSet.full() if slots is None else slots)


def blockers(state: GroupState, slots: RangeSet) -> dict[str, RangeSet]:
    """Members that own some of `slots` or may come back for them, with those slots."""
    found: dict[str, RangeSet] = {}
    for member in state.members.values():
        if overlap := member.owned & slots:
            found[member.member_id] = overlap
    for claim in state.claims.values():
        if overlap := claim.owned & slots:
            found[claim.member_id] = found.get(claim.member_id, RangeSet()) | overlap
    return found


def within_log(
    offsets: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Each offset moved into its partition's log, as kafka-consumer-groups does: below
    the log start is the log start, past the end is the end."""
    return {tp: max(earliest[tp], min(offset, latest[tp])) for tp, offset in offsets.items()}


def planned(
    state: GroupState, scope: ResetScope, offsets: Mapping[TopicPartition, int]
) -> list[Move]:
    """Every slot range of the scope with its next offset now and after the reset (what
    a dry run shows)."""
    return [
        Move(tp, slots, position.next_offset, offsets[tp])
        for tp in scope.partitions
        for slots, position in state.position_map(tp).segments(scope.slots)
    ]


def reset_positions(
    state: GroupState, scope: ResetScope, offsets: Mapping[TopicPartition, int], now: float
) -> Result:
    """Move the scope's positions to `offsets` (one per partition), or refuse while a
    member owns or may reclaim some of its slots (see the module docstring).

    1. Refuse if any slot of the scope is owned, or awaited from a member that may
       come back (`blockers`), naming the members.
    2. One PositionsReset per partition: the slots resume at the offset, nothing above
       it counted as done.
    """
    owners = blockers(state, scope.slots)
    if owners:
        return Result(error=(ErrorCode.INVALID_RANGES, owned_message(state.group, owners)))
    records: list[Record] = [
        PositionsReset(tp, scope.slots, Position(offsets[tp]), now) for tp in scope.partitions
    ]
    return Result(records=records)


def _slots(ranges: RangeSet) -> str:
    return ", ".join(f"{r.start}-{r.end}" for r in ranges)


def owned_message(group: str, owners: Mapping[str, RangeSet]) -> str:
    named = "; ".join(f"{mid} (slots {_slots(ranges)})" for mid, ranges in sorted(owners.items()))
    return (
        f"group {group!r}: members own slots of the reset: {named}; stop or fence them "
        "first (their slots are free once their lease has run out)"
    )
