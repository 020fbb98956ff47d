"""Resetting positions (coordinator.group.resets): refused while owned, replayed exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshard.coordinator.group import resets
from keyshard.coordinator.group.records import (
    ClaimAwaited,
    MemberJoined,
    MemberRemoved,
    PositionsAdvanced,
    PositionsReset,
    RangesGranted,
)
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.resets import Move, ResetScope, ResetTargetMissing
from keyshard.coordinator.group.state import GroupState, HandoffKind, PendingClaim
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.messages import ErrorCode

TPS = (("t", 0), ("t", 1), ("u", 0))
LOW, HIGH = RangeSet.from_pairs([(0, 32767)]), RangeSet.from_pairs([(32768, MAX_SLOT)])
NOW = 100.0


def group(*members: tuple[str, RangeSet]) -> GroupState:
    """A group reading TPS, done to offset 50 everywhere (acked 60-70 on t:0), with
    `members` owning their ranges."""
    state = GroupState("g")
    replay(state, MemberJoined("x", "x", 1, 10_000, ("t", "u"), TPS, NOW))
    replay(state, MemberRemoved("x", HandoffKind.LEAVE, None, NOW))
    done = Position.from_done([(0, 50), (60, 70)])
    segments = ((SlotRange(0, MAX_SLOT), done),)
    replay(state, PositionsAdvanced(tuple((tp, segments) for tp in TPS)))
    for mid, ranges in members:
        replay(state, MemberJoined(mid, mid, 1, 10_000, ("t", "u"), TPS, NOW))
        replay(state, RangesGranted(mid, ranges, 1, NOW))
    return state


def test_the_scope_is_every_partition_a_topic_or_one() -> None:
    state = group()
    assert resets.scope_of(state) == ResetScope(TPS, RangeSet.full())
    assert resets.scope_of(state, "t").partitions == (("t", 0), ("t", 1))
    assert resets.scope_of(state, "t", 1, LOW) == ResetScope((("t", 1),), LOW)
    with pytest.raises(ResetTargetMissing, match="does not read nope"):
        resets.scope_of(state, "nope")
    with pytest.raises(ResetTargetMissing, match="does not read t:7"):
        resets.scope_of(state, "t", 7)
    assert resets.scope_of(state, None, 0).partitions == (("t", 0), ("u", 0))
    with pytest.raises(ResetTargetMissing, match="does not read a partition 2"):
        resets.scope_of(state, None, 2)


def test_refused_while_a_member_owns_slots_of_it_naming_the_member() -> None:
    state = group(("m1", LOW), ("m2", HIGH))
    scope = resets.scope_of(state, slots=RangeSet.from_pairs([(30000, 40000)]))
    result = resets.reset_positions(state, scope, dict.fromkeys(TPS, 0), NOW)
    assert result.records == []
    assert result.error is not None
    code, message = result.error
    assert code is ErrorCode.INVALID_RANGES
    assert "m1 (slots 30000-32767)" in message and "m2 (slots 32768-40000)" in message
    # Slots nobody owns: accepted, though others are owned.
    state = group(("m1", LOW))
    scope = resets.scope_of(state, slots=HIGH)
    assert resets.reset_positions(state, scope, dict.fromkeys(TPS, 0), NOW).error is None


def test_refused_while_a_member_may_come_back_for_the_slots() -> None:
    """A member whose connection dropped may reclaim its slots and report positions from
    where it runs; one fenced may not, and its slots may be reset at once."""
    state = group()
    replay(state, ClaimAwaited(PendingClaim("gone", "gone", 3, LOW, NOW + 10)))
    assert resets.blockers(state, RangeSet.full()) == {"gone": LOW}
    state = group(("m1", LOW))
    replay(state, MemberRemoved("m1", HandoffKind.FENCED, NOW + 10, NOW))
    assert resets.blockers(state, RangeSet.full()) == {}
    result = resets.reset_positions(state, resets.scope_of(state), dict.fromkeys(TPS, 0), NOW)
    assert result.error is None and len(result.records) == len(TPS)


def test_accepted_when_nobody_owns_the_slots_and_replayed_to_the_positions() -> None:
    state = group(("m1", LOW))
    scope = resets.scope_of(state, "t", slots=HIGH)
    offsets = {("t", 0): 10, ("t", 1): 55}
    before = resets.planned(state, scope, offsets)
    assert before == [
        Move(("t", 0), SlotRange(32768, MAX_SLOT), 50, 10),
        Move(("t", 1), SlotRange(32768, MAX_SLOT), 50, 55),
    ]
    result = resets.reset_positions(state, scope, offsets, NOW)
    assert result.error is None
    assert result.records == [
        PositionsReset(("t", 0), HIGH, Position(10), NOW),
        PositionsReset(("t", 1), HIGH, Position(55), NOW),
    ]
    version = state.positions_version
    for record in result.records:
        replay(state, record)
    assert state.positions_version == version + 2
    t0 = state.positions[("t", 0)]
    assert t0.get(40000) == Position(10)  # backwards, the acked offsets gone with it
    assert t0.get(100) == Position.from_done([(0, 50), (60, 70)])  # m1's: untouched
    assert state.positions[("t", 1)].get(MAX_SLOT) == Position(55)
    assert state.positions[("u", 0)].minimum_offset() == 50  # another topic: untouched
    assert set(state.resets) == {("t", 0), ("t", 1)}


@given(
    st.lists(
        st.tuples(st.integers(0, MAX_SLOT), st.integers(0, MAX_SLOT), st.integers(0, 10**6)),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, MAX_SLOT),
    st.integers(0, MAX_SLOT),
    st.integers(0, 10**6),
)
def test_a_reset_sets_exactly_its_slots_whatever_came_before(
    history: list[tuple[int, int, int]], first: int, last: int, offset: int
) -> None:
    """Every slot of the reset resumes at its offset, forwards or backwards; every other
    slot keeps what it had."""
    state = group()
    for a, b, done in history:
        segment = (SlotRange(min(a, b), max(a, b)), Position(done))
        replay(state, PositionsAdvanced(((TPS[0], (segment,)),)))
    kept = state.positions[TPS[0]].copy()
    slots = RangeSet((SlotRange(min(first, last), max(first, last)),))
    scope = resets.scope_of(state, "t", 0, slots)
    for record in resets.reset_positions(state, scope, {TPS[0]: offset}, NOW).records:
        replay(state, record)
    pmap = state.positions[TPS[0]]
    for probe in {0, first, last, (first + last) // 2, MAX_SLOT, max(0, first - 1)}:
        expected = Position(offset) if probe in slots else kept.get(probe)
        assert pmap.get(probe) == expected, probe


def test_offsets_are_moved_into_the_log() -> None:
    tp = ("t", 0)
    assert resets.within_log({tp: 5}, {tp: 10}, {tp: 90}) == {tp: 10}
    assert resets.within_log({tp: 500}, {tp: 10}, {tp: 90}) == {tp: 90}
    assert resets.within_log({tp: 42}, {tp: 10}, {tp: 90}) == {tp: 42}
