"""Demand per load bucket (`coordinator.group.demand`): windows merged by offset."""

from __future__ import annotations

import itertools
import random

from hypothesis import given
from hypothesis import strategies as st

from keyshard.coordinator.group.demand import (
    BucketDemand,
    backlog_excess,
    demand_profile,
    discounted,
)
from keyshard.core.model.hashing import LOAD_BUCKET_COUNT, SLOT_COUNT
from keyshard.core.model.ranges import RangeSet, SlotRange

TP = ("t", 0)


@st.composite
def readers(draw: st.DrawFn) -> tuple[int, list[list[tuple[int, int]]], list[int]]:
    """N offsets read by 1-4 members, each from 0 in windows of its own cuts, and an
    interleaving of their reports (each member's in its own order)."""
    n = draw(st.integers(1, 400))
    members = []
    for _ in range(draw(st.integers(1, 4))):
        cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=6)))) if n > 1 else []
        bounds = [0, *cuts, n]
        members.append(list(itertools.pairwise(bounds)))
    order = [i for i, windows in enumerate(members) for _ in windows]
    draw(st.randoms()).shuffle(order)
    return n, members, order


@given(readers(), st.integers(0, 2**32 - 1))
def test_members_reading_one_partition_count_each_record_once(
    case: tuple[int, list[list[tuple[int, int]]], list[int]], seed: int
) -> None:
    """However the members cut their windows and whatever order the reports arrive in,
    the merged count is the number of records, not N times it, and one member alone is
    counted exactly, bucket by bucket."""
    n, members, order = case
    rng = random.Random(seed)
    buckets = [rng.randrange(LOAD_BUCKET_COUNT) for _ in range(n)]  # bucket of each offset
    demand = BucketDemand()
    next_window = [0] * len(members)
    for i in order:
        start, end = members[i][next_window[i]]
        next_window[i] += 1
        counts: dict[int, int] = {}
        for offset in range(start, end):
            counts[buckets[offset]] = counts.get(buckets[offset], 0) + 1
        demand.fetched(TP, start, end, counts.items(), 0.0)
    backlog = demand.backlog(0.0)
    assert backlog is not None
    assert abs(sum(backlog) - n) < 1e-6
    if len(members) == 1:
        truth = [0.0] * LOAD_BUCKET_COUNT
        for b in buckets:
            truth[b] += 1
        assert backlog == truth


def test_one_reader_counts_exactly_and_completions_drain_it() -> None:
    demand = BucketDemand()
    demand.fetched(TP, 10, 20, [(3, 6), (7, 4)], 0.0)
    demand.fetched(TP, 10, 20, [(3, 6), (7, 4)], 0.0)  # another member, same records
    demand.fetched(("t", 1), 0, 5, [(3, 5)], 0.0)  # another partition: more records
    backlog = demand.backlog(0.0)
    assert backlog is not None and (backlog[3], backlog[7], sum(backlog)) == (11, 4, 15)
    demand.completed([(3, 11), (7, 3)], 0.0)
    backlog = demand.backlog(0.0)
    assert backlog is not None and sum(backlog) == 1 and backlog[7] == 1
    demand.completed([(7, 5)], 0.0)  # more than waits (counted before a restart): zero
    assert demand.backlog(0.0) is None
    demand.fetched(TP, 20, 22, [(7, 2)], 0.0)  # later arrivals of that bucket count
    backlog = demand.backlog(0.0)
    assert backlog is not None and backlog[7] == 2


def test_a_window_straddling_the_frontier_adds_its_new_part() -> None:
    demand = BucketDemand()
    demand.fetched(TP, 0, 100, [(1, 100)], 0.0)
    demand.fetched(TP, 50, 150, [(2, 100)], 0.0)  # half of it is new
    backlog = demand.backlog(0.0)
    assert backlog is not None and (backlog[1], backlog[2]) == (100, 50)


def test_a_level_nothing_refreshes_fades() -> None:
    """A wrong count cannot linger: after one half-life half of it is left."""
    demand = BucketDemand(half_life_s=60.0)
    demand.fetched(TP, 0, 100, [(1, 100)], 10.0)
    backlog = demand.backlog(70.0)
    assert backlog is not None and abs(backlog[1] - 50) < 1e-9
    demand.completed([(1, 20)], 70.0)  # completions take real records off the level
    backlog = demand.backlog(130.0)
    assert backlog is not None and abs(backlog[1] - 15) < 1e-9
    later = demand.backlog(10_000.0)  # long after: rebasing keeps it finite
    assert later is None or sum(later) < 0.5


def test_forgotten_and_settled_backlogs_are_zero() -> None:
    demand = BucketDemand()
    demand.fetched(TP, 0, 30, [(1, 10), (2, 20)], 0.0)
    demand.forget([1])
    backlog = demand.backlog(0.0)
    assert backlog is not None and (backlog[1], backlog[2]) == (0, 20)
    assert demand.check_due(5.0) and not demand.check_due(5.5) and demand.check_due(6.0)
    demand.settle()
    assert demand.backlog(6.0) is None and not demand.check_due(10.0)
    demand.fetched(TP, 30, 35, [(1, 5)], 6.0)  # new arrivals count again
    backlog = demand.backlog(6.0)
    assert backlog is not None and backlog[1] == 5


def test_bad_counts_are_ignored() -> None:
    demand = BucketDemand()
    demand.fetched(TP, 5, 5, [(1, 3)], 0.0)  # an empty window
    demand.fetched(TP, 0, 9, [(-1, 3), (LOAD_BUCKET_COUNT, 3), (2, 0)], 0.0)
    assert demand.backlog(0.0) is None


def test_demand_is_backlog_plus_the_rate_over_the_horizon() -> None:
    assert demand_profile({}, None, 2.0) is None
    backlog = [0.0] * LOAD_BUCKET_COUNT
    backlog[1] = 32.0
    profile = demand_profile({1: 8.0, 4095: 1.6}, backlog, 2.0)
    assert profile is not None and len(profile) == SLOT_COUNT
    assert profile[16:32] == [3.0] * 16  # (32 + 8 x 2) / 16
    assert abs(sum(profile[-16:]) - 3.2) < 1e-9
    assert abs(sum(profile) - (48 + 3.2)) < 1e-9


def test_backlog_excess_is_the_busiest_members_records_beyond_its_share() -> None:
    backlog = [0.0] * LOAD_BUCKET_COUNT
    backlog[0] = 160.0  # slots 0-15, 10 records each
    backlog[9] = 40.0  # slots 144-159
    owned = {
        "a": RangeSet([SlotRange(0, 7)]),  # 80 records
        "b": RangeSet([SlotRange(8, 159)]),  # 80 + 40
        "c": RangeSet([SlotRange(160, SLOT_COUNT - 1)]),  # nothing
    }
    capacity = {"a": 1, "b": 1, "c": 2}
    assert backlog_excess(backlog, owned, capacity) == 120 - 50
    assert backlog_excess([0.0] * LOAD_BUCKET_COUNT, owned, capacity) == 0


@given(st.lists(st.integers(1, SLOT_COUNT - 1), max_size=12, unique=True), st.integers(0, 12))
def test_each_bucket_is_discounted_for_exactly_its_middle_slots_owner(
    cuts: list[int], pick: int
) -> None:
    """Ranges cut anywhere, members owning every other piece: a member's completions come
    off exactly the buckets whose middle slot it owns, and nobody else's."""
    bounds = [0, *sorted(cuts), SLOT_COUNT]
    pieces = [SlotRange(a, b - 1) for a, b in itertools.pairwise(bounds)]
    owned = {f"m{i}": RangeSet(pieces[i::3]) for i in range(3) if pieces[i::3]}
    member = sorted(owned)[pick % len(owned)]
    left = discounted([1.0] * LOAD_BUCKET_COUNT, owned, {member: 1e12})
    cleared = {b for b, w in enumerate(left or [0.0] * LOAD_BUCKET_COUNT) if w == 0}
    assert cleared == {b for b in range(LOAD_BUCKET_COUNT) if b * 16 + 8 in owned[member]}


def test_a_discount_is_pro_rata_and_never_below_zero() -> None:
    backlog = [0.0] * LOAD_BUCKET_COUNT
    backlog[0], backlog[1], backlog[2] = 30.0, 10.0, 5.0
    owned = {"a": RangeSet([SlotRange(0, 31)]), "b": RangeSet([SlotRange(32, SLOT_COUNT - 1)])}
    left = discounted(backlog, owned, {"a": 20.0, "b": 0.0})
    assert left is not None and (left[0], left[1], left[2]) == (15.0, 5.0, 5.0)
    left = discounted(backlog, owned, {"a": 100.0, "b": 100.0})
    assert left is None
