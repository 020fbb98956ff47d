"""Property tests for the balanced assignor: coverage, balance, determinism, stickiness.

Previous assignments are produced the way they arise in a group: by assigning an earlier
membership (some of today's members plus some that have left since), possibly twice in a
row so the ranges are fragmented.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.coordinator.strategies.balanced import BalancedAssignor
from keyshard.coordinator.strategies.base import AssignmentSpec, MemberSpec, quotas, slots_moved
from keyshard.coordinator.strategies.registry import strategy_named
from keyshard.core.model.hashing import MAX_SLOT, SLOT_COUNT
from keyshard.core.model.ranges import EMPTY, RangeSet

ASSIGNOR = BalancedAssignor()


def make_members(rng: random.Random, n: int, prefix: str = "m") -> tuple[MemberSpec, ...]:
    ids = rng.sample(range(10_000), n)
    return tuple(MemberSpec(f"{prefix}{i:04d}", rng.randint(1, 8)) for i in ids)


def assign(
    members: tuple[MemberSpec, ...], current: Mapping[str, RangeSet] | None = None
) -> dict[str, RangeSet]:
    return dict(ASSIGNOR.assign(AssignmentSpec(members, dict(current or {}))).ranges)


def earlier_assignment(rng: random.Random, members: tuple[MemberSpec, ...]) -> dict[str, RangeSet]:
    """Assign one or two random earlier memberships (survivors + since-departed ones)."""
    current: dict[str, RangeSet] = {}
    for _ in range(rng.randint(1, 2)):
        survivors = [m for m in members if rng.random() < 0.6]
        departed = list(make_members(rng, rng.randint(0, 6), prefix="gone"))
        earlier = tuple(survivors + departed) or (members[0],)
        current = assign(earlier, current)
    return current


def assert_valid(target: Mapping[str, RangeSet], members: tuple[MemberSpec, ...]) -> None:
    assert set(target) == {m.member_id for m in members}
    ranges = sorted(r for owned in target.values() for r in owned)
    assert ranges[0].start == 0 and ranges[-1].end == MAX_SLOT
    for a, b in itertools.pairwise(ranges):
        assert a.end < b.start, f"overlap: {a} and {b}"
    union = EMPTY
    for owned in target.values():
        union = union | owned
    assert union == RangeSet.full()
    assert sum(owned.size for owned in target.values()) == SLOT_COUNT
    q = quotas(members)
    assert {mid: owned.size for mid, owned in target.items()} == q


scenario = st.tuples(st.integers(1, 64), st.integers(0, 2**32 - 1))


@settings(max_examples=150, deadline=None)
@given(scenario)
def test_fresh_assignment_is_complete_and_balanced(sc: tuple[int, int]) -> None:
    n, seed = sc
    members = make_members(random.Random(seed), n)
    target = assign(members)
    assert_valid(target, members)
    # from scratch every member gets one contiguous range
    assert all(len(owned) == 1 for owned in target.values())


@settings(max_examples=150, deadline=None)
@given(scenario)
def test_sticky_assignment(sc: tuple[int, int]) -> None:
    n, seed = sc
    rng = random.Random(seed)
    members = make_members(rng, n)
    current = earlier_assignment(rng, members)
    target = assign(members, current)
    assert_valid(target, members)

    # determinism: same spec twice, and member order does not matter
    assert assign(members, current) == target
    shuffled = list(members)
    rng.shuffle(shuffled)
    assert assign(tuple(shuffled), current) == target

    # minimal movement: only the excess of over-quota members and departed members' slots
    q = quotas(members)
    expected = sum(
        max(0, owned.size - q[mid]) if mid in q else owned.size for mid, owned in current.items()
    )
    assert slots_moved(current, target) == expected
    # a member under its quota keeps everything it had; one over it keeps a subset
    for mid, owned in current.items():
        if mid in q:
            kept = owned & target[mid]
            assert kept.size == min(owned.size, q[mid])

    # assigning the result again moves nothing
    assert assign(members, target) == target
    assert slots_moved(target, target) == 0


@settings(max_examples=150, deadline=None)
@given(scenario)
def test_removing_a_member_moves_only_its_slots(sc: tuple[int, int]) -> None:
    n, seed = sc
    n = max(n, 2)
    rng = random.Random(seed)
    members = make_members(rng, n)
    current = assign(members, earlier_assignment(rng, members))
    gone = rng.choice(members)
    remaining = tuple(m for m in members if m is not gone)
    target = assign(remaining, current)
    assert_valid(target, remaining)
    for m in remaining:
        assert current[m.member_id] - target[m.member_id] == EMPTY, (
            f"{m.member_id} lost slots although only {gone.member_id} left"
        )
    assert slots_moved(current, target) == current[gone.member_id].size


@settings(max_examples=150, deadline=None)
@given(scenario, st.integers(1, 8))
def test_adding_a_member_moves_exactly_its_quota(sc: tuple[int, int], capacity: int) -> None:
    n, seed = sc
    n = min(n, 63)
    rng = random.Random(seed)
    members = make_members(rng, n)
    current = assign(members, earlier_assignment(rng, members))
    newcomer = MemberSpec("zz-new", capacity)
    grown = (*members, newcomer)
    target = assign(grown, current)
    assert_valid(target, grown)
    assert slots_moved(current, target) == quotas(grown)[newcomer.member_id]
    for m in members:  # nobody gains: every moved slot goes to the newcomer
        assert target[m.member_id] - current[m.member_id] == EMPTY


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=64), st.randoms())
def test_quotas_sum_and_proportionality(caps: list[int], rng: random.Random) -> None:
    members = tuple(MemberSpec(f"m{i:02d}", c) for i, c in enumerate(caps))
    q = quotas(members)
    assert sum(q.values()) == SLOT_COUNT
    total = sum(caps)
    for m in members:
        assert abs(q[m.member_id] - SLOT_COUNT * m.capacity / total) < 1
    # equal capacities get shares within one slot of each other
    for a, b in itertools.combinations(members, 2):
        if a.capacity == b.capacity:
            assert abs(q[a.member_id] - q[b.member_id]) <= 1
    # order of members does not matter
    shuffled = list(members)
    rng.shuffle(shuffled)
    assert quotas(tuple(shuffled)) == q


def test_quota_examples() -> None:
    assert quotas(()) == {}
    assert quotas((MemberSpec("a"),)) == {"a": SLOT_COUNT}
    assert quotas((MemberSpec("a"), MemberSpec("b"), MemberSpec("c"))) == {
        "a": 21846,
        "b": 21845,
        "c": 21845,
    }
    assert quotas((MemberSpec("a", 3), MemberSpec("b", 1))) == {"a": 49152, "b": 16384}
    # capacity below 1 counts as 1
    assert quotas((MemberSpec("a", 0), MemberSpec("b", 1))) == {"a": 32768, "b": 32768}


def test_assignor_lookup() -> None:
    assert strategy_named("balanced").assignor.name == "balanced"
    with pytest.raises(ValueError, match="unknown assignor"):
        strategy_named("nope")
    target = ASSIGNOR.assign(AssignmentSpec((MemberSpec("a"), MemberSpec("b"))))
    assert 0 in target.ranges["a"]
    assert MAX_SLOT in target.ranges["b"]
