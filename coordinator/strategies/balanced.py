"""`balanced`: capacity-weighted slot counts with the fewest slots moved."""

from __future__ import annotations

from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec, quotas
from keyshard.core.model.ranges import EMPTY, RangeSet, SlotRange


class BalancedAssignor:
    """Capacity-weighted shares with the fewest slots moved.

    Every member keeps what it owns up to its quota; only the excess of over-quota members
    and the slots of departed members move, which is the minimum any balanced assignment
    can move. Deficits are filled from free runs adjacent to a member's own ranges first,
    then from the largest free run, so ranges stay contiguous and few.
    """

    name = "balanced"

    def assign(self, spec: AssignmentSpec) -> Assignment:
        members = tuple(sorted(spec.members, key=lambda m: m.member_id))
        quota = quotas(members)
        kept: dict[str, RangeSet] = {}
        claimed = EMPTY
        for m in members:
            own = spec.current.get(m.member_id, EMPTY) - claimed
            own = _trim_to(own, quota[m.member_id])
            kept[m.member_id] = own
            claimed = claimed | own
        free = claimed.complement()
        for m in members:
            deficit = quota[m.member_id] - kept[m.member_id].size
            while deficit > 0 and free:
                run, take_low = _pick_run(free, kept[m.member_id])
                n = min(deficit, run.size)
                part = (
                    SlotRange(run.start, run.start + n - 1)
                    if take_low
                    else SlotRange(run.end - n + 1, run.end)
                )
                kept[m.member_id] = kept[m.member_id] | RangeSet((part,))
                free = free - RangeSet((part,))
                deficit -= n
        return Assignment(dict(kept))


def _trim_to(owned: RangeSet, limit: int) -> RangeSet:
    """Keep the lowest `limit` slots of `owned`: the excess is released from the top."""
    keep: list[SlotRange] = []
    left = limit
    for r in owned:
        if left <= 0:
            break
        if r.size <= left:
            keep.append(r)
            left -= r.size
        else:
            keep.append(SlotRange(r.start, r.start + left - 1))
            left = 0
    return RangeSet(keep)


def _pick_run(free: RangeSet, owned: RangeSet) -> tuple[SlotRange, bool]:
    """A free run to take from and whether to take from its low end.

    A run touching the member's own ranges extends them (no new range); otherwise the
    largest run, lowest first for determinism.
    """
    for run in free:
        for r in owned:
            if run.start == r.end + 1:
                return run, True
            if run.end + 1 == r.start:
                return run, False
    largest = max(free, key=lambda r: (r.size, -r.start))
    return largest, True
