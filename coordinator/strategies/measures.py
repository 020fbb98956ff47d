"""How balanced an assignment is: the measures the load-aware strategy, the coordinator's
hysteresis and the benchmarks share.

All three are "the busiest member's share of the load over its share of the capacity"
(1.0 is perfect), on different profiles: the raw load (`imbalance`, what a user sees),
the profile the load-aware strategy balances (`balancing_imbalance`, what the
coordinator's hysteresis watches), and the floor the hottest slot sets
(`achievable_imbalance`).
"""

from __future__ import annotations

from collections.abc import Sequence

from keyshard.coordinator.strategies._common import LoadPrefix, weight
from keyshard.coordinator.strategies.base import Assignment, MemberSpec
from keyshard.core.model.ranges import EMPTY


def capped(load: LoadPrefix, min_share: float) -> LoadPrefix:
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


def _worst_ratio(load: LoadPrefix, assignment: Assignment, members: Sequence[MemberSpec]) -> float:
    if not members:
        return 0.0
    total_cap = sum(weight(m) for m in members)
    return max(
        (load.of(assignment.ranges.get(m.member_id, EMPTY)) / load.total) / (weight(m) / total_cap)
        for m in members
    )


def imbalance(
    assignment: Assignment, slot_load: Sequence[float] | None, members: Sequence[MemberSpec]
) -> float:
    """max over members of (share of the load) / (share of the capacity); 1.0 is perfect.

    Without a measurement slot counts stand in for load. Load of unassigned slots counts
    in the total (it is waiting work nobody carries).
    """
    return _worst_ratio(LoadPrefix(slot_load), assignment, members)


def balancing_imbalance(
    assignment: Assignment, slot_load: Sequence[float] | None, members: Sequence[MemberSpec]
) -> float:
    """`imbalance` on the profile the load-aware strategy balances (`capped`).

    The coordinator's hysteresis compares this with its threshold. On the raw load a few
    slots hotter than a fair share can keep the ratio high whatever the assignment (with
    several of them, above `achievable_imbalance` too), so the group would ask for a
    rebalance every hold period, forever, and each one would move boundaries with the
    drift of the load and gain nothing. On the capped profile a rebalance is asked for
    only when the strategy would improve on what it placed.
    """
    if not members:
        return 0.0
    caps = [weight(m) for m in members]
    return _worst_ratio(capped(LoadPrefix(slot_load), min(caps) / sum(caps)), assignment, members)


def achievable_imbalance(slot_load: Sequence[float] | None, members: Sequence[MemberSpec]) -> float:
    """Lower bound on `imbalance` set by the hottest slot: no strategy can do better.

    The hottest slot must belong to someone; at best to the member with the most capacity.
    Contiguity or an unlucky order can make the real optimum higher, so this is a bound.
    """
    if not members:
        return 0.0
    load = LoadPrefix(slot_load)
    caps = [weight(m) for m in members]
    hottest = max(load.weights) / load.total
    return max(1.0, hottest / (max(caps) / sum(caps)))
