"""The periodic load check (`coordinator.group.balance`): hysteresis against rate noise,
a short hold for a backlog."""

from __future__ import annotations

from keyshard.coordinator.group import handlers as h
from keyshard.coordinator.group import targets
from keyshard.coordinator.group.balance import balance_check
from keyshard.coordinator.group.records import ImbalanceObserved, RebalanceRequested
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.group.targets import backlog_now
from keyshard.coordinator.strategies.base import ImbalanceMeter
from keyshard.coordinator.strategies.load_aware import LoadAwareAssignor
from keyshard.coordinator.strategies.registry import strategy_named
from keyshard.core.model.hashing import LOAD_BUCKET_SHIFT
from keyshard.core.model.ranges import RangeSet
from tests.coordinator.group.test_handlers import TPS, apply, group3, moved_on, run

__all__ = ["group3"]  # the fixture, imported to be found here

METER = strategy_named("load-aware").imbalance


def requests(records: list[object]) -> list[RebalanceRequested]:
    return [r for r in records if isinstance(r, RebalanceRequested)]


def checker(state: GroupState, meter: ImbalanceMeter | None = METER):  # type: ignore[no-untyped-def]
    def check(now: float) -> list[object]:
        result = balance_check(state, now=now, imbalance=meter)
        apply(state, result)
        return list(result.records)

    return check


def buckets_of(ranges: RangeSet, count: int) -> list[int]:
    """`count` load buckets wholly inside `ranges` (spread over them)."""
    inside = [
        b
        for r in ranges
        for b in range((r.start >> LOAD_BUCKET_SHIFT) + 1, r.end >> LOAD_BUCKET_SHIFT)
    ]
    step = max(1, len(inside) // count)
    return inside[::step][:count]


def heard(state: GroupState, now: float, **report: object) -> None:
    for mid, m in list(state.members.items()):
        kw = {"load": (), **report}
        done = sum(c for _, c in kw["load"])  # type: ignore[attr-defined]
        run(state, h.ping_answered(state, member_id=mid, epoch=m.epoch, now=now,
                                   positions=moved_on(state, mid, done),
                                   **kw), now)  # type: ignore[arg-type]  # fmt: skip
        report = {}  # one member's report is enough: the others read the same records


def test_a_backlog_behind_one_member_is_rebalanced_after_the_short_hold(
    group3: GroupState,
) -> None:
    """1,200 records wait, all in m1's ranges: the check asks for a rebalance after
    `backlog_hold_ms` (1 s), not `rebalance_hold_ms` (30 s), and the load-aware strategy
    then gives each member about a third of the backlog."""
    state = group3
    hot = buckets_of(state.target["m1"], 40)
    counts = tuple((b, 30) for b in hot)
    heard(state, 2.0, fetched=[(TPS[0], 0, 1200, counts)])
    check = checker(state)
    assert check(2.5) == [ImbalanceObserved(2.5)]
    assert check(3.0) == []  # held half a second so far
    asked = requests(check(3.5))
    # 1,200 waiting on m1, 800 beyond its third (a little less: unrefreshed levels fade)
    assert len(asked) == 1 and asked[0].reason.startswith("backlog imbalance (78")
    spec = targets.assignment_spec(state, 3.5)
    placed = LoadAwareAssignor().assign(spec).ranges
    waiting = {mid: sum(c for b, c in counts if (b << LOAD_BUCKET_SHIFT) in r)
               for mid, r in placed.items()}  # fmt: skip
    assert sum(waiting.values()) == 1200
    assert max(waiting.values()) <= 1.1 * 400, waiting


def test_a_rate_imbalance_still_holds_the_long_hold(group3: GroupState) -> None:
    """Processed records only (no backlog): rate noise, so the full `rebalance_hold_ms`."""
    state = group3
    hot = buckets_of(state.target["m1"], 40)
    heard(state, 2.0, load=tuple((b, 30) for b in hot))
    check = checker(state)
    assert check(2.5) == [ImbalanceObserved(2.5)]
    hold = state.config.rebalance_hold_ms / 1000
    assert check(2.5 + hold / 2) == []
    asked = requests(check(2.5 + hold))
    assert len(asked) == 1 and asked[0].reason.startswith("load imbalance")


def test_a_small_backlog_is_not_a_reason_to_hurry(group3: GroupState) -> None:
    """Fewer than `backlog_records` waiting beyond a fair share: the long hold."""
    state = group3
    hot = buckets_of(state.target["m1"], 10)
    heard(state, 2.0, fetched=[(TPS[0], 0, 150, tuple((b, 15) for b in hot))])
    check = checker(state)
    assert check(2.5) == [ImbalanceObserved(2.5)]
    assert requests(check(4.0)) == []


def test_a_drained_backlog_leaves_the_rate(group3: GroupState) -> None:
    """Completions take the backlog away: demand is the measured rate again."""
    state = group3
    hot = buckets_of(state.target["m2"], 5)
    counts = tuple((b, 10) for b in hot)
    heard(state, 2.0, fetched=[(TPS[0], 0, 50, counts)])
    assert state.demand.backlog(3.0) is not None
    heard(state, 3.0, load=counts)
    assert state.demand.backlog(3.0) is None
    profile = targets.assignment_spec(state, 3.0).slot_load
    rates = state.load.rates(3.0)
    assert profile is not None and abs(sum(profile) - 2.0 * sum(rates.values())) < 1e-6


def test_a_rebalance_that_could_not_help_is_not_asked_for_again(group3: GroupState) -> None:
    """The periodic check asks for a load rebalance after `rebalance_hold_ms` above the
    threshold. If the group is still as imbalanced afterwards (the strategy cannot pack
    the load better), it does not ask again every hold period; it does once the imbalance
    is 5% worse than what set off the last one, or after the group was balanced again."""
    state = group3
    for mid, m in state.members.items():  # some measured load, or the check has nothing
        run(state, h.ping_answered(state, member_id=mid, epoch=m.epoch, positions={},
                                   load=((3, 7),), now=2.0), 2.0)  # fmt: skip
    hold = state.config.rebalance_hold_ms / 1000
    measured = [0.0]

    def check(now: float, imbalance: float) -> list[object]:
        measured[0] = imbalance
        result = balance_check(state, now=now, imbalance=lambda spec, target: measured[0])
        apply(state, result)
        return list(result.records)

    def requests(records: list[object]) -> list[float | None]:
        return [r.imbalance for r in records if isinstance(r, RebalanceRequested)]

    t = 10.0
    assert check(t, 1.5) == [ImbalanceObserved(t)]
    assert requests(check(t + hold, 1.5)) == [1.5]
    # (the recompute ran and placed the same target)
    for k in range(1, 6):  # as imbalanced as before, for five hold periods: no request
        assert check(t + hold + k * hold, 1.52) == []
    assert state.imbalanced_since is None
    t += 10 * hold
    assert check(t, 1.6) == [ImbalanceObserved(t)]  # worse than 1.5 x 1.05
    assert requests(check(t + hold, 1.6)) == [1.6]
    t += 2 * hold
    assert check(t, 1.1) == [ImbalanceObserved(None)]  # balanced: the bar is gone
    assert state.last_rebalance_imbalance is None
    assert check(t + 1, 1.3) == [ImbalanceObserved(t + 1)]
    assert requests(check(t + 1 + hold, 1.3)) == [1.3]


def test_what_an_owner_completed_since_its_last_ping_is_not_a_backlog(
    group3: GroupState,
) -> None:
    """Each member's completions are as old as its last Ping reply. m1 reported 900
    records fetched and 300 completed in the second since its previous reply (300/s); two
    seconds later the other 600 are done too, though nobody has said so yet: no backlog,
    so no short hold (uncorrected, it would look 400 records over its share)."""
    state = group3
    for mid, m in state.members.items():
        run(state, h.ping_answered(state, member_id=mid, epoch=m.epoch, positions={}, load=(),
                                   now=2.0), 2.0)  # fmt: skip
    hot = buckets_of(state.target["m1"], 30)
    m1 = state.members["m1"]
    reply = h.ping_answered(
        state, member_id="m1", epoch=m1.epoch, positions=moved_on(state, "m1", 300), now=3.0,
        load=tuple((b, 10) for b in hot), fetched=[(TPS[0], 0, 900, tuple((b, 30) for b in hot))],
    )  # fmt: skip
    run(state, reply, 3.0)
    assert m1.processed_per_s == 300
    assert sum(backlog_now(state, 3.0) or ()) == 600
    assert backlog_now(state, 5.0) is None
    check = checker(state)
    check(5.0)
    assert requests(check(6.5)) == []


def shares_of(state: GroupState) -> tuple[tuple[int, int], ...]:
    """m1 1.2 times its share: 80 records in each of 20 buckets of m1's, 60 of m2's and
    m3's (4,000 in all; m1 267 over its share)."""
    per_bucket = {"m1": 80, "m2": 60, "m3": 60}
    return tuple(
        (b, per_bucket[mid]) for mid in per_bucket for b in buckets_of(state.target[mid], 20)
    )


def test_a_rate_imbalance_under_the_threshold_moves_nothing(group3: GroupState) -> None:
    """1.2 times its share of the measured rate on m1: under the threshold (1.25)."""
    state = group3
    heard(state, 2.0, load=shares_of(state))
    check = checker(state)
    assert check(2.5) == [] and check(40.0) == []


def test_a_leaving_members_backlog_is_forgotten(group3: GroupState) -> None:
    """A Leave carries no completions: what it did since its last ping would wait forever."""
    state = group3
    hot = buckets_of(state.target["m2"], 10)
    heard(state, 2.0, fetched=[(TPS[0], 0, 300, tuple((b, 30) for b in hot))])
    assert sum(backlog_now(state, 2.0) or ()) == 300
    run(state, h.leave(state, member_id="m2", positions={}, now=3.0), 3.0)
    assert backlog_now(state, 3.0) is None


def test_a_caught_up_group_has_no_backlog(group3: GroupState) -> None:
    """Every partition done to the end the members last saw: whatever the counts say, the
    backlog is zero (estimates that went wrong do not linger)."""
    state = group3
    hot = buckets_of(state.target["m1"], 10)
    heard(state, 2.0, fetched=[(TPS[0], 0, 300, tuple((b, 30) for b in hot))])
    ends = [(TPS[0], 10, False), (TPS[1], 19, False)]  # group3's positions: 10 and 20
    heard(state, 3.0, high_watermarks=ends)
    assert backlog_now(state, 3.0) is None


def measure_speeds(state: GroupState, per_second: dict[str, int], now: float) -> None:
    """A Ping reply from each member: `per_second[mid]` records completed in one second of
    handler time, spread over its own ranges (before any backlog: nothing to lower)."""
    for mid, m in state.members.items():
        done = tuple((b, per_second[mid] // 10) for b in buckets_of(state.target[mid], 10))
        moved = moved_on(state, mid, per_second[mid])
        run(state, h.ping_answered(state, member_id=mid, epoch=m.epoch, positions=moved, now=now,
                                   load=done, busy=(per_second[mid], 1000)), now)  # fmt: skip


def even_backlog(state: GroupState, now: float, per_member: int) -> None:
    members = ("m1", "m2", "m3")
    counts = tuple((b, per_member // 20) for m in members for b in buckets_of(state.target[m], 20))
    heard(state, now, fetched=[(TPS[0], 0, 3 * per_member, counts)])


def test_a_member_measured_slower_is_given_less_of_the_backlog(group3: GroupState) -> None:
    """The backlog is spread evenly, but m1 does 100 records per second of handler time
    and the others 400: with equal shares m1 would take four times as long. Its share is
    weighed at its speed, the imbalance is a backlog, and the rebalance takes the short
    hold."""
    state = group3
    measure_speeds(state, {"m1": 100, "m2": 400, "m3": 400}, 2.0)
    assert [state.members[m].speed.speed for m in ("m1", "m2", "m3")] == [100.0, 400.0, 400.0]
    even_backlog(state, 2.0, 600)
    check = checker(state)
    assert check(2.5) == [ImbalanceObserved(2.5)]
    asked = requests(check(3.5))
    assert len(asked) == 1 and asked[0].reason.startswith("backlog imbalance"), asked
    spec = targets.assignment_spec(state, 3.5)
    assert {m.member_id: m.speed for m in spec.members} == {"m1": 0.25, "m2": 1.0, "m3": 1.0}
    placed = LoadAwareAssignor().assign(spec).ranges
    backlog = backlog_now(state, 3.5)
    assert backlog is not None
    waiting = {mid: sum(backlog[b] for b in range(len(backlog))
                        if (b << LOAD_BUCKET_SHIFT) in r) for mid, r in placed.items()}  # fmt: skip
    # m1's fair part is a ninth (0.25 of 2.25), the others' four ninths each.
    assert waiting["m1"] < 0.5 * min(waiting["m2"], waiting["m3"]), waiting


def test_members_measured_alike_are_not_rebalanced(group3: GroupState) -> None:
    """Speeds that differ by less than the dead band (here 360 to 440) weigh the same: an
    even backlog stays where it is."""
    state = group3
    measure_speeds(state, {"m1": 360, "m2": 400, "m3": 440}, 2.0)
    even_backlog(state, 2.0, 600)
    check = checker(state)
    assert check(2.5) == [] and check(4.0) == []
    assert {m.member_id: m.speed for m in targets.assignment_spec(state, 4.0).members} == {
        "m1": 1.0, "m2": 1.0, "m3": 1.0
    }  # fmt: skip
