"""Placing the boundaries of contiguous ranges over a load profile (for `load-aware`).

Members are in a fixed slot order; member j owns slots end[j-1]+1 .. end[j] and at least
one slot. Everything works on prefix sums (`LoadPrefix`), so "the furthest end within a
budget" is one bisection.

The core is `_feasible_ends`: given per-member load bounds [lower_j, upper_j], the exact
set of ends of each member from which the members after it can still meet their bounds,
computed right to left as lists of intervals. A greedy "take as much as you may" is not
enough: because every member must own at least one slot, taking more can push the next
member's start onto a slot too heavy for it. On top of it:

1. `min_bottleneck`: the smallest R* such that some split gives every member at most R*
   fair shares. R* > 1 only when slots hotter than a fair share make balance impossible.
2. `_max_floor`: given that bottleneck, the highest m* such that everyone gets at least
   m* fair shares (below 1 when a hot slot leaves less for everyone else).
3. `place`: keep the current split while it is within a tolerance of both optima; else
   place a new one within half the tolerance, each boundary as close to where it is now
   as the bounds allow. Bounds per member (not a window around each ideal boundary) let
   every boundary drift a little, which is what keeps a join or leave from sliding
   every boundary in the group.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

from coordinator.hashing import MAX_SLOT
from coordinator.strategies._common import LoadPrefix

# Bounds are compared against float prefix sums; a relative slack keeps a split that is
# exactly at its bound feasible despite rounding in the sums.
SLACK = 1e-9
_BISECTION_STEPS = 48
_NEAR_ENOUGH = 1.001  # the bottleneck is found to within 0.1%

Intervals = list[tuple[int, int]]  # sorted, disjoint, inclusive


def place(
    load: LoadPrefix, caps: list[int], preferred: list[int] | None, tolerance: float
) -> list[int]:
    """Last slot of each member: best balance, and as close to `preferred` as allowed.

    With R* the best achievable bottleneck and m* the best achievable floor (the highest
    minimum load/fair share given that bottleneck), the current split (`preferred`) is
    kept as it is while every member stays within [m* - tolerance, R* + tolerance].
    Otherwise a split within the half-as-wide band [m* - tolerance/2, R* + tolerance/2]
    is placed, each end as close to its preferred position as possible. The two bands are
    hysteresis: a split just placed sits well inside the keep band, so measurement noise
    does not move it again. R* and m* are optima, hence continuous in the load; bounds
    derived from one particular split would jump when a hot slot's rounding flips.
    With `preferred` None (nothing to stay close to) the balanced split is returned.
    """
    k = len(caps)
    fair = [load.total * c / sum(caps) for c in caps]
    best = min_bottleneck(load, fair)
    upper = [(best + tolerance / 2) * f * (1 + SLACK) for f in fair]
    floor, sets = _max_floor(load, fair, upper)
    if preferred is not None and _within(
        load, fair, preferred, floor - tolerance, best + tolerance
    ):
        return list(preferred)
    lower = [max(0.0, floor - tolerance / 2) * f * (1 - SLACK) for f in fair]
    band_sets = _feasible_ends(load, lower, upper)
    if band_sets is None:  # only float rounding: fall back to the floor's own bounds
        lower = [floor * f * (1 - SLACK) for f in fair]
    else:
        sets = band_sets
    if preferred is None:
        fair_after = [sum(fair[j:]) for j in range(k)]

        def goal(j: int, start: int) -> float:
            rest = load.total - load.prefix[start]
            return load.prefix[start] + rest * fair[j] / fair_after[j]

        ends = _walk(load, lower, upper, sets, goal, by_load=True)
    else:
        ends = _walk(load, lower, upper, sets, lambda j, _start: preferred[j])
    assert ends is not None, "the sets were computed for these bounds"
    return ends


def _within(load: LoadPrefix, fair: list[float], ends: list[int], low: float, high: float) -> bool:
    """Whether `ends` is a split (every member >= 1 slot) with all ratios in [low, high]."""
    if not ends or ends[-1] != MAX_SLOT:
        return False
    start = 0
    for j, end in enumerate(ends):
        if end < start:
            return False
        ratio = load.load(start, end) / fair[j]
        if not low - SLACK <= ratio <= high + SLACK:
            return False
        start = end + 1
    return True


def _max_floor(
    load: LoadPrefix, fair: list[float], upper: list[float]
) -> tuple[float, list[Intervals]]:
    """Highest m (to 0.1%) such that a split within `upper` gives everyone >= m fair shares."""
    k = len(fair)
    sets = _feasible_ends(load, [0.0] * k, upper)
    assert sets is not None, "upper is at least the best bottleneck"
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        found = _feasible_ends(load, [mid * f * (1 - SLACK) for f in fair], upper)
        if found is None:
            hi = mid
        else:
            lo, sets = mid, found
    return lo, sets


def min_bottleneck(load: LoadPrefix, fair: list[float]) -> float:
    """Smallest R (to 0.1%) such that a split gives every member at most R fair shares.

    R is at least 1 (the shares sum to the total) and at least the hottest slot over the
    largest fair share; that bound is usually feasible, which settles R with one test.
    Otherwise bisection between it and "anyone could carry everything".
    """
    k = len(fair)

    def feasible(r: float) -> bool:
        return _feasible_ends(load, [0.0] * k, [r * f * (1 + SLACK) for f in fair]) is not None

    lo = max(1.0, max(load.weights) / max(fair))
    if feasible(lo * _NEAR_ENOUGH):
        return lo * _NEAR_ENOUGH
    hi = max(load.total / f for f in fair)  # anyone could carry everything: feasible
    for _ in range(_BISECTION_STEPS):
        if hi <= lo * _NEAR_ENOUGH:
            break
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _walk(
    load: LoadPrefix,
    lower: list[float],
    upper: list[float],
    sets: list[Intervals],
    want: Callable[[int, int], float],
    by_load: bool = False,
) -> list[int] | None:
    """Left to right, each end as close to `want(j, start)` as the bounds and sets allow.

    `want` gives a slot (closest by distance in slots) or, with `by_load`, a cumulative
    load (closest by load; ties to the lower end). None if rounding left no choice.
    """
    ends: list[int] = []
    start = 0
    for j in range(len(lower) - 1):
        lo = max(start, load.first_end_reaching(load.prefix[start] + lower[j] * (1 - SLACK)))
        hi = load.last_end_at_most(load.prefix[start] + upper[j] * (1 + SLACK))
        target = want(j, start)
        best: int | None = None
        best_cost = 0.0
        for a, b in sets[j]:
            a, b = max(a, lo), min(b, hi)
            if a > b:
                continue
            if by_load:
                options = {
                    min(max(e, a), b)
                    for e in (load.last_end_at_most(target), load.first_end_reaching(target))
                }
            else:
                options = {min(max(int(target), a), b)}
            for e in sorted(options):
                cost = abs(load.prefix[e + 1] - target) if by_load else abs(e - target)
                if best is None or cost < best_cost:
                    best, best_cost = e, cost
        if best is None:
            return None
        ends.append(best)
        start = best + 1
    ends.append(MAX_SLOT)
    return ends


def _feasible_ends(
    load: LoadPrefix, lower: list[float], upper: list[float]
) -> list[Intervals] | None:
    """For each member j, the ends from which members j+1.. can meet their bounds.

    Right to left: for a run of ends e' of member j, its possible starts (load between
    the bounds, at least one slot) form one interval as long as no slot inside the run
    weighs more than upper - lower (the start intervals of neighbouring ends then touch),
    so runs are cut at such heavy slots and the start intervals merged. The ends of
    member j-1 are those starts minus one. None if member 0 cannot start at slot 0.
    """
    k = len(lower)
    sets: list[Intervals] = [[] for _ in range(k)]
    sets[-1] = [(MAX_SLOT, MAX_SLOT)]
    for j in range(k - 1, -1, -1):
        band = upper[j] - lower[j]
        heavy = load.heavier_than(band)
        starts: Intervals = []
        for a, b in sets[j]:
            cuts = heavy[bisect_right(heavy, a) : bisect_right(heavy, b)]
            piece_start = a
            for h in [*cuts, b + 1]:
                p, q = piece_start, h - 1
                piece_start = h
                if p > q:
                    continue
                s_lo = max(bisect_left(load.prefix, load.prefix[p + 1] - upper[j]), j)
                s_hi = min(bisect_right(load.prefix, load.prefix[q + 1] - lower[j]) - 1, q)
                if s_lo <= s_hi:
                    starts.append((s_lo, s_hi))
        if j == 0:
            return sets if any(s <= 0 <= t for s, t in starts) else None
        sets[j - 1] = _merge([(s - 1, t - 1) for s, t in starts])
        if not sets[j - 1]:
            return None
    return sets


def _merge(intervals: Intervals) -> Intervals:
    merged: Intervals = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
