"""Property tests for keyshard.core.model.ranges: RangeSet must behave like a set of slots.

Slots are drawn from two small windows (the bottom and the top of the space, so the edges
0 and 65535 are exercised) and compared against plain Python sets of ints.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshard.core.model.hashing import MAX_SLOT, SLOT_COUNT
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange

LOW = (0, 63)
HIGH = (MAX_SLOT - 63, MAX_SLOT)
WINDOW = [*range(LOW[0], LOW[1] + 1), *range(HIGH[0], HIGH[1] + 1)]
PROBES = [*WINDOW, 64, 1000, 32768, HIGH[0] - 1]


@st.composite
def slot_ranges(draw: st.DrawFn) -> SlotRange:
    lo, hi = draw(st.sampled_from([LOW, HIGH]))
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(lo, hi))
    return SlotRange(min(a, b), max(a, b))


range_lists = st.lists(slot_ranges(), max_size=8)


def as_set(rs: RangeSet) -> set[int]:
    return {s for r in rs for s in range(r.start, r.end + 1)}


def from_list(ranges: list[SlotRange]) -> set[int]:
    return {s for r in ranges for s in range(r.start, r.end + 1)}


def assert_normalized(rs: RangeSet) -> None:
    ranges = rs.ranges
    for r in ranges:
        assert 0 <= r.start <= r.end <= MAX_SLOT
    for a, b in itertools.pairwise(ranges):
        assert a.end + 1 < b.start, f"not sorted/disjoint/non-adjacent: {a} then {b}"


@given(range_lists)
def test_normalization(ranges: list[SlotRange]) -> None:
    rs = RangeSet(ranges)
    assert_normalized(rs)
    assert as_set(rs) == from_list(ranges)
    assert rs.size == len(from_list(ranges))
    assert bool(rs) == bool(ranges)
    assert len(rs) == len(rs.ranges)


@given(range_lists)
def test_order_of_input_does_not_matter(ranges: list[SlotRange]) -> None:
    assert RangeSet(ranges) == RangeSet(reversed(ranges))
    assert hash(RangeSet(ranges)) == hash(RangeSet(reversed(ranges)))
    assert RangeSet(ranges) == RangeSet.from_pairs(RangeSet(ranges).to_pairs())


@given(range_lists, range_lists)
def test_equality_is_equality_of_slots(a: list[SlotRange], b: list[SlotRange]) -> None:
    assert (RangeSet(a) == RangeSet(b)) == (from_list(a) == from_list(b))


@given(range_lists, range_lists)
def test_set_algebra_agrees_with_python_sets(a: list[SlotRange], b: list[SlotRange]) -> None:
    ra, rb = RangeSet(a), RangeSet(b)
    sa, sb = from_list(a), from_list(b)
    for result, expected in ((ra | rb, sa | sb), (ra & rb, sa & sb), (ra - rb, sa - sb)):
        assert_normalized(result)
        assert as_set(result) == expected
    assert ra.overlaps(rb) == bool(sa & sb)


@st.composite
def many_ranges(draw: st.DrawFn) -> RangeSet:
    """Up to 64 separate runs in the probe window: free slots of a large group."""
    slots = draw(st.sets(st.sampled_from(WINDOW), max_size=len(WINDOW)))
    return RangeSet(SlotRange(s, s) for s in slots)


@given(many_ranges(), st.lists(slot_ranges(), max_size=3))
def test_set_algebra_of_a_few_ranges_against_many(big: RangeSet, few: list[SlotRange]) -> None:
    """The bisecting paths (one operand much shorter) agree with Python sets."""
    small = RangeSet(few)
    sb, ss = as_set(big), from_list(few)
    for result, expected in (
        (big & small, sb & ss),
        (small & big, sb & ss),
        (big - small, sb - ss),
    ):
        assert_normalized(result)
        assert as_set(result) == expected
        assert result == RangeSet(result.ranges)


@given(range_lists)
def test_complement(ranges: list[SlotRange]) -> None:
    rs = RangeSet(ranges)
    comp = rs.complement()
    assert_normalized(comp)
    assert comp.size == SLOT_COUNT - rs.size
    for slot in PROBES:
        assert (slot in comp) == (slot not in rs)
    assert comp.complement() == rs
    assert (rs | comp) == RangeSet.full()
    assert not (rs & comp)
    assert RangeSet.full() - rs == comp


@given(range_lists)
def test_contains_agrees(ranges: list[SlotRange]) -> None:
    rs = RangeSet(ranges)
    slots = from_list(ranges)
    for slot in PROBES:
        assert (slot in rs) == (slot in slots)
    assert "1" not in rs
    assert None not in rs


def test_edges_and_full_space() -> None:
    full = RangeSet.full()
    assert full.size == SLOT_COUNT
    assert 0 in full and MAX_SLOT in full
    assert full.complement() == EMPTY
    assert EMPTY.complement() == full
    assert RangeSet.from_pairs([(0, 0), (MAX_SLOT, MAX_SLOT)]).complement().to_pairs() == [
        (1, MAX_SLOT - 1)
    ]
    # adjacent ranges merge, also across input order
    assert RangeSet.from_pairs([(5, 9), (0, 4)]).to_pairs() == [(0, 9)]
    assert RangeSet.from_pairs([(0, 4), (6, 9)]).to_pairs() == [(0, 4), (6, 9)]
    # nested and overlapping
    assert RangeSet.from_pairs([(0, 100), (3, 4), (50, 200)]).to_pairs() == [(0, 200)]
    assert SlotRange(3, 7).size == 5
    assert 7 in SlotRange(3, 7) and 8 not in SlotRange(3, 7)


@pytest.mark.parametrize(
    "start,end",
    [(-1, 0), (0, SLOT_COUNT), (5, 4), (SLOT_COUNT, SLOT_COUNT), (-5, -1), (0, 10**9)],
)
def test_invalid_slot_range_raises(start: int, end: int) -> None:
    with pytest.raises(ValueError):
        SlotRange(start, end)
    with pytest.raises(ValueError):
        RangeSet.from_pairs([(start, end)])


@given(st.integers(), st.integers())
def test_slot_range_validation_property(start: int, end: int) -> None:
    valid = 0 <= start <= end <= MAX_SLOT
    if valid:
        assert SlotRange(start, end).size == end - start + 1
    else:
        with pytest.raises(ValueError):
            SlotRange(start, end)
