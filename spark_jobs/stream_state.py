"""Ownership and commit bookkeeping of the streaming source's member. Pure, no I/O.

The driver-side reader is one coordinated-consumer member whose "fetchers" are Spark
micro-batches. This object answers, for the I/O shell (`spark_jobs.stream`):

- what to plan next: the active grants (StartFetcher ranges with the positions they were
  handed), minus ranges being stopped;
- which planned batches are committed: every offset the shell plans or sees planned is
  numbered; a commit signal (Spark's `commit(end)`, or `latestOffset(start)`, which Spark
  only calls once `start`'s batch is in its commit log) marks it and all before it done;
- when a StopFetcher may be answered: once the last planned batch that covered the range
  is committed, with the committed frontier (united with the handed-over positions) as the
  final positions;
- what to report on Ping and Leave: the same, for every owned range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keyshard.core.model.positions import PositionUpdate, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.spark_jobs.offsets import GrantView, StreamOffset, grant_positions, positions_within


@dataclass
class StreamGrant:
    slots: RangeSet
    positions: dict[TopicPartition, RangePositionMap]
    stop_after: int | None = None  # stopping: answer once this planned batch is committed


@dataclass
class SourceState:
    grants: list[StreamGrant] = field(default_factory=list)
    planned: dict[int, StreamOffset] = field(default_factory=dict)  # seq -> batch end
    next_seq: int = 0
    committed_seq: int = -1
    committed: StreamOffset = field(default_factory=StreamOffset)

    # ---- ownership ----------------------------------------------------------------------

    def start(self, slots: RangeSet, positions: PositionUpdate) -> None:
        """A grant; or an extension (docs/protocol.md §4.6): slots already planned, with
        the positions of partitions added to the group, which join the grants that plan
        those slots (a slot in two grants would be reported twice)."""
        active = [g for g in self.grants if g.stop_after is None and g.slots & slots]
        covered = RangeSet()
        for grant in active:
            covered = covered | grant.slots
        if not active or slots - covered:
            self.grants.append(StreamGrant(slots, grant_positions(positions)))
            return
        for grant in active:
            for tp, pmap in grant_positions(positions).items():
                mine = grant.positions.setdefault(tp, RangePositionMap())
                mine.update(pmap.segments(grant.slots & slots))

    def begin_stop(self, slots: RangeSet) -> None:
        """Stop planning `slots`; they are released once the batches covering them commit."""
        kept: list[StreamGrant] = []
        for grant in self.grants:
            stopping = grant.slots & slots
            if not stopping or grant.stop_after is not None:
                kept.append(grant)
                continue
            rest = grant.slots - slots
            if rest:
                kept.append(StreamGrant(rest, grant.positions))
            kept.append(
                StreamGrant(stopping, grant.positions, self._last_planned_covering(stopping))
            )
        self.grants = kept

    def stop_ready(self, slots: RangeSet) -> bool:
        return all(
            g.stop_after is None or g.stop_after <= self.committed_seq
            for g in self.grants
            if g.slots & slots
        )

    def finish_stop(self, slots: RangeSet) -> PositionUpdate:
        """Final positions of `slots`, and forget them."""
        final = self.positions(slots)
        kept = []
        for grant in self.grants:
            rest = grant.slots - slots
            if rest:
                kept.append(StreamGrant(rest, grant.positions, grant.stop_after))
        self.grants = kept
        return final

    def clear(self) -> None:
        """The session is lost: the coordinator will hand our ranges on from our last report."""
        self.grants = []

    def active(self) -> list[GrantView]:
        return [GrantView(g.slots, g.positions) for g in self.grants if g.stop_after is None]

    @property
    def owned(self) -> RangeSet:
        owned = RangeSet()
        for grant in self.grants:
            owned = owned | grant.slots
        return owned

    # ---- batches --------------------------------------------------------------------------

    def planned_offset(self, offset: StreamOffset) -> None:
        """`offset` is (or may become) the end of a batch Spark runs."""
        last = self.planned.get(self.next_seq - 1)
        if last is None or last != offset:
            self.planned[self.next_seq] = offset
            self.next_seq += 1

    def committed_offset(self, offset: StreamOffset) -> None:
        """Spark has written every batch up to the one ending at `offset`.

        An offset we never planned is the checkpoint of an earlier run of the query: it is
        the committed frontier until one of our own batches commits. Older signals than the
        current one are ignored: commits never go back.
        """
        for seq in sorted(self.planned, reverse=True):
            if seq > self.committed_seq and self.planned[seq] == offset:
                self.committed_seq = seq
                self.committed = offset
                for old in [s for s in self.planned if s < seq]:
                    del self.planned[old]
                return
        if self.committed_seq < 0:
            self.committed = offset

    def _last_planned_covering(self, slots: RangeSet) -> int:
        for seq in sorted(self.planned, reverse=True):
            if seq <= self.committed_seq:
                break
            if any(piece.overlaps(slots) for piece in self.planned[seq].pieces):
                return seq
        return self.committed_seq

    # ---- reports --------------------------------------------------------------------------

    def positions(self, within: RangeSet | None = None) -> PositionUpdate:
        update: PositionUpdate = {}
        for grant in self.grants:
            slots = grant.slots if within is None else grant.slots & within
            if slots:
                for tp, segs in positions_within(
                    self.committed.done, slots, grant.positions
                ).items():
                    update.setdefault(tp, []).extend(segs)
        return update
