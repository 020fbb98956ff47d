"""Topics that change under a group (coordinator.group.growth), driven by hand."""

from __future__ import annotations

from keyshard.coordinator.group import growth
from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group.effects import Result, SendStart, SendStop
from keyshard.coordinator.group.records import PartitionsChanged, TransitionsChanged
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.state import GroupState, Transition
from keyshard.core.model.positions import Position, TopicPartition
from keyshard.core.model.ranges import RangeSet
from tests.coordinator.group.test_handlers import (
    TPS,
    ack_all,
    apply,
    of,
    ping,
    report,
    run,
    stopped,
)

WINDOW_MS = 300_000
SEEN_MS = 1_700_000_000_000


def register(
    state: GroupState, mid: str, now: float, partitions: tuple[TopicPartition, ...]
) -> Result:
    return h.register(
        state, member_id=mid, name=mid, capacity=1, session_timeout_ms=10_000,
        topics=("t",), partitions=partitions, now=now,
    )  # fmt: skip


def running_group() -> GroupState:
    """m1, m2 on topic t (2 partitions), granted and acknowledged, positions 10 and 20."""
    state = GroupState("g")
    for mid in ("m1", "m2"):
        apply(state, register(state, mid, 0.0, TPS))
    ack_all(state, of(run(state, Result(), 0.0), SendStart), 0.1)
    positions = {TPS[0]: Position(10), TPS[1]: Position(20)}
    for mid, member in state.members.items():
        run(state, ping(state, mid, 1.0, report(member.owned, positions)), 1.0)
    return state


def grow(state: GroupState, counts: dict[str, int], wall_ms: int = SEEN_MS) -> Result:
    return growth.partitions_changed(state, counts, now=2.0, wall_ms=wall_ms, window_ms=WINDOW_MS)


def test_same_counts_change_nothing() -> None:
    state = running_group()
    result = grow(state, {"t": 2})
    assert (result.records, result.effects) == ([], [])


def test_added_partitions_go_to_every_running_member_from_offset_0() -> None:
    state = running_group()
    epochs = {mid: m.epoch for mid, m in state.members.items()}
    handoffs = len(state.handoffs)
    effects = run(state, grow(state, {"t": 4}), 2.0)
    starts = of(effects, SendStart)
    assert {s.member_id for s in starts} == {"m1", "m2"}
    for start in starts:
        member = state.members[start.member_id]
        assert start.extends and start.dropped == ()
        assert start.ranges == member.owned
        assert start.epoch == member.epoch == epochs[start.member_id]  # no new grant
        assert set(start.positions) == {("t", 2), ("t", 3)}  # the added ones only
        for segments in start.positions.values():
            assert RangeSet(seg for seg, _ in segments) == member.owned
            assert {pos.next_offset for _, pos in segments} == {0}
    assert len(state.handoffs) == handoffs  # not a handoff
    assert state.partitions == (("t", 0), ("t", 1), ("t", 2), ("t", 3))
    # Old partitions keep their positions.
    assert state.position_map(("t", 0)).minimum_offset() == 10


def test_growth_starts_a_transition_and_regrowth_extends_it() -> None:
    state = running_group()
    run(state, grow(state, {"t": 4}), 2.0)
    assert state.transitions == {"t": Transition("t", (2, 4), SEEN_MS, SEEN_MS + WINDOW_MS)}
    later = SEEN_MS + 1000
    run(state, grow(state, {"t": 6}, wall_ms=later), 3.0)
    assert state.transitions["t"] == Transition("t", (2, 4, 6), later, later + WINDOW_MS)


def test_a_new_topic_joins_whole_without_a_transition() -> None:
    state = running_group()
    state.topic_pattern = "t|u"
    effects = run(state, grow(state, {"t": 2, "u": 3}), 2.0)
    assert state.topics == ("t", "u")
    assert "u" not in state.transitions
    starts = of(effects, SendStart)
    assert starts and all(set(s.positions) == {("u", 0), ("u", 1), ("u", 2)} for s in starts)


def test_a_deleted_topic_leaves_with_its_positions_and_members_are_told() -> None:
    state = running_group()
    state.topic_pattern = "t|u"
    run(state, grow(state, {"t": 2, "u": 2}), 2.0)
    for mid, member in state.members.items():
        run(state, ping(state, mid, 3.0, report(member.owned, {("u", 0): Position(5)})), 3.0)
    assert ("u", 0) in state.positions
    effects = run(state, grow(state, {"t": 2}), 4.0)
    assert state.topics == ("t",)
    assert state.partitions == TPS
    assert ("u", 0) not in state.positions
    starts = of(effects, SendStart)
    assert {s.member_id for s in starts} == {"m1", "m2"}
    assert all(s.extends and s.dropped == (("u", 0), ("u", 1)) for s in starts)
    # A late report of a partition that left is not taken in, and it is no lie: the
    # member sent it before it read the StartFetcher that dropped the partition.
    member = state.members["m1"]
    late = ping(state, "m1", 5.0, report(member.owned, {("u", 0): Position(9)}))
    assert late.error is None
    run(state, late, 5.0)
    assert ("u", 0) not in state.positions
    assert "m1" in state.members


def test_next_grants_carry_the_added_partitions() -> None:
    state = running_group()
    run(state, grow(state, {"t": 3}), 2.0)
    # The runtime registers a member with the counts as the group has them
    # (`subscription.grown_before_join`).
    joined = register(state, "m3", 3.0, state.partitions)
    apply(state, joined)
    effects = run(state, Result(), 3.0)
    # A handoff: stops first, then grants; follow it through.
    for _ in range(5):
        if any(s.member_id == "m3" for s in effects if isinstance(s, SendStart)):
            break
        stops = [e for e in effects if isinstance(e, SendStop)]
        effects = [x for s in stops for x in run(state, stopped(state, s, 3.5), 3.5)]
    grant = next(e for e in effects if isinstance(e, SendStart) and e.member_id == "m3")
    assert not grant.extends
    assert set(grant.positions) == {("t", 0), ("t", 1), ("t", 2)}
    assert {p.next_offset for _, p in grant.positions[("t", 2)]} == {0}


def test_replay_of_the_record_rebuilds_the_same_topology() -> None:
    state = running_group()
    result = grow(state, {"t": 4})
    other = running_group()
    for record in result.records:
        replay(state, record)
        replay(other, record)
    assert (other.topics, other.partitions, other.transitions) == (
        state.topics,
        state.partitions,
        state.transitions,
    )
    assert isinstance(result.records[0], PartitionsChanged)


def test_a_transition_takes_a_fence_after_its_window_and_ends_past_it() -> None:
    state = running_group()
    run(state, grow(state, {"t": 4}), 2.0)
    until = state.transitions["t"].until_ms
    ends = {("t", p): 50 + p for p in range(4)}
    # Before the window is over: nothing.
    assert growth.transitions_due(state, wall_ms=until - 1, ends=ends).records == []
    # After: the fence is the ends read then.
    result = growth.transitions_due(state, wall_ms=until, ends=ends)
    run(state, result, 3.0)
    assert isinstance(result.records[0], TransitionsChanged)
    assert state.transitions["t"].fence == ((0, 50), (1, 51), (2, 52), (3, 53))
    # Positions short of the fence: it stays.
    assert growth.transitions_due(state, wall_ms=until + 1, ends=ends).records == []
    for mid, member in state.members.items():
        past = {("t", p): Position(60) for p in range(4)}
        run(state, ping(state, mid, 4.0, report(member.owned, past)), 4.0)
    run(state, growth.transitions_due(state, wall_ms=until + 2, ends=ends), 4.0)
    assert state.transitions == {}


def test_unknown_partitions_are_only_those_of_the_groups_topics() -> None:
    state = running_group()
    reported = [("t", 0), ("t", 5), ("other", 0)]
    assert growth.unknown_partitions(state, reported) == [("t", 5)]


def test_extend_member_after_a_claim_gives_what_it_does_not_run() -> None:
    state = running_group()
    run(state, grow(state, {"t": 3}), 2.0)
    result = growth.extend_member(state, "m1", {("t", 0), ("t", 1), ("x", 0)})
    (start,) = of(list(result.effects), SendStart)
    assert set(start.positions) == {("t", 2)}
    assert start.dropped == (("x", 0),)
