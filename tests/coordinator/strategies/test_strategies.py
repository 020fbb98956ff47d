"""Property tests for the built-in strategies (coordinator/strategies) and `balanced`.

Every strategy: complete coverage (every slot owned once, or reported unassigned),
exclusivity, determinism (same spec twice, members in any order), and contiguity where
promised (auto-split: one range per member). Then each strategy's own promise:
consistent-hash and auto-split move only a leaver's slots; consistent-hash balances slot
counts loosely; load-aware balances measured load, moves within 2x of the minimum on a
join or leave, keeps fragmentation bounded over churn and is stable under identical or
slightly drifting load; auto-split halves the busiest range; sticky rejects overlaps and
reports undeclared slots.

Inputs are built from a seed (hypothesis picks seeds and sizes): previous assignments
arise as they do in a group — by assigning an earlier membership with the same strategy,
sometimes with another strategy (a group that switched), sometimes with the departed
members already dropped from `current`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from keyshard.coordinator.group.state import GroupConfig
from keyshard.coordinator.strategies._common import LoadPrefix
from keyshard.coordinator.strategies.auto_split import AutoSplitAssignor
from keyshard.coordinator.strategies.base import (
    Assignment,
    AssignmentSpec,
    MemberSpec,
    quotas,
    slots_moved,
)
from keyshard.coordinator.strategies.consistent_hash import ConsistentHashAssignor, point_key
from keyshard.coordinator.strategies.load_aware import LoadAwareAssignor
from keyshard.coordinator.strategies.measures import (
    achievable_imbalance,
    balancing_imbalance,
    imbalance,
)
from keyshard.coordinator.strategies.registry import BUILT_IN, strategy_named
from keyshard.coordinator.strategies.sticky import StickyAssignor, validate_fixed_ranges
from keyshard.core.model.hashing import LOAD_BUCKET_COUNT, LOAD_BUCKET_SHIFT, MAX_SLOT, SLOT_COUNT
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange

CONTIGUOUS = {"auto-split"}
# Ranges of one member after a load-aware rebalance: at most `max_ranges` (16) are
# carried into a rebalance, plus the pieces a member collects in one (a joiner takes a
# slice from most of the group). Measured worst over these churn runs: 51 (32 members).
FRAGMENT_BOUND = 64
seeds = st.integers(0, 2**32 - 1)
STRATEGY_NAMES = tuple(s.name for s in BUILT_IN)  # the default first


def make_members(
    rng: random.Random, n: int, prefix: str = "m", max_capacity: int = 8
) -> tuple[MemberSpec, ...]:
    ids = rng.sample(range(10_000), n)
    return tuple(MemberSpec(f"{prefix}{i:04d}", rng.randint(1, max_capacity)) for i in ids)


def with_fixed_ranges(
    rng: random.Random, members: tuple[MemberSpec, ...]
) -> tuple[MemberSpec, ...]:
    """Carve the slot line into runs; each run goes to a random member or to nobody."""
    cuts = sorted(rng.sample(range(1, SLOT_COUNT), 3 * len(members)))
    owned: dict[str, list[SlotRange]] = {m.member_id: [] for m in members}
    for start, end in itertools.pairwise([0, *cuts, SLOT_COUNT]):
        if rng.random() < 0.85:
            owned[rng.choice(members).member_id].append(SlotRange(start, end - 1))
    return tuple(
        MemberSpec(m.member_id, m.capacity, RangeSet(owned[m.member_id]) or None) for m in members
    )


def smooth_load(rng: random.Random, members: tuple[MemberSpec, ...]) -> list[float]:
    """Random per-bucket rates plus sparse keys, no slot above 1/4 of the smallest fair share."""
    per_bucket = [rng.uniform(0.0, 1.0) for _ in range(LOAD_BUCKET_COUNT)]
    width = SLOT_COUNT // LOAD_BUCKET_COUNT
    load = [w / width for w in per_bucket for _ in range(width)]
    caps = [max(1, m.capacity) for m in members]
    base_total = sum(load)
    # Sparse keys up to a quarter of the smallest member's fair share of the final total.
    cap = 0.25 * min(caps) / sum(caps)
    for slot in rng.sample(range(SLOT_COUNT), rng.randint(0, 300)):
        load[slot] += rng.uniform(0, 0.9 * cap * base_total)
    assert max(load) <= cap * sum(load)
    return load


def skewed_load(rng: random.Random) -> list[float]:
    """Zipf-like keys: a few slots can be far hotter than any fair share."""
    load = [0.0] * SLOT_COUNT
    s = rng.choice([0.0, 0.8, 1.2])
    for i in range(rng.randint(100, 3000)):
        load[rng.randrange(SLOT_COUNT)] += 1.0 / (i + 1) ** s
    return load


def random_load(rng: random.Random, members: tuple[MemberSpec, ...]) -> list[float] | None:
    kind = rng.randrange(4)
    if kind == 0:
        return None
    if kind == 1:
        return [0.0] * SLOT_COUNT if rng.random() < 0.3 else smooth_load(rng, members)
    return skewed_load(rng) if kind == 2 else smooth_load(rng, members)


def earlier_assignment(
    rng: random.Random, name: str, members: tuple[MemberSpec, ...]
) -> dict[str, RangeSet]:
    """One or two earlier memberships (survivors + since-departed), maybe another strategy."""
    current: dict[str, RangeSet] = {}
    departed: list[MemberSpec] = []
    for _ in range(rng.randint(1, 2)):
        survivors = [m for m in members if rng.random() < 0.6]
        departed = list(make_members(rng, rng.randint(0, 4), prefix="gone"))
        if name == "sticky":
            departed = list(with_fixed_ranges(rng, tuple(departed))) if departed else []
        earlier = tuple(survivors + departed) or (members[0],)
        # A group that switched strategies. (Not balanced after consistent-hash: balanced
        # is quadratic in the number of fragments it inherits, seconds for ~1,000.)
        others = (
            ["load-aware", "auto-split"] if name == "balanced" else ["balanced", "consistent-hash"]
        )
        used = name if rng.random() < 0.8 else rng.choice(others)
        load = random_load(rng, earlier)
        if used == "balanced" and sum(len(r) for r in current.values()) > 200:
            used = name
        current = dict(
            strategy_named(used).assignor.assign(AssignmentSpec(earlier, current, load)).ranges
        )
    if departed and rng.random() < 0.3:  # the coordinator may already have dropped them
        for m in departed:
            current.pop(m.member_id, None)
    return current


def assert_valid(result: Assignment, members: tuple[MemberSpec, ...]) -> None:
    assert set(result.ranges) == {m.member_id for m in members}
    pieces = sorted(
        [r for owned in result.ranges.values() for r in owned] + list(result.unassigned)
    )
    assert pieces[0].start == 0 and pieces[-1].end == MAX_SLOT
    for a, b in itertools.pairwise(pieces):
        assert a.end + 1 == b.start, f"overlap or hole between {a} and {b}"
    assert sum(o.size for o in result.ranges.values()) + result.unassigned.size == SLOT_COUNT


scenario = st.tuples(st.sampled_from(STRATEGY_NAMES), st.integers(1, 24), seeds)


@settings(max_examples=120, deadline=None)
@given(scenario)
def test_every_strategy_covers_everything_once_and_is_deterministic(
    sc: tuple[str, int, int],
) -> None:
    name, n, seed = sc
    rng = random.Random(seed)
    members = make_members(rng, n)
    if name == "sticky":
        members = with_fixed_ranges(rng, members)
    current = earlier_assignment(rng, name, members) if rng.random() < 0.8 else {}
    load = random_load(rng, members)
    assignor = strategy_named(name).assignor
    result = assignor.assign(AssignmentSpec(members, current, load))
    assert_valid(result, members)
    if name != "sticky":
        assert result.unassigned == EMPTY

    assert assignor.assign(AssignmentSpec(members, current, load)) == result
    shuffled = list(members)
    rng.shuffle(shuffled)
    assert assignor.assign(AssignmentSpec(tuple(shuffled), dict(current), load)) == result

    if name in CONTIGUOUS:
        assert all(len(owned) <= 1 for owned in result.ranges.values())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["consistent-hash", "auto-split"]), st.integers(2, 24), seeds)
def test_removing_a_member_moves_only_its_slots(name: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    members = make_members(rng, n)
    load = random_load(rng, members)
    assignor = strategy_named(name).assignor
    current = dict(
        assignor.assign(
            AssignmentSpec(members, earlier_assignment(rng, name, members), load)
        ).ranges
    )
    gone = rng.choice(members)
    remaining = tuple(m for m in members if m is not gone)
    handed = dict(current)
    if rng.random() < 0.5:  # the coordinator may pass the leaver, or drop it already
        del handed[gone.member_id]
    target = assignor.assign(AssignmentSpec(remaining, handed, load))
    assert_valid(target, remaining)
    for m in remaining:
        assert current[m.member_id] - target.ranges[m.member_id] == EMPTY, (
            f"{m.member_id} lost slots although only {gone.member_id} left"
        )
    assert slots_moved(current, target.ranges) == current[gone.member_id].size


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 16), seeds)
def test_consistent_hash_balance_is_loose_but_bounded(n: int, seed: int) -> None:
    """100 points per member: a share varies ~10% (1 sd); max/mean stays below 1.75.

    Sampled over 1,500 random groups of 4..16 members the median max/mean was 1.15, the
    99th percentile 1.32 and the worst 1.50; 1.75 leaves room without hiding a regression
    (a broken ring, e.g. colliding point keys, lands far above it).
    """
    rng = random.Random(seed)
    members = tuple(MemberSpec(f"consumer-{i}") for i in rng.sample(range(100_000), n))
    sizes = [
        o.size for o in ConsistentHashAssignor().assign(AssignmentSpec(members)).ranges.values()
    ]
    assert max(sizes) / (SLOT_COUNT / n) < 1.75


def test_consistent_hash_point_keys_cannot_collide_across_names() -> None:
    assert point_key("c1", 11) != point_key("c11", 1)
    assert point_key("a:1", 2) != point_key("a", 12)
    keys = {point_key(name, i) for name in ("c1", "c11", "c111", "c1:1") for i in range(200)}
    assert len(keys) == 4 * 200


def test_consistent_hash_weighs_capacity_and_ignores_history() -> None:
    members = (MemberSpec("big", 3), MemberSpec("small", 1))
    result = ConsistentHashAssignor().assign(AssignmentSpec(members))
    assert result.ranges["big"].size > 2 * result.ranges["small"].size
    scrambled = {"big": RangeSet.from_pairs([(0, 10)]), "small": RangeSet.from_pairs([(11, 99)])}
    assert ConsistentHashAssignor().assign(AssignmentSpec(members, scrambled)) == result


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 32), seeds, st.booleans())
def test_load_aware_balances_smooth_load_within_10_percent(
    n: int, seed: int, from_history: bool
) -> None:
    rng = random.Random(seed)
    members = make_members(rng, n)
    load = smooth_load(rng, members)
    current = earlier_assignment(rng, "load-aware", members) if from_history else {}
    result = LoadAwareAssignor().assign(AssignmentSpec(members, current, load))
    assert_valid(result, members)
    assert imbalance(result, load, members) <= 1.10
    assert result.notes == ()


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 24), seeds)
def test_load_aware_join_and_leave_move_at_most_twice_the_minimum(n: int, seed: int) -> None:
    """From a balanced group on smooth load: a joiner's arrival moves at most twice what it
    ends up owning, a leaver's departure at most twice what it owned (in slots)."""
    rng = random.Random(seed)
    members = make_members(rng, n)
    joiner = MemberSpec("zz-joiner", rng.randint(1, 8))
    grown = (*members, joiner)
    # Smooth for the grown group too: a key smooth for two members of capacity 7 can be
    # half of a joiner's share, and then no cut near it is close to what the joiner lacks
    # (n=2, seed=4184: 1,853 slots moved for a joiner that took 748).
    load = smooth_load(rng, grown)
    assignor = LoadAwareAssignor()
    first = assignor.assign(AssignmentSpec(members, {}, load))
    base = dict(assignor.assign(AssignmentSpec(members, dict(first.ranges), load)).ranges)

    target = assignor.assign(AssignmentSpec(grown, base, load))
    assert_valid(target, grown)
    assert slots_moved(base, target.ranges) <= 2 * target.ranges[joiner.member_id].size
    assert imbalance(target, load, grown) <= 1.10

    leaver = rng.choice(members)
    shrunk = tuple(m for m in members if m is not leaver)
    target = assignor.assign(AssignmentSpec(shrunk, base, load))
    assert_valid(target, shrunk)
    assert slots_moved(base, target.ranges) <= 2 * base[leaver.member_id].size
    assert imbalance(target, load, shrunk) <= 1.10


@pytest.mark.parametrize("n", [8, 32])
def test_load_aware_fragmentation_stays_bounded_under_churn(n: int) -> None:
    """50 random joins and leaves: ranges per member stay bounded (no growth with churn)."""
    rng = random.Random(n)
    members = list(make_members(rng, n))
    load = smooth_load(rng, tuple(members))
    assignor = LoadAwareAssignor()
    current = dict(assignor.assign(AssignmentSpec(tuple(members), {}, load)).ranges)
    worst = 0
    for step in range(50):
        if rng.random() < 0.5 and len(members) > 2:
            members.remove(rng.choice(members))
        else:
            members.append(MemberSpec(f"new{step:02d}", rng.randint(1, 8)))
        result = assignor.assign(AssignmentSpec(tuple(members), current, load))
        assert_valid(result, tuple(members))
        assert imbalance(result, load, tuple(members)) <= 1.10
        current = dict(result.ranges)
        worst = max(worst, max(len(owned) for owned in current.values()))
        mean = sum(len(owned) for owned in current.values()) / len(current)
        assert mean <= assignor.max_ranges, f"step {step}: {mean:.1f} ranges per member"
    assert worst <= FRAGMENT_BOUND, worst


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 32), seeds)
def test_load_aware_without_load_balances_slot_counts(n: int, seed: int) -> None:
    rng = random.Random(seed)
    members = make_members(rng, n)
    current = earlier_assignment(rng, "load-aware", members)
    result = LoadAwareAssignor().assign(AssignmentSpec(members, current, None))
    q = quotas(members)
    for mid, owned in result.ranges.items():  # within the 5% tolerance (+ rounding)
        assert abs(owned.size - q[mid]) <= 0.10 * q[mid] + 2


def load_moved(
    current: Mapping[str, RangeSet], target: Mapping[str, RangeSet], load: list[float] | None
) -> float:
    """Share of the load whose owner changes (slots when nothing is measured): what a
    handoff costs is the records of the moved keys, and an empty slot carries none."""
    weights = LoadPrefix(load)
    moved = sum(weights.of(owned - target.get(mid, EMPTY)) for mid, owned in current.items())
    return moved / weights.total


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 32), seeds)
@example(20, 1702663252)  # sparse skewed keys: 12% of the slots, 1.5% of the load moved
def test_load_aware_is_stable(n: int, seed: int) -> None:
    """Identical load moves nothing; 2% drift per bucket moves at most 2% of the load.

    Usually drift moves nothing (the keep band is twice the placement band). Counted in
    slots it can be much more with sparse, skewed keys: a boundary that must cross one
    key travels across the empty slots around it, which costs a handoff nothing.
    """
    rng = random.Random(seed)
    members = make_members(rng, n)
    load = random_load(rng, members)
    assignor = LoadAwareAssignor()
    first = assignor.assign(
        AssignmentSpec(members, earlier_assignment(rng, "load-aware", members), load)
    )
    again = assignor.assign(AssignmentSpec(members, dict(first.ranges), load))
    assert again == first
    assert slots_moved(first.ranges, again.ranges) == 0
    if load is None:
        return
    drift = [rng.uniform(0.98, 1.02) for _ in range(LOAD_BUCKET_COUNT)]
    drifted = [w * drift[s >> LOAD_BUCKET_SHIFT] for s, w in enumerate(load)]
    after = assignor.assign(AssignmentSpec(members, dict(first.ranges), drifted))
    assert load_moved(first.ranges, after.ranges, drifted) <= 0.02


def trips_the_hysteresis(
    members: tuple[MemberSpec, ...], result: Assignment, load: list[float]
) -> bool:
    meter = strategy_named("load-aware").imbalance
    assert meter is not None
    measured = meter(AssignmentSpec(members, dict(result.ranges), load), result.ranges)
    return measured > GroupConfig().rebalance_threshold


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 32), seeds, st.booleans())
def test_load_aware_result_does_not_trip_the_coordinators_hysteresis(
    n: int, seed: int, from_history: bool
) -> None:
    """What the strategy places, the coordinator's periodic check accepts: otherwise the
    group asks for a rebalance every hold period and each one moves boundaries for
    nothing.

    On smooth load. With a few hundred keys over dozens of members, each key a good part
    of a small member's share, the pieces cannot always be packed below the threshold
    (n=30, seed=45324 of `skewed_load`: 1.34); the repeated request then changes nothing
    (`test_load_aware_is_stable`). That is 1 of 150 random skewed groups, against 75 of
    150 with the raw measure."""
    rng = random.Random(seed)
    members = make_members(rng, n)
    load = smooth_load(rng, members)
    current = earlier_assignment(rng, "load-aware", members) if from_history else {}
    result = LoadAwareAssignor().assign(AssignmentSpec(members, current, load))
    assert not trips_the_hysteresis(members, result, load)


def test_hot_slots_do_not_trip_the_coordinators_hysteresis() -> None:
    """13 slots above the smallest fair share (the hottest 10% of the load) among 20
    members: the raw measure, relative to the best place for the hottest slot, stays at
    2.2 whatever the strategy does, so the group would ask for a rebalance forever."""
    rng = random.Random(1702663252)
    members = make_members(rng, 20)
    load = random_load(rng, members)
    assert load is not None and len(LoadAwareAssignor().assign(
        AssignmentSpec(members, {}, load)
    ).notes) == 6  # fmt: skip
    result = LoadAwareAssignor().assign(
        AssignmentSpec(members, earlier_assignment(rng, "load-aware", members), load)
    )
    raw = imbalance(result, load, members) / achievable_imbalance(load, members)
    assert raw > 2.0
    assert not trips_the_hysteresis(members, result, load)


def test_the_hysteresis_measure_is_the_profile_the_strategy_balances() -> None:
    """One slot carries 60% of the load and sits with a small member. Raw, that is 2.4,
    twice the 1.2 the biggest member could manage; the strategy counts a hot slot as one
    full share of its holder (who then gets little else), so by its measure this is
    balanced, and the coordinator must not ask it for rebalances it will not make."""
    members = (MemberSpec("a", 1), MemberSpec("b", 1), MemberSpec("c", 2))
    load = [0.0] * SLOT_COUNT
    load[100] = 60.0
    for s in range(40):
        load[s] = 1.0
    hot_with_a = Assignment(
        {
            "a": RangeSet.from_pairs([(41, MAX_SLOT)]),
            "b": RangeSet.from_pairs([(0, 13)]),
            "c": RangeSet.from_pairs([(14, 40)]),
        }
    )
    raw = imbalance(hot_with_a, load, members)
    assert raw == pytest.approx(2.4)
    assert raw / achievable_imbalance(load, members) == pytest.approx(2.0)  # the raw measure
    # Capped at 40/3 (water-filled): b holds 14 of 53.3 with a quarter of the capacity.
    assert balancing_imbalance(hot_with_a, load, members) == pytest.approx(14 / (160 / 3) * 4)
    assert not trips_the_hysteresis(members, hot_with_a, load)


def test_load_aware_reports_a_hot_slot_and_does_not_thrash() -> None:
    members = tuple(MemberSpec(f"m{i}") for i in range(4))
    load = [1.0] * SLOT_COUNT
    load[1234] = float(SLOT_COUNT)  # half of all load on one slot
    assignor = LoadAwareAssignor()
    result = assignor.assign(AssignmentSpec(members, {}, load))
    assert_valid(result, members)
    assert len(result.notes) == 1 and "slot 1234" in result.notes[0] and "50.0%" in result.notes[0]
    bound = achievable_imbalance(load, members)
    assert bound == pytest.approx(2.0, rel=1e-4)
    assert imbalance(result, load, members) <= bound + 0.05 + 1e-9
    for _ in range(3):
        assert assignor.assign(AssignmentSpec(members, dict(result.ranges), load)) == result


def test_load_aware_fresh_split_follows_load_not_slot_counts() -> None:
    members = (MemberSpec("a"), MemberSpec("b"))
    load = [0.0] * SLOT_COUNT
    for s in range(SLOT_COUNT // 4):  # all load in the first quarter
        load[s] = 1.0
    result = LoadAwareAssignor(tolerance=0.0).assign(AssignmentSpec(members, {}, load))
    assert result.ranges["a"] == RangeSet.from_pairs([(0, SLOT_COUNT // 8 - 1)])
    assert imbalance(result, load, members) == pytest.approx(1.0)


def test_imbalance_and_bound_examples() -> None:
    members = (MemberSpec("a", 1), MemberSpec("b", 3))
    half = Assignment(
        {"a": RangeSet.from_pairs([(0, 32767)]), "b": RangeSet.from_pairs([(32768, MAX_SLOT)])}
    )
    assert imbalance(half, None, members) == pytest.approx(2.0)  # a: 50% of slots, 25% of capacity
    assert achievable_imbalance(None, members) == 1.0
    load = [0.0] * SLOT_COUNT
    load[0] = 9.0
    load[1] = 1.0
    assert achievable_imbalance(load, members) == pytest.approx(0.9 / 0.75)
    assert imbalance(half, load, members) == pytest.approx(1.0 / 0.25)
    assert imbalance(half, [0.0] * SLOT_COUNT, members) == pytest.approx(2.0)  # zero = unmeasured


def test_auto_split_replays_the_pip_34_picture() -> None:
    """C1 alone; C2 splits C1; C3 splits the busier C2; C1 leaves; C2 leaves."""
    a = AutoSplitAssignor()
    half = SLOT_COUNT // 2

    def run(
        ids: str, current: Mapping[str, RangeSet], load: list[float] | None = None
    ) -> dict[str, RangeSet]:
        return dict(
            a.assign(
                AssignmentSpec(tuple(MemberSpec(i) for i in ids.split()), current, load)
            ).ranges
        )

    t0 = run("c1", {})
    assert t0 == {"c1": RangeSet.full()}
    t1 = run("c1 c2", t0)
    assert t1 == {
        "c1": RangeSet.from_pairs([(0, half - 1)]),
        "c2": RangeSet.from_pairs([(half, MAX_SLOT)]),
    }
    busy_c2 = [1.0 if s >= half else 0.0 for s in range(SLOT_COUNT)]
    t2 = run("c1 c2 c3", t1, busy_c2)
    three_q = half + half // 2
    assert t2 == {
        "c1": RangeSet.from_pairs([(0, half - 1)]),
        "c2": RangeSet.from_pairs([(half, three_q - 1)]),
        "c3": RangeSet.from_pairs([(three_q, MAX_SLOT)]),
    }
    t3 = run("c2 c3", t2)  # c1's only neighbour is c2
    assert t3 == {
        "c2": RangeSet.from_pairs([(0, three_q - 1)]),
        "c3": RangeSet.from_pairs([(three_q, MAX_SLOT)]),
    }
    assert run("c3", t3) == {"c3": RangeSet.full()}
    # Without load, the largest range is the busiest, so a fourth member splits c1's half.
    t4 = run("c1 c2 c3 c4", t2)
    assert t4["c4"] == RangeSet.from_pairs([(half // 2, half - 1)])


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 24), seeds)
def test_auto_split_joiner_takes_exactly_half_of_the_busiest(n: int, seed: int) -> None:
    rng = random.Random(seed)
    members = make_members(rng, n)
    load = random_load(rng, members)
    a = AutoSplitAssignor()
    current = dict(
        a.assign(
            AssignmentSpec(members, earlier_assignment(rng, "auto-split", members), load)
        ).ranges
    )
    weights = load if load is not None and any(load) else [1.0] * SLOT_COUNT

    def busyness(mid: str) -> tuple[float, int, str]:
        r = current[mid].ranges[0]
        return (-sum(weights[r.start : r.end + 1]), -r.size, mid)

    busiest = min((mid for mid in current if current[mid].size >= 2), key=busyness)
    (old,) = current[busiest].ranges
    joiner = MemberSpec("zz-new")
    target = dict(a.assign(AssignmentSpec((*members, joiner), current, load)).ranges)
    keep = old.size - old.size // 2
    assert target[joiner.member_id] == RangeSet.from_pairs([(old.start + keep, old.end)])
    assert target[joiner.member_id].size == old.size // 2
    assert target[busiest] == RangeSet.from_pairs([(old.start, old.start + keep - 1)])
    for mid in current:
        if mid != busiest:
            assert target[mid] == current[mid]


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 24), seeds)
def test_auto_split_leaver_goes_to_the_quieter_neighbour(n: int, seed: int) -> None:
    rng = random.Random(seed)
    members = make_members(rng, n)
    load = random_load(rng, members)
    weights = load if load is not None and any(load) else [1.0] * SLOT_COUNT
    a = AutoSplitAssignor()
    current = dict(a.assign(AssignmentSpec(members, {}, load)).ranges)
    line = sorted((owned.ranges[0].start, mid) for mid, owned in current.items() if owned)
    i = rng.randrange(len(line))
    gone = line[i][1]
    neighbours = [line[j][1] for j in (i - 1, i + 1) if 0 <= j < len(line)]

    def quietness(mid: str) -> tuple[float, int, str]:
        r = current[mid].ranges[0]
        return (sum(weights[r.start : r.end + 1]), r.size, mid)

    heir = min(neighbours, key=quietness)
    target = dict(
        a.assign(
            AssignmentSpec(tuple(m for m in members if m.member_id != gone), current, load)
        ).ranges
    )
    assert target[heir] == current[heir] | current[gone]
    assert len(target[heir]) == 1


def test_sticky_gives_declared_ranges_and_reports_the_rest() -> None:
    a = MemberSpec("a", fixed_ranges=RangeSet.from_pairs([(0, 99), (200, 299)]))
    b = MemberSpec("b", fixed_ranges=RangeSet.from_pairs([(100, 149)]))
    result = StickyAssignor().assign(AssignmentSpec((b, a)))
    assert result.ranges == {"a": a.fixed_ranges, "b": b.fixed_ranges}
    assert result.unassigned == RangeSet.from_pairs([(150, 199), (300, MAX_SLOT)])
    assert_valid(result, (a, b))
    (note,) = result.notes
    assert "[150, 199]" in note and "[300, 65535]" in note and "wait" in note


def test_sticky_resolves_overlap_it_should_never_see_by_lower_id() -> None:
    a = MemberSpec("a", fixed_ranges=RangeSet.from_pairs([(0, 99)]))
    b = MemberSpec("b", fixed_ranges=RangeSet.from_pairs([(50, 149)]))
    result = StickyAssignor().assign(AssignmentSpec((a, b)))
    assert result.ranges["b"] == RangeSet.from_pairs([(100, 149)])
    assert any("'b'" in n and "[50, 99]" in n for n in result.notes)


def test_validate_fixed_ranges_names_member_and_slots() -> None:
    existing = {
        "a": RangeSet.from_pairs([(0, 99)]),
        "b": RangeSet.from_pairs([(1000, 1999)]),
        "new": RangeSet.from_pairs([(0, MAX_SLOT)]),  # its own old declaration: ignored
    }
    assert validate_fixed_ranges(existing, "new", RangeSet.from_pairs([(100, 999)])) is None
    msg = validate_fixed_ranges(existing, "new", RangeSet.from_pairs([(90, 109), (1500, 1500)]))
    assert msg is not None
    assert "'new'" in msg and "'a' at slots [90, 99]" in msg and "'b' at slots [1500, 1500]" in msg
    for bad in (None, EMPTY):
        msg = validate_fixed_ranges(existing, "new", bad)
        assert msg is not None and "no fixed ranges" in msg


def test_every_name_is_registered() -> None:
    assert STRATEGY_NAMES[0] == "load-aware"
    for name in STRATEGY_NAMES:
        assert strategy_named(name).assignor.name == name
    with pytest.raises(ValueError, match="slot_load has 3 entries"):
        strategy_named("load-aware").assignor.assign(
            AssignmentSpec((MemberSpec("a"),), {}, [1.0, 2.0, 3.0])
        )
