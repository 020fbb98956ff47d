"""Property tests for keyshard.core.model.positions against simple reference models.

`Position` is checked against a set of done offsets; `RangePositionMap` against a plain list
slot -> Position over the whole space (65536 entries, updated with slice assignment).
"""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.core.model.hashing import MAX_SLOT, SLOT_COUNT
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange

MAX_OFFSET = 200
PROBE_OFFSETS = range(MAX_OFFSET + 10)

intervals = st.lists(
    st.tuples(st.integers(0, MAX_OFFSET - 1), st.integers(0, 40)).map(
        lambda t: (t[0], min(MAX_OFFSET, t[0] + t[1]))
    ),
    max_size=8,
)


def done_set(iv: list[tuple[int, int]]) -> set[int]:
    return {o for s, e in iv for o in range(s, e)}


def model(p: Position) -> set[int]:
    return {o for o in PROBE_OFFSETS if p.is_done(o)}


def assert_normal(p: Position) -> None:
    assert p.next_offset >= 0
    prev_end = p.next_offset
    for start, end in p.acked:
        assert start < end
        assert start > prev_end, f"acked {p.acked} not above/apart from {p.next_offset}"
        prev_end = end


positions = intervals.map(Position.from_done)


@given(intervals)
def test_from_done_agrees_with_set_model(iv: list[tuple[int, int]]) -> None:
    p = Position.from_done(iv)
    assert_normal(p)
    expected = done_set(iv)
    assert model(p) == expected
    # next_offset is the first offset not done
    assert p.next_offset == next(o for o in itertools.count() if o not in expected)


@given(positions, positions)
def test_union_is_set_union(a: Position, b: Position) -> None:
    u = a.union(b)
    assert_normal(u)
    assert model(u) == model(a) | model(b)


@given(positions, positions, positions)
def test_union_laws(a: Position, b: Position, c: Position) -> None:
    assert a.union(b) == b.union(a)
    assert a.union(a) == a
    assert a.union(b).union(c) == a.union(b.union(c))
    assert a.union(Position()) == a
    # never un-does an offset
    u = a.union(b)
    assert all(u.is_done(o) for o in PROBE_OFFSETS if a.is_done(o) or b.is_done(o))
    assert u.next_offset >= max(a.next_offset, b.next_offset)


@given(positions)
def test_position_json_round_trip(p: Position) -> None:
    data = json.loads(json.dumps(p.to_json()))
    assert Position.from_json(data) == p


def test_position_examples() -> None:
    p = Position.from_done([(0, 5), (7, 9), (9, 10), (12, 12)])
    assert p == Position(5, ((7, 10),))
    assert [o for o in range(14) if p.is_done(o)] == [0, 1, 2, 3, 4, 7, 8, 9]
    assert Position.from_done([(0, 5), (5, 8)]) == Position(8)
    assert Position().is_done(0) is False
    assert Position(3).union(Position(0, ((3, 6),))) == Position(6)


# ---- RangePositionMap ----------------------------------------------------------------

POOL = [Position(0), Position(5), Position(5, ((8, 9),)), Position(10), Position(3, ((4, 6),))]
EDGE_SLOTS = [0, 1, 2, 3, 10, 11, 30, 31, 32, 33, 40, MAX_SLOT - 2, MAX_SLOT - 1, MAX_SLOT]
slot_points = st.one_of(
    st.sampled_from(EDGE_SLOTS), st.integers(0, 40), st.integers(MAX_SLOT - 40, MAX_SLOT)
)


@st.composite
def ops(draw: st.DrawFn) -> tuple[SlotRange, Position]:
    a, b = draw(slot_points), draw(slot_points)
    return SlotRange(min(a, b), max(a, b)), draw(st.sampled_from(POOL))


def reference_segments(ref: list[Position]) -> list[tuple[SlotRange, Position]]:
    out: list[tuple[SlotRange, Position]] = []
    slot = 0
    for pos, group in itertools.groupby(ref):
        n = sum(1 for _ in group)
        out.append((SlotRange(slot, slot + n - 1), pos))
        slot += n
    return out


def assert_map_invariants(pmap: RangePositionMap) -> None:
    segs = pmap.segments()
    assert segs[0][0].start == 0
    assert segs[-1][0].end == MAX_SLOT
    for (a, pa), (b, pb) in itertools.pairwise(segs):
        assert a.end + 1 == b.start, "segments must be contiguous"
        assert pa != pb, f"adjacent segments {a} and {b} have the same position"
    assert sum(s.size for s, _ in segs) == SLOT_COUNT
    assert len(pmap) == len(segs)


@settings(max_examples=150, deadline=None)
@given(st.lists(ops(), max_size=12), st.lists(slot_points, min_size=1, max_size=20))
def test_map_agrees_with_reference(
    operations: list[tuple[SlotRange, Position]], probes: list[int]
) -> None:
    pmap = RangePositionMap()
    ref = [Position()] * SLOT_COUNT
    for slots, pos in operations:
        pmap.assign(slots, pos)
        ref[slots.start : slots.end + 1] = [pos] * slots.size
        for probe in (slots.start, slots.end, *probes):
            assert pmap.get(probe) == ref[probe]
    assert_map_invariants(pmap)
    assert pmap.segments() == reference_segments(ref)


@settings(max_examples=100, deadline=None)
@given(st.lists(ops(), max_size=10), st.lists(st.tuples(slot_points, slot_points), max_size=4))
def test_segments_within_and_minimum(
    operations: list[tuple[SlotRange, Position]], within_pairs: list[tuple[int, int]]
) -> None:
    pmap = RangePositionMap()
    ref = [Position()] * SLOT_COUNT
    for slots, pos in operations:
        pmap.assign(slots, pos)
        ref[slots.start : slots.end + 1] = [pos] * slots.size
    within = RangeSet.from_pairs((min(a, b), max(a, b)) for a, b in within_pairs)
    clipped = pmap.segments(within)
    # clipped segments exactly tile `within`, each carrying the reference position
    assert RangeSet(seg for seg, _ in clipped) == within
    assert sum(seg.size for seg, _ in clipped) == within.size
    for seg, pos in clipped:
        assert pos == ref[seg.start] == ref[seg.end]
    expected_min = min((p.next_offset for _, p in clipped), default=0)
    assert pmap.minimum_offset(within) == expected_min
    assert pmap.minimum_offset() == min(p.next_offset for _, p in reference_segments(ref))


@settings(max_examples=100, deadline=None)
@given(st.lists(ops(), max_size=10))
def test_map_json_round_trip_and_copy(operations: list[tuple[SlotRange, Position]]) -> None:
    pmap = RangePositionMap()
    pmap.update(operations)
    data = json.loads(json.dumps(pmap.to_json()))
    back = RangePositionMap.from_json(data)
    assert back == pmap
    assert back.segments() == pmap.segments()
    before = pmap.segments()
    clone = pmap.copy()
    assert clone == pmap
    clone.assign(SlotRange(0, MAX_SLOT), Position(99))
    assert clone.segments() == [(SlotRange(0, MAX_SLOT), Position(99))]
    assert pmap.segments() == before  # copies are independent


def test_map_examples() -> None:
    pmap = RangePositionMap()
    assert pmap.segments() == [(SlotRange(0, MAX_SLOT), Position())]
    pmap.assign(SlotRange(10, 19), Position(7))
    pmap.assign(SlotRange(20, 29), Position(7))
    assert pmap.segments() == [
        (SlotRange(0, 9), Position()),
        (SlotRange(10, 29), Position(7)),
        (SlotRange(30, MAX_SLOT), Position()),
    ]
    assert pmap.minimum_offset() == 0
    assert pmap.minimum_offset(RangeSet.from_pairs([(12, 25)])) == 7
    pmap.assign(SlotRange(10, 29), Position())
    assert len(pmap) == 1
    pmap.assign(SlotRange(MAX_SLOT, MAX_SLOT), Position(1))
    pmap.assign(SlotRange(0, 0), Position(2))
    assert pmap.get(0) == Position(2) and pmap.get(1) == Position()
    assert pmap.get(MAX_SLOT) == Position(1)
    assert_map_invariants(pmap)
    assert RangePositionMap(Position(4)).minimum_offset() == 4
    assert pmap.minimum_offset(RangeSet()) == 0
