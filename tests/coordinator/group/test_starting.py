"""Where a new group starts (Kafka's auto.offset.reset): pure, with the partition ends as
an input and the group's own handlers around it (helpers from test_handlers)."""

from __future__ import annotations

from keyshard.coordinator.group import starting
from keyshard.coordinator.group.effects import SendStart
from keyshard.coordinator.group.records import PositionsAdvanced
from keyshard.coordinator.group.state import GroupConfig, GroupState, OffsetReset, PendingClaim
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.coordinator.group.test_handlers import TPS, apply, join, of, run

LATEST = GroupConfig(auto_offset_reset=OffsetReset.LATEST)
ENDS = {TPS[0]: 120, TPS[1]: 0}


def test_a_new_latest_group_starts_at_the_partition_ends_stored_like_any_position() -> None:
    state = GroupState("g", LATEST)
    assert starting.needs_partition_ends(LATEST, None)
    assert starting.needs_partition_ends(LATEST, state)
    logged = state.log_version
    (record,) = starting.start_positions(state, ENDS).records
    assert isinstance(record, PositionsAdvanced)
    apply(state, starting.start_positions(state, ENDS))
    assert state.log_version > logged, "the state log stores them with the group"
    for tp, end in ENDS.items():
        assert tp in state.positions, "an empty partition's start is recorded too"
        assert state.position_map(tp).segments() == [(SlotRange(0, MAX_SLOT), Position(end))]
    # Its first member is granted everything from there.
    effects = run(state, join(state, "m1", 1.0), 1.0)
    effects += run(state, starting.start_positions(state, {TPS[0]: 999}), 1.0)
    (start,) = of(effects, SendStart)
    assert start.ranges == RangeSet.full()
    assert {tp: [pos for _, pos in segments] for tp, segments in start.positions.items()} == {
        tp: [Position(end)] for tp, end in ENDS.items()
    }


def test_only_the_first_answer_counts() -> None:
    state = GroupState("g", LATEST)
    apply(state, starting.start_positions(state, ENDS))
    assert not starting.needs_partition_ends(LATEST, state)
    assert starting.start_positions(state, {TPS[0]: 500, TPS[1]: 500}).records == []
    assert state.position_map(TPS[0]).minimum_offset() == 120


def test_an_earliest_group_records_nothing_and_reads_from_the_first_offsets() -> None:
    state = GroupState("g", GroupConfig())
    assert GroupConfig().auto_offset_reset is OffsetReset.EARLIEST
    assert not starting.needs_partition_ends(state.config, None)
    assert starting.start_positions(state, ENDS).records == []
    assert state.positions == {} and state.position_map(TPS[0]).minimum_offset() == 0


def test_a_group_that_is_known_is_never_moved() -> None:
    """Positions (progress, or where it started), a member, or a member that may come
    back: the group exists, and switching it to latest moves nothing."""
    with_positions = GroupState("g", LATEST)
    apply(with_positions, starting.start_positions(with_positions, {TPS[0]: 7}))
    with_member = GroupState("g", LATEST)
    run(with_member, join(with_member, "m1", 1.0), 1.0)
    with_claim = GroupState("g", LATEST)
    with_claim.claims["m1"] = PendingClaim("m1", "m1", 2, RangeSet.full(), 10.0)
    for state in (with_positions, with_member, with_claim):
        assert not starting.is_new(state)
        assert not starting.needs_partition_ends(LATEST, state)
        assert starting.start_positions(state, {TPS[0]: 900, TPS[1]: 900}).records == []
