"""Fetch filter and position bookkeeping for one consumer: pure, no I/O.

A consumer owns *grants*: slot ranges started by one StartFetcher, each with the position
map where the previous owner stopped. The partition is read once, from the lowest
position of any grant, and every record is checked against its slot's grant: not owned,
already done by a previous owner, or already examined before a rewind -> skipped; else it
becomes pending until the handler acknowledges it. Positions reported to the coordinator
are the grant's start map united with "everything examined, minus what is pending", which
is exact enough to hand the range to someone else with no loss and no duplicates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coordinator.group import PositionUpdate, TopicPartition
from coordinator.positions import Position, RangePositionMap
from coordinator.ranges import EMPTY, RangeSet, SlotRange


@dataclass(slots=True)
class Grant:
    slots: RangeSet
    start: RangePositionMap  # previous owner's positions (only `slots` matter)
    fetch_from: int  # lowest next offset over `slots`
    skip_below: int = 0  # records below this were examined before a rewind
    # Set by StopFetcher: nothing more is admitted and progress is frozen here, so records
    # fetched during the drain are not mistaken for done.
    frozen_upto: int | None = None
    # No offset at or above this is done in `start` (for any slot of the grant): the
    # per-record position lookup is skipped above it, which is nearly always.
    start_done_below: int = -1

    def __post_init__(self) -> None:
        if self.start_done_below < 0:
            self.start_done_below = _done_ceiling(self.start, self.slots)


def _done_ceiling(start: RangePositionMap, slots: RangeSet) -> int:
    ceiling = 0
    for _, pos in start.segments(slots):
        ceiling = max(ceiling, pos.next_offset, pos.acked[-1][1] if pos.acked else 0)
    return ceiling


@dataclass(slots=True)
class PartitionProgress:
    tp: TopicPartition
    grants: list[Grant] = field(default_factory=list)
    cursor: int = 0  # next offset the fetcher will hand us
    generation: int = 0  # bumped on every rewind: records fetched before it are stale
    pending: dict[int, int] = field(default_factory=dict)  # offset -> slot
    # The slot range last matched by `grant_for` and its grant: a consumer usually owns a
    # few wide ranges, so most records hit it. Reset whenever the grants change.
    _hit: tuple[int, int, Grant] | None = None

    def set_grants(self, grants: list[Grant]) -> None:
        self.grants = grants
        self._hit = None

    def grant_for(self, slot: int) -> Grant | None:
        hit = self._hit
        if hit is not None and hit[0] <= slot <= hit[1]:
            return hit[2]
        for grant in self.grants:
            for r in grant.slots.ranges:
                if r.start <= slot <= r.end:
                    self._hit = (r.start, r.end, grant)
                    return grant
        return None

    def accept(self, offset: int, slot: int) -> bool:
        """The fetch filter for one record (advances the cursor); the caller marks it
        pending unless its handler already completed."""
        if offset < self.cursor:
            return False
        self.cursor = offset + 1
        grant = self.grant_for(slot)
        if grant is None or grant.frozen_upto is not None or offset < grant.skip_below:
            return False
        return offset >= grant.start_done_below or not grant.start.get(slot).is_done(offset)

    def done_upto(self, grant: Grant) -> int:
        if grant.frozen_upto is not None:
            return grant.frozen_upto
        return max(self.cursor, grant.skip_below, grant.fetch_from)


class ConsumerProgress:
    """All partitions of one consumer session."""

    def __init__(self) -> None:
        self.partitions: dict[TopicPartition, PartitionProgress] = {}

    # ---- ownership ------------------------------------------------------------------

    @property
    def owned(self) -> RangeSet:
        owned = EMPTY
        for progress in self.partitions.values():
            for grant in progress.grants:
                owned = owned | grant.slots
        return owned

    def add_grant(self, slots: RangeSet, positions: PositionUpdate) -> dict[TopicPartition, int]:
        """Start `slots` on every partition in `positions`; returns the partitions whose
        fetch position must move (tp -> offset to seek to)."""
        seeks: dict[TopicPartition, int] = {}
        for tp, segments in positions.items():
            start = RangePositionMap()
            start.update(segments)
            fetch_from = start.minimum_offset(slots)
            progress = self.partitions.get(tp)
            if progress is None:
                progress = self.partitions[tp] = PartitionProgress(tp, cursor=fetch_from)
                seeks[tp] = fetch_from
            elif not progress.grants:
                progress.cursor = fetch_from
                progress.generation += 1
                seeks[tp] = fetch_from
            elif fetch_from < progress.cursor:
                # Rewind: earlier grants skip what they have already examined.
                for grant in progress.grants:
                    grant.skip_below = max(grant.skip_below, progress.cursor)
                progress.cursor = fetch_from
                progress.generation += 1
                seeks[tp] = fetch_from
            progress.set_grants([*progress.grants, Grant(slots, start, fetch_from)])
        return seeks

    def begin_stop(self, slots: RangeSet) -> None:
        """From now on nothing of `slots` is dispatched; in-flight work may still finish.

        The stopping part of each grant is split off and frozen at what has been examined
        so far: the fetcher keeps reading for the other slots, and those later records of
        `slots` must stay undone for the next owner.
        """
        for progress in self.partitions.values():
            split: list[Grant] = []
            for grant in progress.grants:
                stopping = grant.slots & slots
                if not stopping or grant.frozen_upto is not None:
                    split.append(grant)
                    continue
                frozen = Grant(
                    stopping, grant.start, grant.fetch_from, grant.skip_below,
                    frozen_upto=progress.done_upto(grant),
                    start_done_below=grant.start_done_below,
                )  # fmt: skip
                grant.slots = grant.slots - slots
                if grant.slots:
                    split.append(grant)
                split.append(frozen)
            progress.set_grants(split)

    def finish_stop(self, slots: RangeSet) -> PositionUpdate:
        """Final positions of `slots`, then forget them (pending records of them included:
        they were not done, so the next owner processes them)."""
        final = self.positions(slots)
        for progress in self.partitions.values():
            kept = []
            for grant in progress.grants:
                grant.slots = grant.slots - slots
                if grant.slots:
                    kept.append(grant)
            progress.set_grants(kept)
            for offset in [o for o, s in progress.pending.items() if s in slots]:
                del progress.pending[offset]
        return final

    def clear(self) -> None:
        self.partitions.clear()

    # ---- the fetch filter -----------------------------------------------------------

    def admit(self, tp: TopicPartition, offset: int, slot: int) -> bool:
        """Should this record go to the handler? Also advances the partition cursor."""
        progress = self.partitions.get(tp)
        if progress is None or not progress.accept(offset, slot):
            return False
        progress.pending[offset] = slot
        return True

    def ack(self, tp: TopicPartition, offset: int) -> None:
        progress = self.partitions.get(tp)
        if progress is not None:
            progress.pending.pop(offset, None)

    def pending_count(self) -> int:
        return sum(len(p.pending) for p in self.partitions.values())

    # ---- reporting ------------------------------------------------------------------

    def positions(self, within: RangeSet | None = None) -> PositionUpdate:
        update: PositionUpdate = {}
        for tp, progress in self.partitions.items():
            segments: list[tuple[SlotRange, Position]] = []
            for grant in progress.grants:
                slots = grant.slots if within is None else grant.slots & within
                if not slots:
                    continue
                pending = sorted(o for o, s in progress.pending.items() if s in slots)
                done = Position.from_done(
                    _gaps(grant.fetch_from, progress.done_upto(grant), pending)
                )
                segments.extend((seg, pos.union(done)) for seg, pos in grant.start.segments(slots))
            if segments:
                update[tp] = segments
        return update


def _gaps(start: int, end: int, holes: Iterable[int]) -> list[tuple[int, int]]:
    """[start, end) minus the given sorted offsets, as half-open intervals."""
    out: list[tuple[int, int]] = []
    cursor = start
    for hole in holes:
        if hole >= end:
            break
        if hole >= cursor:
            if hole > cursor:
                out.append((cursor, hole))
            cursor = hole + 1
    if cursor < end:
        out.append((cursor, end))
    return out
