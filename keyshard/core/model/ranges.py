"""Slot ranges and normalized sets of them.

Ranges are inclusive on both ends, as in Pulsar's `Range` and in the wire protocol. A
`RangeSet` is always normalized (sorted, disjoint, adjacent ranges merged), so equality of
sets is equality of ownership, and set algebra is how the coordinator computes handoffs:
`owned - target` is what a member must stop, `target & free` what it may start.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import NamedTuple

from keyshard.core.model.hashing import MAX_SLOT, SLOT_COUNT


class _Bounds(NamedTuple):
    start: int
    end: int  # inclusive


class SlotRange(_Bounds):
    """An inclusive range of slots: the one shape every part of keyshard uses.

    A validated tuple: ordered, hashed and unpacked like `(start, end)`, so the
    strategies can keep sorted lists of ranges and bisect them at tuple speed.
    """

    __slots__ = ()

    def __new__(cls, start: int, end: int) -> SlotRange:
        if not 0 <= start <= end <= MAX_SLOT:
            raise ValueError(f"invalid slot range [{start}, {end}]")
        return super().__new__(cls, start, end)

    @property
    def size(self) -> int:
        return self.end - self.start + 1

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and self.start <= slot <= self.end

    def to_pair(self) -> tuple[int, int]:
        return (self.start, self.end)

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"


class RangeSet:
    """An immutable, normalized set of slots stored as ranges."""

    __slots__ = ("_ranges",)

    def __init__(self, ranges: Iterable[SlotRange] = ()) -> None:
        self._ranges: tuple[SlotRange, ...] = _normalize(ranges)

    @classmethod
    def _of(cls, normalized: tuple[SlotRange, ...]) -> RangeSet:
        rs = cls.__new__(cls)
        rs._ranges = normalized
        return rs

    @classmethod
    def full(cls) -> RangeSet:
        return cls((SlotRange(0, MAX_SLOT),))

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, int] | list[int]]) -> RangeSet:
        return cls(SlotRange(int(p[0]), int(p[1])) for p in pairs)

    @property
    def ranges(self) -> tuple[SlotRange, ...]:
        return self._ranges

    def to_pairs(self) -> list[tuple[int, int]]:
        return [r.to_pair() for r in self._ranges]

    @property
    def size(self) -> int:
        return sum(r.size for r in self._ranges)

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __iter__(self) -> Iterator[SlotRange]:
        return iter(self._ranges)

    def __len__(self) -> int:
        return len(self._ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self._ranges == other._ranges

    def __hash__(self) -> int:
        return hash(self._ranges)

    def __repr__(self) -> str:
        return "RangeSet(" + ", ".join(str(r) for r in self._ranges) + ")"

    def __contains__(self, slot: object) -> bool:
        if not isinstance(slot, int):
            return False
        lo, hi = 0, len(self._ranges)
        while lo < hi:
            mid = (lo + hi) // 2
            r = self._ranges[mid]
            if slot < r.start:
                hi = mid
            elif slot > r.end:
                lo = mid + 1
            else:
                return True
        return False

    def __or__(self, other: RangeSet) -> RangeSet:
        return RangeSet(self._ranges + other._ranges)

    def __and__(self, other: RangeSet) -> RangeSet:
        out: list[SlotRange] = []
        i = j = 0
        a, b = self._ranges, other._ranges
        if len(a) > len(b):
            a, b = b, a
        if len(a) * _LOPSIDED < len(b):
            # A few ranges against many (a grant against the free slots of a group with
            # thousands of members): look up only the window each one touches.
            for r in a:
                j = bisect_left(b, r.start, key=_END)
                while j < len(b) and b[j].start <= r.end:
                    out.append(SlotRange(max(r.start, b[j].start), min(r.end, b[j].end)))
                    j += 1
            return RangeSet._of(tuple(out))
        while i < len(a) and j < len(b):
            lo = max(a[i].start, b[j].start)
            hi = min(a[i].end, b[j].end)
            if lo <= hi:
                out.append(SlotRange(lo, hi))
            if a[i].end < b[j].end:
                i += 1
            else:
                j += 1
        return RangeSet(out)

    def __sub__(self, other: RangeSet) -> RangeSet:
        if len(other._ranges) * _LOPSIDED < len(self._ranges):
            # Many minus a few: cut each one out of its window, not a walk over all.
            out = list(self._ranges)
            for r in other._ranges:
                i = bisect_left(out, r.start, key=_END)
                j, kept = i, []
                while j < len(out) and out[j].start <= r.end:
                    x = out[j]
                    if x.start < r.start:
                        kept.append(SlotRange(x.start, r.start - 1))
                    if x.end > r.end:
                        kept.append(SlotRange(r.end + 1, x.end))
                    j += 1
                out[i:j] = kept
            return RangeSet._of(tuple(out))
        return self & other.complement()

    def complement(self) -> RangeSet:
        out: list[SlotRange] = []
        cursor = 0
        for r in self._ranges:
            if r.start > cursor:
                out.append(SlotRange(cursor, r.start - 1))
            cursor = r.end + 1
        if cursor < SLOT_COUNT:
            out.append(SlotRange(cursor, MAX_SLOT))
        return RangeSet(out)

    def overlaps(self, other: RangeSet) -> bool:
        return bool(self & other)


_LOPSIDED = 8  # one operand this many times shorter than the other: bisect, don't walk
_END = attrgetter("end")


def _normalize(ranges: Iterable[SlotRange]) -> tuple[SlotRange, ...]:
    ordered = sorted(ranges)
    merged: list[SlotRange] = []
    for r in ordered:
        if merged and r.start <= merged[-1].end + 1:
            last = merged[-1]
            if r.end > last.end:
                merged[-1] = SlotRange(last.start, r.end)
        else:
            merged.append(r)
    return tuple(merged)


EMPTY = RangeSet()
