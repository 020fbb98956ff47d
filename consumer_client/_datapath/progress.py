"""Fetch filter and position bookkeeping for one consumer: pure, no I/O.

A consumer owns *grants*: slot ranges started by one StartFetcher, each with the position
map where the previous owner stopped. The partition is read once, from the lowest
position of any grant, and every record is checked against its slot's grant: not owned,
already done by a previous owner, or already examined before a rewind -> skipped; else it
becomes pending until the handler acknowledges it. Positions reported to the coordinator
are the grant's start map united with "everything examined, minus what is pending", which
is exact enough to hand the range to someone else with no loss and no duplicates.

A grant whose positions lie below the fetch cursor needs the records in between. When the
consumer still holds them (`_datapath.window`) the grant *replays* them from memory:
it examines [fetch_from, replay_upto) on its own cursor (`replay_cursor`) while the shared
fetcher goes on from `replay_upto`, so the other grants never wait behind a re-read.
Otherwise the partition is rewound: the fetcher seeks back and the other grants skip what
they have already examined.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from keyshard.consumer_client._membership.member_hooks import Fetched
from keyshard.core.model.hashing import LOAD_BUCKET_COUNT, LOAD_BUCKET_SHIFT
from keyshard.core.model.positions import Position, PositionUpdate, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange

FULL = RangeSet.full()


def bucket_counts() -> array[int]:
    """Zeroed counts per load bucket: an int64 buffer the C fast path increments in place."""
    return array("q", bytes(8 * LOAD_BUCKET_COUNT))


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
    # A replayed grant: records of [fetch_from, replay_upto) come from the consumer's
    # replay window, examined up to `replay_cursor`; the fetcher admits it from
    # `replay_upto` on. Equal when there is nothing (left) to replay.
    replay_cursor: int = 0
    replay_upto: int = 0

    def __post_init__(self) -> None:
        if self.start_done_below < 0:
            self.start_done_below = _done_ceiling(self.start, self.slots)

    def admit_replayed(self, offset: int, slot: int) -> bool:
        """The replay's fetch filter for one held record (advances the replay cursor)."""
        if offset < self.replay_cursor:
            return False
        self.replay_cursor = offset + 1
        if self.frozen_upto is not None or slot not in self.slots:
            return False
        return offset >= self.start_done_below or not self.start.get(slot).is_done(offset)

    def finish_replay(self) -> None:
        """Every held record below `replay_upto` was examined (offsets in between that
        were not held do not exist)."""
        if self.frozen_upto is None:
            self.replay_cursor = max(self.replay_cursor, self.replay_upto)

    def examined(self, done_upto: int) -> list[tuple[int, int]]:
        """Offsets examined for this grant, as half-open spans (pending ones included)."""
        if self.replay_cursor < self.replay_upto:
            return [(self.fetch_from, self.replay_cursor), (self.replay_upto, done_upto)]
        return [(self.fetch_from, done_upto)]


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
    # Every slot is in a grant that is not stopping: nobody else can hand this consumer a
    # range of the partition, so there is nothing to keep fetched records for.
    owns_everything: bool = False
    # Demand: records first examined in [demand_from, demand_upto) since the last Ping
    # reply, per load bucket, owned or not. Each offset counts once: a rewind re-examines
    # records below `demand_upto` without counting them again.
    demand: array[int] = field(default_factory=bucket_counts)
    demand_from: int = 0
    demand_upto: int = 0

    def __post_init__(self) -> None:
        self.demand_from = self.demand_upto = max(self.demand_upto, self.cursor)

    def set_grants(self, grants: list[Grant]) -> None:
        self.grants = grants
        self._hit = None
        owned = EMPTY
        for grant in grants:
            if grant.frozen_upto is None:
                owned = owned | grant.slots
        self.owns_everything = owned == FULL

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
        if offset >= self.demand_upto:
            self.demand[slot >> LOAD_BUCKET_SHIFT] += 1
            self.demand_upto = self.cursor
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
        self._replays: list[tuple[TopicPartition, Grant]] = []

    # ---- ownership ------------------------------------------------------------------

    def running(self) -> RangeSet:
        """Owned and not stopping (a stopping grant is frozen: its records are not
        dispatched any more, and its final positions are reported when it drains)."""
        running = EMPTY
        for progress in self.partitions.values():
            for grant in progress.grants:
                if grant.frozen_upto is None:
                    running = running | grant.slots
        return running

    @property
    def owned(self) -> RangeSet:
        owned = EMPTY
        for progress in self.partitions.values():
            for grant in progress.grants:
                owned = owned | grant.slots
        return owned

    def add_grant(
        self,
        slots: RangeSet,
        positions: PositionUpdate,
        replayable_from: Mapping[TopicPartition, int] | None = None,
    ) -> dict[TopicPartition, int]:
        """Start `slots` on every partition in `positions`; returns the partitions whose
        fetch position must move (tp -> offset to seek to). `replayable_from`: per
        partition, the lowest offset from which the consumer holds every fetched record;
        grants that can replay instead of rewinding are then listed by `take_replays`."""
        seeks: dict[TopicPartition, int] = {}
        for tp, segments in positions.items():
            start = RangePositionMap()
            start.update(segments)
            fetch_from = start.minimum_offset(slots)
            progress = self.partitions.get(tp)
            held_from = (replayable_from or {}).get(tp)
            if progress is None:
                progress = self.partitions[tp] = PartitionProgress(tp, cursor=fetch_from)
                seeks[tp] = fetch_from
            elif not progress.grants:
                progress.cursor = fetch_from
                progress.generation += 1
                seeks[tp] = fetch_from
                if progress.demand_from == progress.demand_upto < fetch_from:
                    # an empty window moves along: it must not claim offsets never read
                    progress.demand_from = progress.demand_upto = fetch_from
            elif fetch_from < progress.cursor and held_from is not None and held_from <= fetch_from:
                grant = Grant(
                    slots, start, fetch_from, replay_cursor=fetch_from, replay_upto=progress.cursor
                )
                progress.set_grants([*progress.grants, grant])
                self._replays.append((tp, grant))
                continue
            elif fetch_from < progress.cursor:
                # Rewind: earlier grants skip what they have already examined.
                for grant in progress.grants:
                    grant.skip_below = max(grant.skip_below, progress.cursor)
                progress.cursor = fetch_from
                progress.generation += 1
                seeks[tp] = fetch_from
            progress.set_grants([*progress.grants, Grant(slots, start, fetch_from)])
        return seeks

    def refetch(self, tp: TopicPartition) -> int:
        """Read `tp` again from its cursor: what was fetched beyond it and not examined
        yet is stale. Returns the offset to seek to."""
        progress = self.partitions[tp]
        progress.generation += 1
        return progress.cursor

    def take_replays(self) -> list[tuple[TopicPartition, Grant]]:
        """Grants added since the last call that replay held records (see `add_grant`)."""
        replays, self._replays = self._replays, []
        return replays

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
                frozen = replace(grant, slots=stopping, frozen_upto=progress.done_upto(grant))
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
        self._replays.clear()

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions no longer in the group: no grant, nothing pending, nothing reported."""
        gone = set(tps)
        for tp in gone:
            self.partitions.pop(tp, None)
        self._replays = [(tp, grant) for tp, grant in self._replays if tp not in gone]

    # ---- the fetch filter -----------------------------------------------------------

    def ack(self, tp: TopicPartition, offset: int) -> None:
        progress = self.partitions.get(tp)
        if progress is not None:
            progress.pending.pop(offset, None)

    def pending_count(self) -> int:
        return sum(len(p.pending) for p in self.partitions.values())

    # ---- reporting ------------------------------------------------------------------

    def take_demand(self) -> list[Fetched]:
        """What each partition's fetches brought since the last call (see `Fetched`)."""
        windows: list[Fetched] = []
        for tp, progress in self.partitions.items():
            if progress.demand_upto <= progress.demand_from:
                continue
            counts = progress.demand
            buckets = {b: n for b, n in enumerate(counts) if n}
            windows.append(Fetched(tp, progress.demand_from, progress.demand_upto, buckets))
            progress.demand = bucket_counts()
            progress.demand_from = progress.demand_upto
        return windows

    def positions(self, within: RangeSet | None = None) -> PositionUpdate:
        update: PositionUpdate = {}
        for tp, progress in self.partitions.items():
            segments: list[tuple[SlotRange, Position]] = []
            for grant in progress.grants:
                slots = grant.slots if within is None else grant.slots & within
                if not slots:
                    continue
                pending = sorted(o for o, s in progress.pending.items() if s in slots)
                examined = grant.examined(progress.done_upto(grant))
                done = Position.from_done(
                    [gap for low, high in examined for gap in _gaps(low, high, pending)]
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
