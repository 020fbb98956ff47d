"""Helpers shared by the range strategies: contiguous tilings and load prefix sums.

The strategy that promises one contiguous range per member (auto-split) starts
from `spec.current`, which may not be a tiling at all: the coordinator may drop
departed members from it (leaving gaps), or the group may have switched from a strategy
that hands out several ranges per member. `tiles_from_current` turns any previous
assignment into a tiling that keeps as much of it as possible, so it can
reason about "left and right neighbours" and "the boundary between two members".
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from keyshard.coordinator.strategies.base import MemberSpec
from keyshard.core.model.hashing import MAX_SLOT, SLOT_COUNT
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange


@dataclass(frozen=True, slots=True)
class Tile:
    """One contiguous run of the slot line; `member_id` None marks slots nobody owned."""

    member_id: str | None
    slots: SlotRange


def tiles_from_current(current: Mapping[str, RangeSet]) -> list[Tile]:
    """Cover 0..MAX_SLOT with one tile per previous member plus tiles for unowned gaps.

    Each member keeps its largest previous range (lowest start on ties; members claim in
    id order, so an overlap goes to the lower id). Its other ranges become gaps: a
    contiguous strategy cannot keep them, and reporting them as gaps lets the caller hand
    them to a neighbour by its own rule. Returns [] when nobody owned anything.
    """
    claimed = EMPTY
    picks: list[Tile] = []
    for member_id in sorted(current):
        free = current[member_id] - claimed
        if not free:
            continue
        best = max(free, key=lambda r: (r.size, -r.start))
        picks.append(Tile(member_id, best))
        claimed = claimed | RangeSet((best,))
    picks.sort(key=lambda t: t.slots)
    tiles: list[Tile] = []
    cursor = 0
    for tile in picks:
        if tile.slots.start > cursor:
            tiles.append(Tile(None, SlotRange(cursor, tile.slots.start - 1)))
        tiles.append(tile)
        cursor = tile.slots.end + 1
    if picks and cursor <= MAX_SLOT:
        tiles.append(Tile(None, SlotRange(cursor, MAX_SLOT)))
    return tiles


def sanitized_load(slot_load: Sequence[float] | None) -> list[float] | None:
    """Per-slot load with negatives and non-finite values read as 0; None if nothing measured.

    A load vector that sums to zero carries no information, so it is treated exactly like
    no measurement: callers then fall back to slot counts.
    """
    if slot_load is None:
        return None
    if len(slot_load) != SLOT_COUNT:
        raise ValueError(f"slot_load has {len(slot_load)} entries, expected {SLOT_COUNT}")
    clean = [float(v) if v > 0 else 0.0 for v in slot_load]  # NaN > 0 is False
    if not math.isfinite(sum(clean)):  # rare: an infinite rate (or an overflowing sum)
        clean = [v if math.isfinite(v) else 0.0 for v in clean]
    return clean if any(clean) else None


class LoadPrefix:
    """Prefix sums of per-slot weights: the load of any slot range in O(1).

    `prefix[i]` is the total weight of slots 0..i-1, so `load(a, b)` (inclusive) is
    `prefix[b + 1] - prefix[a]`. Weights are non-negative, so the prefix is monotone and
    "the slot where cumulative load reaches X" is a bisection.
    """

    __slots__ = ("measured", "prefix", "weights")

    def __init__(self, slot_load: Sequence[float] | None) -> None:
        clean = sanitized_load(slot_load)
        self.measured = clean is not None
        self.weights: list[float] = clean if clean is not None else [1.0] * SLOT_COUNT
        self.prefix: list[float] = [0.0, *accumulate(self.weights)]

    @property
    def total(self) -> float:
        return self.prefix[-1]

    def load(self, start: int, end: int) -> float:
        return self.prefix[end + 1] - self.prefix[start]

    def of(self, owned: RangeSet) -> float:
        return sum(self.load(r.start, r.end) for r in owned)

    def first_end_reaching(self, cumulative: float) -> int:
        """Smallest end e whose cumulative load prefix[e + 1] is >= `cumulative`."""
        return min(MAX_SLOT, max(0, bisect_left(self.prefix, cumulative) - 1))


def capacity(member: MemberSpec) -> int:
    """Capacity as `quotas` reads it: anything below 1 counts as 1."""
    return max(1, member.capacity)


def weight(member: MemberSpec) -> float:
    """What a member is given load by: its capacity at its measured speed."""
    return capacity(member) * member.speed


def describe_ranges(ranges: Iterable[SlotRange], limit: int = 8) -> str:
    """Human-readable list of ranges for notes and errors, truncated after `limit`."""
    items = list(ranges)
    text = ", ".join(str(r) for r in items[:limit])
    if len(items) > limit:
        text += f" and {len(items) - limit} more"
    return text
