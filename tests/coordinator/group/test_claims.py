"""Members that come back: a channel closed (a network cut, a coordinator handing the
group over or dying) and the member re-registers with what it still runs. Pure handlers,
hand-moved clock (helpers from test_handlers)."""

from __future__ import annotations

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group.effects import QuarantineTimer, Result, SendStart, SendStop
from keyshard.coordinator.group.records import ClaimAwaited, Record, TargetComputed
from keyshard.coordinator.group.state import GroupState, PendingClaim
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange
from tests.coordinator.group.test_handlers import (
    ASSIGNOR,
    SESSION,
    TIMEOUT_MS,
    TPS,
    apply,
    check_indexes,
    group3,
    join,
    of,
    owned_disjoint,
    report,
    run,
)

__all__ = ["group3"]  # the fixture, imported to be found here


def reclaim(state: GroupState, mid: str, claimed: RangeSet, now: float, upto: int = 500):  # type: ignore[no-untyped-def]
    return h.reclaim(
        state, member_id=mid, member_epoch=state.claims[mid].member_epoch, claimed=claimed,
        positions=report(claimed, {tp: Position(upto) for tp in TPS}), name=mid, capacity=1,
        session_timeout_ms=TIMEOUT_MS, topics=("t",), partitions=TPS, now=now,
    )  # fmt: skip


def lose(state: GroupState, mid: str, now: float) -> RangeSet:
    owned = state.members[mid].owned
    run(state, h.connection_lost(state, member_id=mid, now=now), now)
    return owned


def test_a_member_back_with_its_claim_keeps_its_ranges_with_no_handoff(group3: GroupState) -> None:
    state = group3
    owned = lose(state, "m1", 2.0)
    assert "m1" in state.claims and not state.free.overlaps(owned)
    result = reclaim(state, "m1", owned, 3.0)
    effects = run(state, result, 3.0)
    assert not of(effects, SendStop) and not of(effects, SendStart), "no pause, no re-grant"
    assert state.members["m1"].owned == owned and "m1" not in state.claims
    assert not state.quarantined and state.free == EMPTY
    assert state.members["m1"].epoch > 1
    assert state.position_map(TPS[0]).minimum_offset(owned) == 500, "its exact positions"
    lost = [x for x in state.handoffs if x.from_member == "m1"]
    assert lost and all(x.resumed_at == 3.0 for x in lost)
    check_indexes(state)
    owned_disjoint(state)


def test_only_what_both_sides_say_is_kept(group3: GroupState) -> None:
    state = group3
    owned = lose(state, "m1", 2.0)
    half = RangeSet((SlotRange(owned.ranges[0].start, owned.ranges[0].start + 99),))
    foreign = state.members["m2"].owned  # it claims m2's slots too: not adopted
    run(state, reclaim(state, "m1", half | foreign, 3.0), 3.0)
    assert state.members["m1"].owned == half
    owned_disjoint(state)
    # What m1 gave up waits no more (it says it stopped them): granted again at once.
    gave_up = owned - half
    assert not any(q.ranges.overlaps(gave_up) for q in state.quarantined)
    assert not gave_up - RangeSet(r for m in state.members.values() for r in m.owned)
    check_indexes(state)


def test_a_claim_after_its_quarantine_ran_out_is_gone(group3: GroupState) -> None:
    state = group3
    lose(state, "m1", 2.0)
    until = state.claims["m1"].until
    run(state, h.timer_fired(state, key=QuarantineTimer("m1"), now=until), until)
    assert "m1" not in state.claims, "too late: its ranges moved, a Register is fresh"
    owned_disjoint(state)


def test_a_fenced_member_may_not_come_back_for_its_ranges(group3: GroupState) -> None:
    state = group3
    run(state, h.connection_lost(state, member_id="m1", now=2.0, reclaimable=False), 2.0)
    assert "m1" not in state.claims


def test_a_takeover_waits_for_the_durable_members_and_adopts_the_ones_that_come_back() -> None:
    """A replica taking the group over finds, in the state log, members that owned
    ranges: their ranges wait (no grant) until each comes back or its lease ran out."""
    state = GroupState("g")
    half = RangeSet((SlotRange(0, 32767),))
    other = RangeSet((SlotRange(32768, 65535),))
    for mid, owned in (("a", half), ("b", other)):
        apply(state, Result(records=[ClaimAwaited(PendingClaim(mid, mid, 4, owned, SESSION))]))
    apply(state, join(state, "new", 0.0))
    effects = run(state, Result(), 0.0)
    assert not of(effects, SendStart), "nothing free to grant before the claims resolve"
    run(state, reclaim(state, "a", half, 1.0), 1.0)
    assert state.members["a"].owned == half and state.members["a"].epoch == 5
    later = run(state, h.timer_fired(state, key=QuarantineTimer("b"), now=SESSION), SESSION)
    granted = RangeSet(r for s in of(later, SendStart) for r in s.ranges)
    assert granted == other - state.members["a"].owned, "b never came back: its slots move"
    owned_disjoint(state)
    check_indexes(state)
    assert ASSIGNOR  # the strategy test_handlers' `run` reconciles with


def test_a_takeover_where_every_member_comes_back_keeps_the_previous_target() -> None:
    """Adopting is no reason to move slots: with every slot claimed, the target becomes
    what the members kept (a recompute with no load measured yet would move slots the
    previous coordinator had balanced). Once something is free, the strategy decides."""
    state = GroupState("g")
    low = RangeSet((SlotRange(0, 20000),))
    high = RangeSet((SlotRange(20001, 65535),))  # uneven on purpose: a balanced target is not
    taken_over: list[Record] = [TargetComputed((), inputs_version=0)]  # as takeover_result
    for mid, owned in (("a", low), ("b", high)):
        taken_over.append(ClaimAwaited(PendingClaim(mid, mid, 4, owned, SESSION)))
    run(state, Result(records=taken_over), 0.0)
    moved = []
    for at, (mid, owned) in enumerate((("a", low), ("b", high)), start=1):
        moved += run(state, reclaim(state, mid, owned, float(at)), float(at))
    assert not of(moved, SendStop) and not of(moved, SendStart)
    assert state.target == {"a": low, "b": high}
    assert state.target_version == state.inputs_version, "no recompute pending"
    check_indexes(state)

    # A member that gives something up frees it: now the strategy places it.
    lose(state, "b", 3.0)
    half_of_high = RangeSet((SlotRange(20001, 40000),))
    run(state, reclaim(state, "b", half_of_high, 4.0), 4.0)
    assert state.target_version == state.inputs_version  # recomputed by `run`'s reconcile
    assert set(state.target) == {"a", "b"}
    # Kept as it was, the target would leave b's freed slots to nobody.
    assert RangeSet(r for t in state.target.values() for r in t) == RangeSet.from_pairs(
        [(0, 65535)]
    )
    owned_disjoint(state)
