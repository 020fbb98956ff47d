"""Streaming offsets of the `keyshard` source: range position maps as Spark offsets. Pure.

A `StreamOffset` is what Spark checkpoints after each micro-batch:

- `done`: per topic-partition, a range position map (slot -> `Position`) of everything the
  query has planned into batches up to this one, plus what it knew to be done by others
  when it was granted a range. Slots the query does not own keep their last value (they are
  not read), so the checkpoint never forgets what this query already wrote.
- `base`: for slots granted since the previous offset, the position they start from
  (what the coordinator handed over, united with our own checkpoint). A batch reads, per
  slot, `done(end) - (done(start) | base(end))`; so planning needs nothing but the two
  offsets, and Spark can re-plan a logged batch after a restart in a fresh process.
- `pieces`: how the owned slots are cut into Spark partitions (one per topic-partition x
  piece), fixed when the offset is made so a re-planned batch has the same partitions.

JSON (canonical: unset slots and empty maps are left out, so equal offsets are equal JSON):
`{"v": 1, "done": {"topic": {"0": [[first_slot, last_slot, next_offset, [[a, b], ...]]]}},
"base": {...same...}, "pieces": [[[first_slot, last_slot], ...], ...]}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import Position, PositionUpdate, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.spark_jobs.planning import ReadSlice, SourceError

OFFSET_VERSION = 1

Frontier = dict[TopicPartition, RangePositionMap]


@dataclass(frozen=True)
class StreamOffset:
    done: Frontier = field(default_factory=dict)
    base: Frontier = field(default_factory=dict)
    pieces: tuple[RangeSet, ...] = ()

    def at(self, tp: TopicPartition) -> RangePositionMap:
        return self.done.get(tp) or RangePositionMap()

    def to_json(self) -> dict[str, Any]:
        return {
            "v": OFFSET_VERSION,
            "done": _frontier_to_json(self.done),
            "base": _frontier_to_json(self.base),
            "pieces": [[list(p) for p in piece.to_pairs()] for piece in self.pieces],
        }

    @classmethod
    def from_json(cls, data: Any) -> StreamOffset:
        """Decode a checkpointed offset; anything malformed is a `SourceError`."""
        if not isinstance(data, dict) or data.get("v") != OFFSET_VERSION:
            raise SourceError(f"not a keyshard offset (version {OFFSET_VERSION}): {data!r:.200}")
        try:
            pieces = tuple(RangeSet.from_pairs(piece) for piece in data.get("pieces", []))
            return cls(
                _frontier_from_json(data.get("done", {})),
                _frontier_from_json(data.get("base", {})),
                pieces,
            )
        except (TypeError, ValueError, KeyError, IndexError) as err:
            raise SourceError(f"malformed keyshard offset: {err}: {data!r:.200}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamOffset) and self.to_json() == other.to_json()

    def __hash__(self) -> int:  # pragma: no cover - offsets are not used as keys
        return hash(repr(self.to_json()))


def _frontier_to_json(frontier: Frontier) -> dict[str, dict[str, list[Any]]]:
    out: dict[str, dict[str, list[Any]]] = {}
    for (topic, partition), pmap in sorted(frontier.items()):
        segments = [seg for seg in pmap.to_json() if seg[2:] != [0, []]]
        if segments:
            out.setdefault(topic, {})[str(partition)] = segments
    return out


def _frontier_from_json(data: Any) -> Frontier:
    if not isinstance(data, dict):
        raise TypeError("a frontier must be an object")
    frontier: Frontier = {}
    for topic, parts in data.items():
        for partition, segments in parts.items():
            pmap = RangePositionMap()
            for first, last, next_offset, acked in segments:
                pmap.assign(
                    SlotRange(int(first), int(last)), Position.from_json([next_offset, acked])
                )
            frontier[(str(topic), int(partition))] = pmap
    return frontier


# ---- making the next offset -----------------------------------------------------------


@dataclass(frozen=True)
class GrantView:
    """An owned range as the planner sees it: its slots and the handed-over positions."""

    slots: RangeSet
    positions: Mapping[TopicPartition, RangePositionMap]


def grant_positions(update: PositionUpdate) -> dict[TopicPartition, RangePositionMap]:
    out: dict[TopicPartition, RangePositionMap] = {}
    for tp, segments in update.items():
        pmap = out.setdefault(tp, RangePositionMap())
        pmap.update(segments)
    return out


def split_slots(owned: RangeSet, count: int) -> tuple[RangeSet, ...]:
    """Cut `owned` into up to `count` pieces of (nearly) equal slot counts, in slot order."""
    total = owned.size
    if total == 0:
        return ()
    count = max(1, min(count, total))
    pieces: list[RangeSet] = []
    flat = [(r.start, r.end) for r in owned]
    i, cursor = 0, flat[0][0]
    for k in range(count):
        want = total * (k + 1) // count - total * k // count
        parts: list[SlotRange] = []
        while want > 0:
            end = flat[i][1]
            take = min(want, end - cursor + 1)
            parts.append(SlotRange(cursor, cursor + take - 1))
            want -= take
            cursor += take
            if cursor > end and i + 1 < len(flat):
                i += 1
                cursor = flat[i][0]
        pieces.append(RangeSet(parts))
    return tuple(pieces)


def next_offset(
    start: StreamOffset,
    grants: Sequence[GrantView],
    high_watermarks: Mapping[TopicPartition, int],
    pieces: int,
) -> StreamOffset:
    """The end of the next micro-batch: every owned slot advanced to its partition's high
    watermark, from `done(start)` united with what the grant handed over."""
    done = {tp: pmap.copy() for tp, pmap in start.done.items()}
    base: Frontier = {}
    owned = RangeSet()
    for grant in grants:
        owned = owned | grant.slots
    for tp, high in sorted(high_watermarks.items()):
        before = start.at(tp)
        after = done.setdefault(tp, RangePositionMap())
        for grant in grants:
            handed = grant.positions.get(tp) or RangePositionMap()
            for part, granted in handed.segments(grant.slots):
                for seg, mine in before.segments(RangeSet((part,))):
                    lower = mine.union(granted)
                    if lower != mine:
                        base.setdefault(tp, RangePositionMap()).assign(seg, lower)
                    after.assign(seg, lower.union(Position(high)))
    return StreamOffset(done, base, split_slots(owned, pieces))


# ---- planning a micro-batch -----------------------------------------------------------


def plan_stream(start: StreamOffset, end: StreamOffset) -> list[ReadSlice]:
    """One slice per (topic-partition x piece of `end`) that has records to read."""
    slices = []
    for tp in sorted(end.done):
        upper_map = end.done[tp]
        before = start.at(tp)
        base = end.base.get(tp) or RangePositionMap()
        for piece in end.pieces:
            segments = []
            for seg, upper, lower_mine, lower_base in _overlay(piece, upper_map, before, base):
                lower = lower_mine.union(lower_base)
                if upper.next_offset > lower.next_offset:
                    segments.append((seg, lower, upper))
            if segments:
                slices.append(ReadSlice(tp[0], tp[1], tuple(segments)))
    return slices


def _overlay(
    within: RangeSet, *maps: RangePositionMap
) -> Iterable[tuple[SlotRange, Position, Position, Position]]:
    """Elementary slot segments of `within` on which every map is constant."""
    cuts: set[int] = set()
    for pmap in maps:
        for seg, _ in pmap.segments(within):
            cuts.add(seg.start)
            if seg.end < MAX_SLOT:
                cuts.add(seg.end + 1)
    for r in within:
        points = sorted({r.start, *(c for c in cuts if r.start < c <= r.end)})
        for i, first in enumerate(points):
            last = points[i + 1] - 1 if i + 1 < len(points) else r.end
            a, b, c = (pmap.get(first) for pmap in maps)
            yield SlotRange(first, last), a, b, c


def positions_within(
    frontier: Frontier, slots: RangeSet, floor: Mapping[TopicPartition, RangePositionMap]
) -> PositionUpdate:
    """What to report for `slots`: the committed frontier united with the handed-over
    positions (`floor`), so a report never claims less than what the grant started from."""
    update: PositionUpdate = {}
    for tp in sorted(set(frontier) | set(floor)):
        mine = frontier.get(tp) or RangePositionMap()
        given = floor.get(tp) or RangePositionMap()
        segments = [
            (seg, a.union(b)) for seg, a, b, _ in _overlay(slots, mine, given, RangePositionMap())
        ]
        if segments:
            update[tp] = segments
    return update
