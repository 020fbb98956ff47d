"""Range position maps: what "committed" means when one partition is shared by many owners.

Consumers process keys concurrently, so acknowledgements complete out of order and a single
committed offset per partition cannot describe progress. A `Position` is the next offset to
process plus the acknowledged offsets above it (run-length intervals); a
`RangePositionMap` is a piecewise-constant map slot -> Position over the whole slot space of
one topic-partition. Both are immutable values or mutated only through explicit methods, so
the coordinator's `replay` and the consumer's fetch filter can share them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedDict

from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.ranges import RangeSet, SlotRange

Interval = tuple[int, int]  # half-open [start, end) of offsets
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Position:
    """Everything below `next_offset` is done, and so is every offset inside `acked`."""

    next_offset: int = 0
    acked: tuple[Interval, ...] = ()

    def is_done(self, offset: int) -> bool:
        if offset < self.next_offset:
            return True
        for start, end in self.acked:
            if offset < start:
                return False
            if offset < end:
                return True
        return False

    def union(self, other: Position) -> Position:
        """Done in either: merging what two owners of the same slots have finished."""
        return Position.from_done(
            ((0, self.next_offset), (0, other.next_offset), *self.acked, *other.acked)
        )

    @classmethod
    def from_done(cls, intervals: Iterable[Interval]) -> Position:
        """Normalize a set of done intervals; an interval starting at 0 becomes next_offset."""
        merged: list[list[int]] = []
        for start, end in sorted(i for i in intervals if i[0] < i[1]):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        next_offset = 0
        if merged and merged[0][0] == 0:
            next_offset = merged.pop(0)[1]
        return cls(next_offset, tuple((s, e) for s, e in merged))

    def to_json(self) -> list[Any]:
        return [self.next_offset, [list(i) for i in self.acked]]

    @classmethod
    def from_json(cls, data: list[Any]) -> Position:
        return cls.from_done([(0, int(data[0])), *((int(a), int(b)) for a, b in data[1])])


class RangePositionMap:
    """slot -> Position for one topic-partition, stored as merged segments.

    The map always covers every slot (a segment starts at slot 0), so lookups never miss;
    a never-consumed partition is one segment at `Position(0)`.
    """

    __slots__ = ("_starts",)

    def __init__(self, default: Position | None = None) -> None:
        self._starts: SortedDict = SortedDict({0: default or Position()})

    def copy(self) -> RangePositionMap:
        clone = RangePositionMap()
        clone._starts = self._starts.copy()
        return clone

    def get(self, slot: int) -> Position:
        idx = self._starts.bisect_right(slot) - 1
        return self._starts.peekitem(idx)[1]  # type: ignore[no-any-return]

    def segments(self, within: RangeSet | None = None) -> list[tuple[SlotRange, Position]]:
        """Every segment in slot order, or only the parts inside `within`: those are found
        by bisection, so a member's few ranges cost O(log n) each, not a walk of the map
        (one map holds every member's positions)."""
        if within is not None:
            return self._clipped(within)
        items = list(self._starts.items())
        ends = [start - 1 for start, _ in items[1:]] + [MAX_SLOT]
        return [(SlotRange(start, end), pos) for (start, pos), end in zip(items, ends, strict=True)]

    def _clipped(self, within: RangeSet) -> list[tuple[SlotRange, Position]]:
        starts = self._starts
        keys = starts.keys()
        n = len(keys)
        clipped: list[tuple[SlotRange, Position]] = []
        for r in within:
            i = starts.bisect_right(r.start) - 1
            while i < n:
                start = keys[i]
                if start > r.end:
                    break
                end = keys[i + 1] - 1 if i + 1 < n else MAX_SLOT
                clipped.append((SlotRange(max(start, r.start), min(end, r.end)), starts[start]))
                i += 1
        return clipped

    def assign(self, slots: SlotRange, position: Position) -> None:
        after = slots.end + 1
        if after <= MAX_SLOT and after not in self._starts:
            self._starts[after] = self.get(after)
        for key in list(self._starts.irange(slots.start, slots.end)):
            del self._starts[key]
        self._starts[slots.start] = position
        self._coalesce_around(slots.start)
        if after <= MAX_SLOT:
            self._coalesce_around(after)

    def update(self, segments: Iterable[tuple[SlotRange, Position]]) -> None:
        for slots, position in segments:
            self.assign(slots, position)

    def minimum_offset(self, within: RangeSet | None = None) -> int:
        """Lowest next offset: where a fetcher of these slots must start, and what is safe
        to commit as a plain Kafka offset for tooling."""
        segs = self.segments(within)
        return min((p.next_offset for _, p in segs), default=0)

    def _coalesce_around(self, key: int) -> None:
        if key not in self._starts:
            return
        idx = self._starts.index(key)
        if idx > 0 and self._starts.peekitem(idx - 1)[1] == self._starts[key]:
            del self._starts[key]

    def __len__(self) -> int:
        return len(self._starts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangePositionMap) and list(self._starts.items()) == list(
            other._starts.items()
        )

    def to_json(self) -> list[Any]:
        return [[s.start, s.end, *p.to_json()] for s, p in self.segments()]

    @classmethod
    def from_json(cls, data: list[Any]) -> RangePositionMap:
        m = cls()
        m.update((SlotRange(int(s), int(e)), Position.from_json([n, a])) for s, e, n, a in data)
        return m


PositionUpdate = dict[TopicPartition, list[tuple[SlotRange, Position]]]
"""Positions of some slot ranges per partition: what a Ping, StopFetcher or Leave reply
reports and what a StartFetcher hands over."""
