"""Group state machine driven by hand with a float clock; `run` mirrors `runtime._run`."""

from __future__ import annotations

import functools
import operator
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group import targets
from keyshard.coordinator.group.effects import (
    CancelTimer,
    CloseMember,
    DrainTimer,
    Effect,
    HoldTimer,
    QuarantineTimer,
    Result,
    SendStart,
    SendStop,
    SessionTimer,
    SetTimer,
    TimerKey,
)
from keyshard.coordinator.group.records import (
    MemberRemoved,
)
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.state import GroupState, HandoffKind
from keyshard.coordinator.strategies.balanced import BalancedAssignor
from keyshard.coordinator.strategies.base import Assignment
from keyshard.core.model.positions import Position, PositionUpdate
from keyshard.core.model.ranges import EMPTY, RangeSet
from keyshard.core.protocol.messages import ErrorCode

ASSIGNOR = BalancedAssignor()
Upd = PositionUpdate
TPS = (("t", 0), ("t", 1))
TIMEOUT_MS = 10_000
SESSION = TIMEOUT_MS / 1000
MARGIN = 0.5  # GroupConfig.lost_member_margin_ms
DRAIN = 10.0  # GroupConfig.drain_timeout_ms
P_OLD = {TPS[0]: Position(10), TPS[1]: Position(20, ((25, 27),))}


def apply(state: GroupState, result: Result) -> list[Effect]:
    for record in result.records:
        replay(state, record)
        check_indexes(state)
    return list(result.effects)


def check_indexes(state: GroupState) -> None:
    """The indexes `replay` maintains for an incremental reconcile equal what they index."""
    assert state.free == state.busy().complement()
    assert state.excess == {
        mid
        for mid, m in state.members.items()
        if m.owned - state.target.get(mid, EMPTY) - m.draining
    }
    assert state.open == [x for x in state.handoffs if x.resumed_at is None]
    assert state.target_owners(RangeSet.full()) == {
        mid: t for mid, t in state.target.items() if mid in state.members and t
    }
    assert state.has_target_owner(state.free) == bool(state.target_owners(state.free))


def run(state: GroupState, result: Result, now: float) -> list[Effect]:
    """What CoordinatorRuntime._run does: apply the result, then reconcile and apply that."""
    effects = apply(state, result)
    return effects + apply(state, h.reconcile(state, now=now, assignor=ASSIGNOR))


def join(state: GroupState, mid: str, now: float, topics: tuple[str, ...] = ("t",)) -> Result:
    kw = {"capacity": 1, "session_timeout_ms": TIMEOUT_MS, "topics": topics, "partitions": TPS}
    return h.register(state, member_id=mid, name=mid, now=now, **kw)  # type: ignore[arg-type]


def ping(state: GroupState, mid: str, now: float, pos: Upd | None = None, epoch: int = 0) -> Result:
    m = state.members.get(mid)
    epoch = epoch or (m.epoch if m else 1)
    return h.ping_answered(state, member_id=mid, epoch=epoch, positions=pos or {}, load=(), now=now)


def stopped(state: GroupState, s: SendStop, now: float, pos: Upd | None = None) -> Result:
    return h.stop_completed(
        state, member_id=s.member_id, ranges=s.ranges, positions=pos or {}, now=now
    )


def started(state: GroupState, s: SendStart, now: float) -> Result:
    return h.start_completed(state, member_id=s.member_id, ranges=s.ranges, now=now)


def of(effects: list[Effect], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


def union(sets: list[RangeSet]) -> RangeSet:
    return functools.reduce(operator.or_, sets, EMPTY)


def report(ranges: RangeSet, by_tp: dict[tuple[str, int], Position]) -> Upd:
    return {tp: [(r, pos) for r in ranges] for tp, pos in by_tp.items()}


def moved_on(state: GroupState, mid: str, records: int) -> Upd:
    """The positions of a member that completed `records` records since its last report:
    its ranges in TPS[0], that many offsets past the furthest it had reached (completions
    count only as far as positions move)."""
    owned = state.members[mid].owned
    furthest = max(p.next_offset for _, p in state.position_map(TPS[0]).segments(owned))
    return report(owned, {TPS[0]: Position(furthest + records)})


def assert_start_positions(start: SendStart, expected: dict[tuple[str, int], Position]) -> None:
    assert set(start.positions) == set(TPS)
    for tp, segments in start.positions.items():
        assert RangeSet(seg for seg, _ in segments) == start.ranges
        assert {pos for _, pos in segments} == {expected[tp]}, tp


def ack_all(state: GroupState, starts: list[SendStart], now: float) -> list[Effect]:
    return [e for s in starts for e in run(state, started(state, s, now), now)]


def owned_disjoint(state: GroupState) -> None:
    """No slot is held twice: by two members, or by a member and a quarantine."""
    held = [q.ranges for q in state.quarantined] + [m.owned for m in state.members.values()]
    assert sum(r.size for r in held) == union(held).size, state


@pytest.fixture
def group3() -> GroupState:
    """m1..m3 registered at t=0, granted, acknowledged, positions P_OLD reported at t=1."""
    state = GroupState("g")
    for mid in ("m1", "m2", "m3"):
        apply(state, join(state, mid, 0.0))
    ack_all(state, of(run(state, Result(), 0.0), SendStart), 0.1)
    for mid, m in state.members.items():
        run(state, ping(state, mid, 1.0, report(m.owned, P_OLD)), 1.0)
    return state


def test_three_members_cover_the_space() -> None:
    state = GroupState("g")
    for mid in ("m1", "m2", "m3"):
        assert apply(state, join(state, mid, 0.0)) == [SetTimer(SessionTimer(mid), SESSION)]
    effects = run(state, Result(), 0.0)
    starts = of(effects, SendStart)
    assert not of(effects, SendStop)
    assert sorted(s.member_id for s in starts) == ["m1", "m2", "m3"]
    assert union([s.ranges for s in starts]) == RangeSet.full()
    owned_disjoint(state)
    for s in starts:
        assert_start_positions(s, {tp: Position() for tp in TPS})
        assert state.members[s.member_id].epoch == s.epoch
        assert state.members[s.member_id].owned == s.ranges == state.target[s.member_id]


def test_fourth_join_hands_over_exactly_the_moved_slots(group3: GroupState) -> None:
    state = group3
    before = {mid: m.owned for mid, m in state.members.items()}
    effects = run(state, join(state, "m4", 2.0), 2.0)
    stops = of(effects, SendStop)
    assert not of(effects, SendStart), "nothing may start before the stops are answered"
    target = state.target
    assert union([s.ranges for s in stops]) == target["m4"]
    for s in stops:
        assert s.ranges == before[s.member_id] - target[s.member_id]
        assert SetTimer(DrainTimer(s.member_id), 2.0 + DRAIN) in effects
        assert state.members[s.member_id].epoch == s.epoch
    assert state.members["m4"].owned == EMPTY
    # tp0 is ahead of what the coordinator knew; tp1 leaves out offsets it had acked:
    # done offsets stay done (positions merge by union)
    p_new = {TPS[0]: Position(40, ((45, 50),)), TPS[1]: Position(20, ((30, 33),))}
    p_got = {TPS[0]: p_new[TPS[0]], TPS[1]: Position(20, ((25, 27), (30, 33)))}
    granted: list[SendStart] = []
    for i, stop in enumerate(stops):
        now = 3.0 + i
        # the report also covers slots the member keeps: those must be ignored
        effects = run(state, stopped(state, stop, now, report(RangeSet.full(), p_new)), now)
        assert CancelTimer(DrainTimer(stop.member_id)) in effects
        (start,) = of(effects, SendStart)
        assert start.member_id == "m4" and start.ranges == stop.ranges
        assert_start_positions(start, p_got)
        granted.append(start)
        owned_disjoint(state)
    for mid in ("m1", "m2", "m3"):  # kept slots did not advance
        kept = state.members[mid].owned
        for tp in TPS:
            assert {p for _, p in state.position_map(tp).segments(kept)} == {P_OLD[tp]}
    handoffs = list(state.handoffs)
    assert [(ho.kind, ho.resumed_at) for ho in handoffs] == [("revoke", None)] * len(stops)
    ack_all(state, granted, 9.0)
    for i, (ho, stop) in enumerate(zip(handoffs, stops, strict=True)):
        assert (ho.from_member, ho.ranges, ho.to_members) == (stop.member_id, stop.ranges, ["m4"])
        assert (ho.started_at, ho.released_at, ho.resumed_at) == (2.0, 3.0 + i, 9.0)
        assert ho.pause_s == pytest.approx(7.0)
    assert not state.open_handoffs()
    assert {mid: m.owned for mid, m in state.members.items()} == target


def test_leave_frees_slots_at_once(group3: GroupState) -> None:
    state = group3
    gone = state.members["m2"].owned
    pos = report(RangeSet.full(), {TPS[0]: Position(77)})
    effects = run(state, h.leave(state, member_id="m2", positions=pos, now=5.0), 5.0)
    assert CancelTimer(SessionTimer("m2")) in effects and not of(effects, SendStop)
    starts = of(effects, SendStart)
    assert union([s.ranges for s in starts]) == gone
    for s in starts:
        assert_start_positions(s, {TPS[0]: Position(77), TPS[1]: P_OLD[TPS[1]]})
    # m2's report did not touch the slots of the others
    assert state.position_map(TPS[0]).get(state.members["m1"].owned.ranges[0].start) == Position(10)
    (ho,) = state.handoffs
    assert (ho.kind, ho.from_member, ho.ranges, ho.released_at) == ("leave", "m2", gone, 5.0)
    ack_all(state, starts, 6.0)
    assert ho.resumed_at == 6.0 and ho.pause_s == 1.0
    assert union([m.owned for m in state.members.values()]) == RangeSet.full()
    again = h.leave(state, member_id="m2", positions={}, now=7.0).error
    assert again is not None and again[0] == ErrorCode.UNKNOWN_MEMBER


def test_connection_lost_quarantines_until_the_member_must_have_stopped(group3: GroupState) -> None:
    state = group3
    gone = state.members["m2"].owned
    run(state, ping(state, "m2", 3.0), 3.0)
    until = 3.0 + SESSION + MARGIN
    effects = run(state, h.connection_lost(state, member_id="m2", now=4.0), 4.0)
    assert SetTimer(QuarantineTimer("m2"), until) in effects
    assert not of(effects, SendStart) and not of(effects, SendStop)
    assert [(q.ranges, q.until) for q in state.quarantined] == [(gone, until)]
    owned_disjoint(state)
    early = h.timer_fired(state, key=QuarantineTimer("m2"), now=until - 0.01)
    assert not early.records and not of(run(state, early, until - 0.01), SendStart)
    starts = of(
        run(state, h.timer_fired(state, key=QuarantineTimer("m2"), now=until), until), SendStart
    )
    assert union([s.ranges for s in starts]) == gone
    for s in starts:
        assert_start_positions(s, P_OLD)  # the lost member's last report
    assert not state.quarantined
    (ho,) = state.handoffs
    assert (ho.kind, ho.started_at, ho.released_at) == ("lost", 4.0, until)
    # m1 was last heard at t=1: lost long after that, its slots wait for the margin only
    effects = run(state, h.connection_lost(state, member_id="m1", now=50.0), 50.0)
    assert SetTimer(QuarantineTimer("m1"), 50.0 + MARGIN) in effects
    assert h.connection_lost(state, member_id="m1", now=51.0).records == []


def test_drain_deadline_fences_and_quarantines(group3: GroupState) -> None:
    state = group3
    stops = of(run(state, join(state, "m4", 2.0), 2.0), SendStop)
    laggard, *others = stops
    x_owned = state.members[laggard.member_id].owned
    for s in others:
        run(state, stopped(state, s, 3.0), 3.0)
    key = DrainTimer(laggard.member_id)
    early = h.timer_fired(state, key=key, now=2.0 + DRAIN - 0.01)
    # Fired early: nothing happens except re-arming the same deadline.
    assert early.records == [] and early.effects == [SetTimer(key, 2.0 + DRAIN)]
    now = 2.0 + DRAIN
    res = h.timer_fired(state, key=key, now=now)
    until = now + SESSION + MARGIN
    assert res.records == [MemberRemoved(laggard.member_id, HandoffKind.FENCED, until, now)]
    effects = run(state, res, now)
    (close,) = of(effects, CloseMember)
    assert (close.member_id, close.code) == (laggard.member_id, ErrorCode.FENCED_MEMBER)
    assert SetTimer(QuarantineTimer(laggard.member_id), until) in effects
    assert not any(s.ranges.overlaps(x_owned) for s in of(effects, SendStart))
    owned_disjoint(state)
    assert stopped(state, laggard, now + 1).records == []  # a late answer changes nothing
    starts = of(
        run(state, h.timer_fired(state, key=QuarantineTimer(laggard.member_id), now=until), until),
        SendStart,
    )
    assert union([s.ranges for s in starts]) == x_owned
    for s in starts:
        assert_start_positions(s, P_OLD)
    kinds = sorted(ho.kind for ho in state.handoffs if ho.from_member == laggard.member_id)
    assert kinds == ["fenced", "revoke"]


def test_second_revoke_gets_its_own_drain_deadline(group3: GroupState) -> None:
    """m1 answers its first StopFetcher (t=2) in time, at t=9; a second one was sent at
    t=8. It must get the full drain timeout for that one, not be fenced at t=12."""
    state, armed = group3, None
    first = of(run(state, join(state, "m4", 2.0), 2.0), SendStop)
    effects = run(state, join(state, "m5", 8.0), 8.0)
    assert "m1" in {s.member_id for s in of(effects, SendStop)}
    (stop1,) = [s for s in first if s.member_id == "m1"]
    effects += run(state, stopped(state, stop1, 9.0), 9.0)
    now = 2.0 + DRAIN
    res = h.timer_fired(state, key=DrainTimer("m1"), now=now)  # the first stop's deadline
    assert not res.records, "m1 fenced 4 s after its second StopFetcher (drain timeout: 10 s)"
    for e in effects + run(state, res, now):  # the timer m1 is left with
        if isinstance(e, (SetTimer, CancelTimer)) and e.key == DrainTimer("m1"):
            armed = e.at if isinstance(e, SetTimer) else None
    assert armed == 8.0 + DRAIN, "the second stop's deadline must be armed"


def test_session_expiry_waits_for_requests_sent_after_the_last_reply(group3: GroupState) -> None:
    """A consumer counts its session from the last request it received. m1 last replied
    at t=1 but was sent a StopFetcher at t=5: cut off from the coordinator it may run on
    until t=15, so its slots may not move before that."""
    state = group3
    m1_owned = state.members["m1"].owned
    for s in of(run(state, join(state, "m4", 5.0), 5.0), SendStop):
        if s.member_id != "m1":
            run(state, stopped(state, s, 5.5), 5.5)
    now = 1.0 + SESSION
    run(state, h.timer_fired(state, key=SessionTimer("m1"), now=now), now)
    assert "m1" not in state.members
    for t in (now + MARGIN, 5.0 + SESSION):
        starts = of(
            run(state, h.timer_fired(state, key=QuarantineTimer("m1"), now=t), t), SendStart
        )
        assert not any(s.ranges.overlaps(m1_owned) for s in starts), f"m1's slots moved at t={t}"


def test_session_expiry(group3: GroupState) -> None:
    state = group3
    run(state, ping(state, "m1", 4.0), 4.0)
    for now in (SESSION, 4.0 + SESSION - 0.01):  # the originally armed time, and just before
        res = h.timer_fired(state, key=SessionTimer("m1"), now=now)
        assert res.records == [] and res.effects == [SetTimer(SessionTimer("m1"), 4.0 + SESSION)]
    now = 4.0 + SESSION
    res = h.timer_fired(state, key=SessionTimer("m1"), now=now)
    (removed,) = res.records  # quarantine length: see the test above
    assert isinstance(removed, MemberRemoved) and removed.reason == "lost"
    assert removed.quarantine_until is not None and removed.quarantine_until >= now + MARGIN
    effects = run(state, res, now)
    (close,) = of(effects, CloseMember)
    assert (close.member_id, close.code) == ("m1", ErrorCode.FENCED_MEMBER)
    assert SetTimer(QuarantineTimer("m1"), removed.quarantine_until) in effects
    assert h.timer_fired(state, key=SessionTimer("m1"), now=now + 100).records == []
    assert h.timer_fired(state, key=SessionTimer("nobody"), now=now).records == []


def test_a_member_silent_after_a_stop_reply_still_expires(group3: GroupState) -> None:
    """A StopFetcher reply renews the session without re-arming its timer (only pings
    re-arm it): the timer that fires too early must re-arm itself, or a member that goes
    silent right after such a reply (host lost, no TCP reset) is never expired."""
    state = group3
    (stop,) = [
        s for s in of(run(state, join(state, "m4", 2.0), 2.0), SendStop) if s.member_id == "m1"
    ]
    run(state, stopped(state, stop, 3.0), 3.0)  # m1's last word: t=3; its pings stop
    res = h.timer_fired(state, key=SessionTimer("m1"), now=1.0 + SESSION)  # armed by t=1 ping
    assert res.records == [] and res.effects == [SetTimer(SessionTimer("m1"), 3.0 + SESSION)]
    (removed,) = h.timer_fired(state, key=SessionTimer("m1"), now=3.0 + SESSION).records
    assert isinstance(removed, MemberRemoved) and removed.reason == "lost"


def test_ping_epochs_and_ownership(group3: GroupState) -> None:
    state = group3
    m1, m2 = state.members["m1"], state.members["m2"]
    mine, theirs = m1.owned.ranges[0], m2.owned.ranges[0]
    high = {TPS[0]: [(mine, Position(90)), (theirs, Position(90))]}
    stale = ping(state, "m1", 2.0, high, epoch=m1.epoch - 1)
    assert stale.error is not None and stale.error[0] == ErrorCode.STALE_EPOCH
    run(state, stale, 2.0)
    assert m1.last_heard == 2.0  # still proof of life
    assert state.position_map(TPS[0]).get(mine.start) == Position(10)
    load = ((3, 7),)
    ok = h.ping_answered(state, member_id="m1", epoch=m1.epoch, positions=high, load=load, now=2.5)
    assert ok.error is None and SetTimer(SessionTimer("m1"), 2.5 + SESSION) in ok.effects
    run(state, ok, 2.5)
    pmap = state.position_map(TPS[0])
    assert {p for _, p in pmap.segments(RangeSet((mine,)))} == {Position(90)}
    assert {p for _, p in pmap.segments(RangeSet((theirs,)))} == {Position(10)}
    assert m1.load == {3: 7} and m1.processed == 7
    unknown = ping(state, "zz", 3.0).error
    assert unknown is not None and unknown[0] == ErrorCode.UNKNOWN_MEMBER


def test_inconsistent_topics() -> None:
    state = GroupState("g")
    run(state, join(state, "m1", 0.0, topics=("t", "u")), 0.0)
    res = join(state, "m2", 1.0, topics=("t",))
    assert res.error is not None and res.error[0] == ErrorCode.INCONSISTENT_TOPICS
    assert res.records == [] and res.effects == []
    assert join(state, "m3", 1.0, topics=("u", "t")).error is None


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_membership_churn_keeps_one_owner_per_slot(seed: int) -> None:
    """Random churn: never two holders of a slot; once settled, all slots run on target."""
    rng = random.Random(seed)
    state, now, n = GroupState("g"), 0.0, 0
    timers: dict[TimerKey, float] = {}
    stops: list[SendStop] = []
    starts: list[SendStart] = []

    def do(result: Result) -> None:
        for e in run(state, result, now):
            if isinstance(e, SetTimer):
                timers[e.key] = e.at
            elif isinstance(e, CancelTimer):
                timers.pop(e.key, None)
            elif isinstance(e, SendStop):
                stops.append(e)
            elif isinstance(e, SendStart):
                assert not e.ranges.overlaps(union([q.ranges for q in state.quarantined]))
                assert not (e.ranges - state.target[e.member_id])
                starts.append(e)
        owned_disjoint(state)

    def settle() -> None:
        while stops or starts:
            do(stopped(state, stops.pop(0), now) if stops else started(state, starts.pop(0), now))

    for _ in range(40):
        now += rng.choice([0.0, 0.5, 2.0, 6.0])
        for key, at in sorted(timers.items(), key=lambda kv: kv[1]):
            if at <= now and timers.get(key) == at:
                del timers[key]
                do(h.timer_fired(state, key=key, now=now))
        action = rng.randrange(7)
        mids = sorted(state.members)
        if action == 0 or not mids:
            n += 1
            do(join(state, f"m{n}", now))
        elif action == 1 and stops:
            do(stopped(state, stops.pop(rng.randrange(len(stops))), now))
        elif action == 2 and starts:
            do(started(state, starts.pop(rng.randrange(len(starts))), now))
        elif action == 3:
            do(h.leave(state, member_id=rng.choice(mids), positions={}, now=now))
        elif action == 4 and rng.random() < 0.3:
            do(h.connection_lost(state, member_id=rng.choice(mids), now=now))
        elif action == 5 and state.claims:  # a lost member comes back for its ranges
            mid = rng.choice(sorted(state.claims))
            owned = state.claims[mid].owned
            claimed = owned if rng.random() < 0.7 else RangeSet(owned.ranges[:1])
            do(
                h.reclaim(
                    state, member_id=mid, member_epoch=state.claims[mid].member_epoch,
                    claimed=claimed, positions={}, name=mid, capacity=1,
                    session_timeout_ms=TIMEOUT_MS, topics=("t",), partitions=TPS, now=now,
                )
            )  # fmt: skip
        else:
            do(ping(state, rng.choice(mids), now))
    if not state.members:
        do(join(state, "last", now))
    for _ in range(20):  # everyone answers from now on; let quarantines run out
        settle()
        for mid in list(state.members):
            do(ping(state, mid, now))
        now += SESSION + 1
        for key in [k for k, at in timers.items() if at <= now and isinstance(k, QuarantineTimer)]:
            timers.pop(key)
            do(h.timer_fired(state, key=key, now=now))
    settle()
    assert not state.quarantined
    assert {mid: m.owned for mid, m in state.members.items()} == state.target
    assert union(list(state.target.values())) == RangeSet.full()
    assert all(not m.draining and not m.starting for m in state.members.values())


def test_reconcile_without_recompute_keeps_a_stale_target_and_still_hands_off() -> None:
    """The runtime defers recomputes (one per burst of joins): meanwhile slots freed by a
    drain still go to their owner under the current target, and nobody is revoked."""
    state = GroupState("g")
    run(state, join(state, "a", 0.0), 0.0)
    assert state.members["a"].owned == RangeSet.full()
    apply(state, join(state, "b", 1.0))
    stale = apply(state, h.reconcile(state, now=1.0, assignor=ASSIGNOR, recompute=False))
    assert stale == [] and state.target_version != state.inputs_version
    assert "b" not in state.target
    effects = apply(state, h.reconcile(state, now=1.0, assignor=ASSIGNOR))
    (stop,) = [e for e in effects if isinstance(e, SendStop)]
    assert stop.member_id == "a" and state.target_version == state.inputs_version
    grants = run(state, stopped(state, stop, 2.0), 2.0)
    (grant,) = [e for e in grants if isinstance(e, SendStart)]
    assert grant.member_id == "b" and grant.ranges == stop.ranges


def later(state: GroupState, result: Result, now: float) -> list[Effect]:
    """What the runtime does on an event: apply, reconcile against the current target
    (the recompute runs later, off the loop)."""
    effects = apply(state, result)
    return effects + apply(state, h.reconcile(state, now=now, assignor=ASSIGNOR, recompute=False))


def recomputed(state: GroupState, version: int, assignment: Assignment, now: float) -> list[Effect]:
    """What the runtime does when a recompute for inputs `version` lands (_adopt_target)."""
    effects = apply(state, Result(records=[targets.target_computed(state, assignment, version)]))
    return effects + apply(state, h.reconcile(state, now=now, assignor=ASSIGNOR, recompute=False))


def test_a_target_that_lands_after_more_joins_grants_nothing_until_they_are_placed() -> None:
    """A storm of joins with a pause longer than the recompute's quiet time in it: the
    recompute for the first wave lands after the second wave joined. Granting under that
    target hands the whole slot space to the first wave, and the next target takes a
    piece back from each of them (at 5,000 members: 4,000+ StopFetchers, 10,000+
    StartFetchers, a run settling in 10-20 s instead of 3-4). Grants wait until the
    joiners are placed: every member gets one StartFetcher, nobody a StopFetcher."""
    state = GroupState("g")
    effects: list[Effect] = []
    for i, mid in enumerate(("a", "b", "c")):
        effects += later(state, join(state, mid, 0.01 * i), 0.01 * i)
    first = state.inputs_version  # the pause: the recompute for a, b, c starts...
    wave1 = ASSIGNOR.assign(targets.assignment_spec(state, 0.15))
    for i, mid in enumerate(("d", "e")):  # ...and the storm goes on while it runs
        effects += later(state, join(state, mid, 0.2 + 0.01 * i), 0.2 + 0.01 * i)
    effects += recomputed(state, first, wave1, 0.3)
    assert set(state.target) == {"a", "b", "c"} and state.free == RangeSet.full()
    assert not of(effects, SendStart) and not of(effects, SendStop)
    assert SetTimer(HoldTimer(), 0.3 + h.GRANT_HOLD_S) in effects
    second = state.inputs_version
    effects += recomputed(state, second, ASSIGNOR.assign(targets.assignment_spec(state, 0.4)), 0.9)
    starts = of(effects, SendStart)
    assert not of(effects, SendStop)
    assert sorted(s.member_id for s in starts) == ["a", "b", "c", "d", "e"]
    assert union([s.ranges for s in starts]) == RangeSet.full()
    assert {s.member_id: s.ranges for s in starts} == state.target
    owned_disjoint(state)


def test_grants_held_for_a_target_that_misses_joiners_are_bounded(group3: GroupState) -> None:
    """A join during a handoff: slots freed by the drains wait for the target that places
    the joiner rather than going to their owner under the old one; but at most `hold_s`
    (a storm that never pauses still gets its slots running), after which the hold timer
    grants them under the current target."""
    state = group3
    stops = of(run(state, join(state, "m4", 2.0), 2.0), SendStop)  # lone: recomputed at once
    assert len(stops) == 3
    assert of(later(state, join(state, "m5", 2.1), 2.1), SendStart) == []
    effects: list[Effect] = []
    for s in stops:
        effects += later(state, stopped(state, s, 2.2, report(s.ranges, P_OLD)), 2.2)
    freed = union([s.ranges for s in stops])
    assert not of(effects, SendStart) and state.free == freed
    deadline = 2.2 + h.GRANT_HOLD_S
    assert SetTimer(HoldTimer(), deadline) in effects
    early = h.timer_fired(state, key=HoldTimer(), now=deadline - 0.01)
    assert not of(later(state, early, deadline - 0.01), SendStart)
    (start,) = of(later(state, h.timer_fired(state, key=HoldTimer(), now=deadline), deadline),
                  SendStart)  # fmt: skip
    assert start.member_id == "m4" and start.ranges == freed
    assert_start_positions(start, P_OLD)
    assert state.grants_held_since is None
    owned_disjoint(state)


def test_a_lone_join_is_not_held(group3: GroupState) -> None:
    """Its target is current when it lands: the handoff goes on without waiting."""
    state = group3
    apply(state, join(state, "m4", 2.0))
    version = state.inputs_version
    assignment = ASSIGNOR.assign(targets.assignment_spec(state, 2.0))
    stops = of(recomputed(state, version, assignment, 2.5), SendStop)
    effects = [e for s in stops for e in later(state, stopped(state, s, 2.6), 2.6)]
    starts = of(effects, SendStart)  # each drain's slots as soon as they are free
    assert len(starts) == 3 and {s.member_id for s in starts} == {"m4"}
    assert union([s.ranges for s in starts]) == union([s.ranges for s in stops])
    assert state.grants_held_since is None


def test_drain_time_counts_from_when_the_stop_fetcher_was_written(group3: GroupState) -> None:
    """A StopFetcher decided at t=2 but written at t=7 (it waited behind a StartFetcher to
    the same member) gives the member the full drain timeout from t=7."""
    state = group3
    stops = of(run(state, join(state, "m4", 2.0), 2.0), SendStop)
    late, *others = stops
    effects = run(
        state, h.stop_written(state, member_id=late.member_id, ranges=late.ranges, now=7.0), 7.0
    )
    assert effects == [SetTimer(DrainTimer(late.member_id), 7.0 + DRAIN)]
    key = DrainTimer(late.member_id)
    res = h.timer_fired(state, key=key, now=2.0 + DRAIN)
    assert res.records == [] and res.effects == [SetTimer(key, 7.0 + DRAIN)], "fenced too early"
    assert of(run(state, h.timer_fired(state, key=key, now=7.0 + DRAIN), 7.0 + DRAIN), CloseMember)
    # A write never moves a deadline earlier, nor one of ranges it did not carry.
    other = others[0]
    m = state.members[other.member_id]
    before = list(m.drains)
    run(state, h.stop_written(state, member_id=other.member_id, ranges=late.ranges, now=9.0), 9.0)
    run(state, h.stop_written(state, member_id=other.member_id, ranges=other.ranges, now=1.0), 1.0)
    assert m.drains == before
