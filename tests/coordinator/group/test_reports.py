"""Numbers a member reports are checked before they count (`coordinator.group.reports`
and the handlers that use it): lies fence the member with the field named, and honest
reports pass, also past ends the coordinator has not confirmed yet (they wait for Kafka).
Pure handlers, hand-moved clock (helpers from test_handlers)."""

from __future__ import annotations

import pytest

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group import targets
from keyshard.coordinator.group.effects import (
    CloseMember,
    QuarantineTimer,
    Result,
    SendStop,
    SetTimer,
)
from keyshard.coordinator.group.records import MemberRemoved
from keyshard.coordinator.group.reports import (
    KnownEnds,
    check_positions,
    clipped_position,
    counted_completions,
    within_size,
)
from keyshard.coordinator.group.state import GroupState, HandoffKind
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.messages import ErrorCode
from tests.coordinator.group.test_handlers import (
    MARGIN,
    P_OLD,
    SESSION,
    TPS,
    Upd,
    group3,
    join,
    moved_on,
    of,
    report,
    run,
    stopped,
)

__all__ = ["group3"]  # the fixture, imported to be found here

LIAR_OFFSET = 2**62
ENDS = KnownEnds({TPS[0]: 100, TPS[1]: 100})


def confirmed(ends: dict[tuple[str, int], int]) -> KnownEnds:
    """Ends Kafka gave after the report arrived."""
    return KnownEnds(ends, confirmed=frozenset(ends))


def ping(state: GroupState, mid: str, pos: Upd, known: KnownEnds | None) -> Result:
    m = state.members[mid]
    return h.ping_answered(
        state, member_id=mid, epoch=m.epoch, positions=pos, load=(), now=2.0, known=known
    )


def fenced_with(state: GroupState, mid: str, result: Result, now: float) -> str:
    """The member is fenced (its ranges wait out its lease), nothing it said counts; the
    error message, which names the field."""
    owned = state.members[mid].owned
    before = {tp: state.position_map(tp).copy() for tp in TPS}
    (removed,) = [r for r in result.records if isinstance(r, MemberRemoved)]
    assert removed.reason is HandoffKind.FENCED and not removed.reclaimable
    assert SetTimer(QuarantineTimer(mid), now + SESSION + MARGIN) in result.effects
    (close,) = [e for e in result.effects if isinstance(e, CloseMember)]
    assert close.code is ErrorCode.FENCED_MEMBER
    run(state, result, now)
    assert mid not in state.members
    assert [q.ranges for q in state.quarantined] == [owned]
    assert {tp: state.position_map(tp) for tp in TPS} == before, "the last good positions"
    return close.message


def test_a_position_past_a_confirmed_end_fences_the_member_naming_the_field(
    group3: GroupState,
) -> None:
    state = group3
    lie = report(state.members["m1"].owned, {TPS[0]: Position(LIAR_OFFSET)})
    message = fenced_with(state, "m1", ping(state, "m1", lie, confirmed({TPS[0]: 3920})), 2.0)
    assert "positions[t/0].ranges[0].position.next_offset" in message
    assert f"{LIAR_OFFSET} is past the end of t/0 (3920)" in message


def test_a_position_past_the_ends_known_so_far_waits_for_kafka(group3: GroupState) -> None:
    """Not confirmed yet: nothing is applied or refused, the runtime asks Kafka first;
    then an honest report counts in full."""
    state = group3
    honest = report(state.members["m1"].owned, {TPS[0]: Position(150)})
    waiting = ping(state, "m1", honest, ENDS)
    assert waiting.confirm == {TPS[0]: 150}
    assert not waiting.records and not waiting.effects and waiting.error is None
    judged = ping(state, "m1", honest, KnownEnds({TPS[0]: 150}, confirmed=frozenset({TPS[0]})))
    assert not judged.confirm and not of(judged.effects, CloseMember)
    run(state, judged, 2.0)
    assert state.position_map(TPS[0]).minimum_offset(state.members["m1"].owned) == 150


def test_a_position_equal_to_the_end_is_fine(group3: GroupState) -> None:
    state = group3
    at_end = report(state.members["m1"].owned, {TPS[0]: Position(100)})
    result = ping(state, "m1", at_end, ENDS)
    assert not result.confirm and not of(result.effects, CloseMember)


def test_acked_offsets_past_the_end_are_a_lie_too(group3: GroupState) -> None:
    state = group3
    lie = report(state.members["m1"].owned, {TPS[0]: Position(50, ((60, 10**12),))})
    message = fenced_with(state, "m1", ping(state, "m1", lie, confirmed({TPS[0]: 100})), 2.0)
    assert "positions[t/0].ranges[0].position.acked" in message


def test_a_partition_the_group_does_not_read_fences(group3: GroupState) -> None:
    state = group3
    made_up = {("t", 7): [(SlotRange(0, 9), Position(5))]}
    message = fenced_with(state, "m1", ping(state, "m1", made_up, None), 2.0)
    assert "positions[t/7]" in message and "does not read t/7" in message


@pytest.mark.parametrize(
    ("field", "report_"),
    [
        ("high_watermarks[t/9]", {"high_watermarks": [(("t", 9), 5, False)]}),
        ("fetched[x/0]", {"fetched": [(("x", 0), 0, 5, ((1, 5),))]}),
    ],
)
def test_made_up_partitions_anywhere_in_a_reply_fence(
    group3: GroupState, field: str, report_: dict[str, object]
) -> None:
    state = group3
    m = state.members["m2"]
    result = h.ping_answered(
        state, member_id="m2", epoch=m.epoch, positions={}, load=(), now=2.0,
        **report_,  # type: ignore[arg-type]
    )  # fmt: skip
    assert field in fenced_with(state, "m2", result, 2.0)


def test_a_position_behind_what_is_stored_fences(group3: GroupState) -> None:
    """An owner starts from the stored positions and only adds to them: behind them is
    not something an honest member says."""
    state = group3
    behind = report(state.members["m3"].owned, {TPS[1]: Position(3, ((30, 33),))})
    message = fenced_with(state, "m3", ping(state, "m3", behind, None), 2.0)
    assert "positions[t/1].ranges[0].position.next_offset" in message
    assert "3 is behind 20" in message


def test_reports_for_slots_given_up_are_stale_not_lies(group3: GroupState) -> None:
    """A report covering slots the member no longer owns (an older view): those parts
    are dropped, whatever they say; the rest counts."""
    state = group3
    m1 = state.members["m1"].owned
    everything = report(RangeSet.full(), {TPS[0]: Position(3)})  # behind, elsewhere
    everything[TPS[0]] = [(seg, pos) for seg, pos in everything[TPS[0]]] + [
        (r, Position(42)) for r in m1
    ]
    checked = check_positions(state, everything, m1, field="positions", known=None)
    assert checked.refusal is None  # m1's slots at 3 and at 42: together, 42
    behind = report(RangeSet.full(), {TPS[0]: Position(3)})
    checked = check_positions(state, behind, m1, field="positions", known=None)
    assert checked.refusal is not None  # the part of m1 at 3 is behind 10
    fine = report(RangeSet.full() - m1, {TPS[0]: Position(0)}) | {
        TPS[1]: [(r, Position(42)) for r in m1]
    }
    checked = check_positions(state, fine, m1, field="positions", known=None)
    assert checked.refusal is None
    assert checked.advanced == ((TPS[1], tuple((r, Position(42)) for r in m1)),)


def test_a_stop_reply_past_the_end_fences_and_its_ranges_wait(group3: GroupState) -> None:
    state = group3
    stops = of(run(state, join(state, "m4", 2.0), 2.0), SendStop)
    stop = stops[0]
    lie = report(stop.ranges, {TPS[0]: Position(LIAR_OFFSET)})
    result = h.stop_completed(
        state, member_id=stop.member_id, ranges=stop.ranges, positions=lie, now=3.0,
        known=confirmed({TPS[0]: 100}),
    )  # fmt: skip
    assert "positions[t/0]" in fenced_with(state, stop.member_id, result, 3.0)
    honest = stopped(state, stops[1], 3.0, report(stops[1].ranges, {TPS[0]: Position(90)}))
    assert not of(honest.effects, CloseMember)


def test_a_leave_past_the_end_fences_instead(group3: GroupState) -> None:
    state = group3
    lie = report(state.members["m2"].owned, {TPS[0]: Position(LIAR_OFFSET)})
    result = h.leave(state, member_id="m2", positions=lie, now=3.0, known=confirmed({TPS[0]: 9}))
    assert result.error is not None and result.error[0] is ErrorCode.FENCED_MEMBER
    assert "positions[t/0]" in fenced_with(state, "m2", result, 3.0)


def test_a_claim_past_the_end_is_refused(group3: GroupState) -> None:
    state = group3
    owned = state.members["m1"].owned
    run(state, h.connection_lost(state, member_id="m1", now=2.0), 2.0)
    result = h.reclaim(
        state, member_id="m1", member_epoch=state.claims["m1"].member_epoch, claimed=owned,
        positions=report(owned, {TPS[0]: Position(LIAR_OFFSET)}), name="m1", capacity=1,
        session_timeout_ms=10_000, topics=("t",), partitions=TPS, now=3.0,
        known=confirmed({TPS[0]: 100}),
    )  # fmt: skip
    assert result.error is not None and result.error[0] is ErrorCode.FENCED_MEMBER
    assert "claim.positions[t/0]" in result.error[1] and not result.records


def test_a_claim_with_an_older_released_position_beside_a_newer_one_is_honest(
    group3: GroupState,
) -> None:
    """A claim carries the final positions of ranges released since the member last
    registered beside those of the ranges it runs; a range given back to it has both. The
    older one alone is behind the stored position; the claim as a whole is not."""
    state = group3
    owned = state.members["m1"].owned
    stored = state.position_map(TPS[0]).minimum_offset(owned)
    run(state, h.connection_lost(state, member_id="m1", now=2.0), 2.0)
    released = report(owned, {TPS[0]: Position(0)})
    running = report(owned, {TPS[0]: Position(stored + 5)})
    claim = {tp: released[tp] + running[tp] for tp in released}

    def reclaim(positions: Upd) -> Result:
        return h.reclaim(
            state, member_id="m1", member_epoch=state.claims["m1"].member_epoch,
            claimed=owned, positions=positions, name="m1", capacity=1,
            session_timeout_ms=10_000, topics=("t",), partitions=TPS, now=3.0,
            known=confirmed({TPS[0]: 100, TPS[1]: 100}),
        )  # fmt: skip

    assert stored > 0, "nothing stored: the older position would not be behind"
    assert reclaim(released).error is not None  # alone, it is behind
    result = reclaim(claim)
    assert result.error is None, result.error
    assert state.position_map(TPS[0]).minimum_offset(owned) == stored  # not yet applied
    run(state, result, 3.0)
    assert state.position_map(TPS[0]).minimum_offset(owned) == stored + 5


def test_an_end_kafka_did_not_answer_for_clips_instead_of_fencing(group3: GroupState) -> None:
    """Kafka unreachable: what passes the ends known is not counted, the rest is (true if
    the member is honest); nobody is fenced for our blindness."""
    state = group3
    owned = state.members["m1"].owned
    far = report(owned, {TPS[0]: Position(500, ((600, 700),))})
    blind = KnownEnds({TPS[0]: 400}, unconfirmable=frozenset({TPS[0]}))
    result = ping(state, "m1", far, blind)
    assert not of(result.effects, CloseMember)
    run(state, result, 2.0)
    assert {p for _, p in state.position_map(TPS[0]).segments(owned)} == {Position(400)}


def test_clipped_positions_say_nothing_past_the_end() -> None:
    assert clipped_position(Position(50, ((60, 70), (90, 120))), 100) == Position(
        50, ((60, 70), (90, 100))
    )
    assert clipped_position(Position(150), 100) == Position(100)


def test_high_watermarks_and_windows_are_clipped_to_the_confirmed_end(group3: GroupState) -> None:
    """A poisoned demand frontier (fetched.end 2**62) or lag reference: clipped, the
    counts to the window's size; the frontier stays where the partition ends."""
    state = group3
    m = state.members["m1"]
    result = h.ping_answered(
        state, member_id="m1", epoch=m.epoch, positions={}, load=(), now=2.0,
        high_watermarks=[(TPS[0], LIAR_OFFSET, False)],
        fetched=[(TPS[0], 50, LIAR_OFFSET, ((1, 10**9), (2, 10**9)))],
        known=ENDS,
    )  # fmt: skip
    assert result.confirm == {TPS[0]: LIAR_OFFSET}
    result = h.ping_answered(
        state, member_id="m1", epoch=m.epoch, positions={}, load=(), now=2.0,
        high_watermarks=[(TPS[0], LIAR_OFFSET, False)],
        fetched=[(TPS[0], 50, LIAR_OFFSET, ((1, 10**9), (2, 10**9)))],
        known=confirmed({TPS[0]: 120}),
    )  # fmt: skip
    assert not of(result.effects, CloseMember)
    run(state, result, 2.0)
    assert state.high_watermarks[TPS[0]] == 120
    backlog = state.demand.backlog(2.0)
    assert backlog is not None and sum(backlog) == pytest.approx(70)  # offsets 50..120
    state.demand.fetched(TPS[0], 120, 130, ((1, 10),), 2.0)  # the frontier moves on
    assert sum(state.demand.backlog(2.0) or ()) == pytest.approx(80)


def test_counts_within_their_window() -> None:
    assert within_size(((1, 5), (2, 5)), 20) == ((1, 5), (2, 5))
    assert within_size(((1, 10**9), (2, 3 * 10**9)), 100) == ((1, 25), (2, 75))


def test_completions_count_only_as_far_as_positions_moved(group3: GroupState) -> None:
    """busy_records 1e9 in 600 ms would weigh a member millions of times the others:
    records it says it completed count only up to the offsets its positions moved."""
    assert counted_completions(((1, 10**9),), (10**9, 600), 300) == (((1, 300),), (300, 600))
    state = group3
    m1 = state.members["m1"]
    credit = m1.credit  # from the positions of its first report (P_OLD)
    assert credit == P_OLD[TPS[0]].next_offset + 20 + 2
    moved = moved_on(state, "m1", 100)
    result = h.ping_answered(
        state, member_id="m1", epoch=m1.epoch, positions=moved, load=((1, 10**9),), now=2.0,
        busy=(10**9, 600),
    )  # fmt: skip
    run(state, result, 2.0)
    assert m1.processed == credit + 100 and m1.credit == 0
    assert m1.speed.speed == (credit + 100) / 0.6
    # nothing moved since: nothing more counts
    result = h.ping_answered(
        state, member_id="m1", epoch=m1.epoch, positions={}, load=((1, 500),), now=3.0
    )
    run(state, result, 3.0)
    assert m1.processed == credit + 100


def test_a_huge_load_cannot_overflow_replay(group3: GroupState) -> None:
    """Counts are bounded on the wire (int32) and by the credit: demand stays finite."""
    state = group3
    moved = moved_on(state, "m1", 2**31 - 1)
    m1 = state.members["m1"]
    result = h.ping_answered(
        state, member_id="m1", epoch=m1.epoch, positions=moved,
        load=tuple((b, 2**31 - 1) for b in range(4096)), now=2.0,
    )  # fmt: skip
    run(state, result, 2.0)
    spec = targets.assignment_spec(state, 2.0)
    assert spec.slot_load is not None and all(x < float("inf") for x in spec.slot_load)
