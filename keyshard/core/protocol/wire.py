"""Conversions between the pure core's values and the protocol's wire models."""

from __future__ import annotations

from collections.abc import Iterable

from keyshard.core.model.positions import Position, PositionUpdate
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.messages import PartitionPositions, PositionModel, RangePosition


def ranges_to_wire(ranges: RangeSet) -> list[tuple[int, int]]:
    return ranges.to_pairs()


def ranges_from_wire(pairs: Iterable[tuple[int, int]]) -> RangeSet:
    return RangeSet.from_pairs(pairs)


def positions_to_wire(update: PositionUpdate) -> list[PartitionPositions]:
    return [
        PartitionPositions(
            topic=topic,
            partition=partition,
            ranges=[
                RangePosition(
                    range=seg.to_pair(),
                    position=PositionModel(next_offset=pos.next_offset, acked=list(pos.acked)),
                )
                for seg, pos in segments
            ],
        )
        for (topic, partition), segments in update.items()
    ]


def positions_from_wire(wire: Iterable[PartitionPositions]) -> PositionUpdate:
    update: PositionUpdate = {}
    for pp in wire:
        segments = update.setdefault((pp.topic, pp.partition), [])
        for rp in pp.ranges:
            segments.append(
                (
                    SlotRange(*rp.range),
                    Position.from_done(
                        [(0, rp.position.next_offset), *((a, b) for a, b in rp.position.acked)]
                    ),
                )
            )
    return update
