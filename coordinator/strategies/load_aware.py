"""Load-aware contiguous ranges: the default strategy.

Every member owns one contiguous range, and the boundaries between ranges are placed so
that each member's share of the measured load (`spec.slot_load`) matches its share of
capacity. Slot counts are the wrong thing to balance: with skewed keys one slot can carry
more records than ten thousand others, so equal slot counts can still leave one consumer
with most of the work.

How a target is computed (all pure, all deterministic):

1. Order. Members keep the slot order of their current ranges (`tiles_from_current`), so a
   rebalance only slides boundaries and never swaps neighbours — a swap would move two
   whole ranges. Departed members drop out of the order (their slots go to a neighbour
   when the boundaries are placed). A joiner is tried at the gaps a cheap estimate ranks
   best and goes where placing the boundaries moves the fewest slots; with no current
   ranges at all the order is by member id.
2. The profile to balance caps every slot at the smallest member's fair share
   (`_capped`): a hotter slot cannot be split, and counting it as one full share gives
   its holder little else while the others balance among themselves.
3. Boundaries (`_placement.place`): the best achievable bottleneck R* and floor m* are
   found by bisection over an exact feasibility test. The current split is kept while
   every member is within `tolerance` of them; otherwise a new split within half the
   tolerance is placed, each boundary as close to where it is now as allowed. The two
   bands are hysteresis: identical load moves nothing, drifting load moves little.

Without a measurement (slot_load None or all zero) every slot weighs 1, which balances
slot counts like `quotas` (within the tolerance). A slot hotter than the fair share of
the smallest member is named in `Assignment.notes` with its share of the load; it is part
of the optimum the bands are measured against, so it does not cause repeated
rebalancing.

`imbalance` and `achievable_imbalance` are the measures the coordinator's hysteresis and
the benchmarks use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.assignor import Assignment, AssignmentSpec, MemberSpec
from coordinator.hashing import MAX_SLOT, SLOT_COUNT
from coordinator.ranges import EMPTY, RangeSet
from coordinator.strategies._common import LoadPrefix, capacity, single, tiles_from_current
from coordinator.strategies._placement import place

# Splits placed for real when choosing where joiners go, shared by all joiners of one
# call: at most 128, and fewer for large groups (a split costs ~1-4 ms at 64 members and
# ~20-100 ms at 256), so a join stays within a few hundred milliseconds.
_EXACT_SOLVES = 128
_EXACT_MEMBER_SOLVES = 2048


class LoadAwareAssignor:
    """Contiguous ranges whose measured loads match capacity shares, moving few slots.

    `tolerance` is in units of a fair share. The current split is kept while every
    member is within `tolerance` of the best achievable balance (see `_placement.place`);
    a new one is placed within half of it. It trades balance for movement: on uniform
    keys with 16-64 members (bench/README.md) a join or leave moves about 4-16x the
    minimum at 0.02, 4-11x at 0.05 (default) and 1.7-3.8x at 0.25 — the price of one
    contiguous range per member, where absorbing a change means sliding the boundaries
    of the members in between. `max_notes` caps how many hot slots are named in
    `Assignment.notes`.
    """

    name = "load-aware"

    def __init__(self, tolerance: float = 0.05, max_notes: int = 5) -> None:
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        self.tolerance = tolerance
        self.max_notes = max_notes

    def assign(self, spec: AssignmentSpec) -> Assignment:
        members = {m.member_id: m for m in spec.members}
        if not members:
            return Assignment({})
        if len(members) > SLOT_COUNT:
            raise ValueError(f"{len(members)} members cannot each own one of {SLOT_COUNT} slots")
        measured = LoadPrefix(spec.slot_load)
        caps = [capacity(m) for m in members.values()]
        load = _capped(measured, min(caps) / sum(caps))
        kept = [t for t in tiles_from_current(spec.current) if t.member_id in members]
        order = [t.member_id for t in kept if t.member_id is not None]
        old = {mid: (t.start, t.end) for mid, t in zip(order, kept, strict=True)}
        # Each member would like to keep its current last slot; whoever is last now also
        # covers a departed tail.
        preferred = [t.end for t in kept[:-1]] + [MAX_SLOT] * bool(kept)
        joiners = sorted(set(members) - set(order))
        if not order:  # fresh start: order by id, nothing to stay close to
            order, joiners = joiners, []
            ends = self._solve(load, [capacity(members[mid]) for mid in order], None)
        else:
            budget = min(_EXACT_SOLVES, max(4, _EXACT_MEMBER_SOLVES // len(members)))
            per_joiner = max(1, budget // max(1, len(joiners)))
            for joiner in joiners:
                order, preferred = self._insert(
                    joiner, order, preferred, old, members, load, per_joiner
                )
            ends = self._solve(load, [capacity(members[mid]) for mid in order], preferred)
        ranges: dict[str, RangeSet] = {}
        start = 0
        for mid, end in zip(order, ends, strict=True):
            ranges[mid] = single(start, end)
            start = end + 1
        notes = self._hot_slot_notes(measured, members) if measured.measured else ()
        return Assignment(dict(sorted(ranges.items())), notes=notes)

    def _solve(self, load: LoadPrefix, caps: list[int], preferred: list[int] | None) -> list[int]:
        """Last slot of each member, in order (see `_placement`)."""
        return place(load, caps, preferred, self.tolerance)

    def _insert(
        self,
        joiner: str,
        order: list[str],
        preferred: list[int],
        old: Mapping[str, tuple[int, int]],
        members: Mapping[str, MemberSpec],
        load: LoadPrefix,
        tries: int,
    ) -> tuple[list[str], list[int]]:
        """Insert `joiner` at the gap whose placement moves the fewest slots.

        The joiner owns nothing yet, so it prefers its left neighbour's end (an empty
        range). A cheap estimate ranks the gaps; the best `tries` of them are placed for
        real and the slots that would leave their current owners counted (ties: lowest
        gap). Returns the new order and preferences.
        """
        caps = [capacity(members[mid]) for mid in order]
        joiner_cap = capacity(members[joiner])
        estimate = self._estimated_moves(caps, preferred, joiner_cap, load)
        gaps = sorted(range(len(order) + 1), key=lambda at: (estimate[at], at))[:tries]

        def inserted(at: int) -> tuple[list[str], list[int], list[int]]:
            prefs = [*preferred[:at], preferred[at - 1] if at > 0 else -1, *preferred[at:]]
            prefs[-1] = MAX_SLOT
            return [*order[:at], joiner, *order[at:]], prefs, [*caps[:at], joiner_cap, *caps[at:]]

        if len(gaps) == 1:
            new_order, prefs, _ = inserted(gaps[0])
            return new_order, prefs
        best: tuple[int, int, list[str], list[int]] | None = None
        for at in gaps:
            new_order, prefs, new_caps = inserted(at)
            moved = _moved(old, new_order, self._solve(load, new_caps, prefs))
            if best is None or (moved, at) < best[:2]:
                best = (moved, at, new_order, prefs)
        assert best is not None
        return best[2], best[3]

    def _estimated_moves(
        self, caps: list[int], preferred: list[int], joiner_cap: int, load: LoadPrefix
    ) -> list[int]:
        """Per gap: how far boundaries would travel to the new cumulative targets.

        Each boundary is snapped as close to its current position as the tolerance
        allows; hot slots and budgets are ignored, which is why this only shortlists.
        """
        total_cap = sum(caps) + joiner_cap
        slack = self.tolerance * load.total * min([*caps, joiner_cap]) / total_cap
        costs: list[int] = []
        for at in range(len(caps) + 1):
            new_caps = [*caps[:at], joiner_cap, *caps[at:]]
            prefs = [*preferred[:at], preferred[at - 1] if at > 0 else -1, *preferred[at:]]
            cost = 0
            cumulative = 0
            for j in range(len(new_caps) - 1):
                cumulative += new_caps[j]
                target = load.total * cumulative / total_cap
                lo = load.first_end_reaching(target - slack)
                hi = max(lo, load.first_end_reaching(target + slack))
                cost += abs(min(max(prefs[j], lo), hi) - prefs[j])
            costs.append(cost)
        return costs

    def _hot_slot_notes(
        self, load: LoadPrefix, members: Mapping[str, MemberSpec]
    ) -> tuple[str, ...]:
        caps = [capacity(m) for m in members.values()]
        fair_share = min(caps) / sum(caps)
        threshold = load.total * fair_share
        hot = sorted(
            (s for s, w in enumerate(load.weights) if w > threshold),
            key=lambda s: (-load.weights[s], s),
        )
        bound = achievable_imbalance(load.weights, tuple(members.values()))
        notes = [
            f"slot {s} carries {load.weights[s] / load.total:.1%} of the measured load, more "
            f"than the smallest member's fair share ({fair_share:.1%}); a slot cannot be "
            f"split, so imbalance stays >= {bound:.2f}"
            for s in hot[: self.max_notes]
        ]
        if len(hot) > self.max_notes:
            notes.append(f"... and {len(hot) - self.max_notes} more slots above a fair share")
        return tuple(notes)


def _capped(load: LoadPrefix, min_share: float) -> LoadPrefix:
    """The profile to balance: every slot capped at the smallest member's fair share.

    A slot hotter than that cannot be split, so whoever holds it is over its share no
    matter what; balancing the raw load would then only bound everyone by that hot
    member's ratio, leaving the others free to drift up to it. Capped, a hot slot counts
    as one full share: its holder gets little else, and the others balance among
    themselves. The cap is water-filled (capping lowers the total, which lowers the fair
    share) until it settles.
    """
    if not load.measured:
        return load
    cap = load.total * min_share
    hot = [w for w in load.weights if w > cap]
    if not hot:
        return load
    for _ in range(32):
        capped_total = load.total - sum(w - cap for w in hot if w > cap)
        settled = capped_total * min_share
        if settled >= cap * (1 - 1e-9):
            break
        cap = settled
    return LoadPrefix([min(w, cap) for w in load.weights])


def _moved(old: Mapping[str, tuple[int, int]], order: list[str], ends: list[int]) -> int:
    """Slots of the current ranges `old` whose owner differs under the new `ends`."""
    moved = 0
    start = 0
    for mid, end in zip(order, ends, strict=True):
        if mid in old:
            a, b = old[mid]
            moved += (b - a + 1) - max(0, min(b, end) - max(a, start) + 1)
        start = end + 1
    return moved


def imbalance(
    assignment: Assignment, slot_load: Sequence[float] | None, members: Sequence[MemberSpec]
) -> float:
    """max over members of (share of the load) / (share of the capacity); 1.0 is perfect.

    The coordinator's hysteresis compares this with a threshold before asking for a
    rebalance. Without a measurement slot counts stand in for load. Load of unassigned
    slots counts in the total (it is waiting work nobody carries).
    """
    if not members:
        return 0.0
    load = LoadPrefix(slot_load)
    total_cap = sum(capacity(m) for m in members)
    return max(
        (load.of(assignment.ranges.get(m.member_id, EMPTY)) / load.total)
        / (capacity(m) / total_cap)
        for m in members
    )


def achievable_imbalance(slot_load: Sequence[float] | None, members: Sequence[MemberSpec]) -> float:
    """Lower bound on `imbalance` set by the hottest slot: no strategy can do better.

    The hottest slot must belong to someone; at best to the member with the most capacity.
    Contiguity or an unlucky order can make the real optimum higher, so this is a bound.
    """
    if not members:
        return 0.0
    load = LoadPrefix(slot_load)
    caps = [capacity(m) for m in members]
    hottest = max(load.weights) / load.total
    return max(1.0, hottest / (max(caps) / sum(caps)))
