"""Consistent hashing over the slot space, as Pulsar's default Key_Shared selector does it.

Every member puts `points_per_member * capacity` points on a ring of SLOT_COUNT
positions; a slot belongs to the member owning the first point at or after it, wrapping
past the last slot to the first point. The result is a pure function of the member set
(ids and capacities): it ignores `spec.current` and `spec.slot_load`. That is what makes
the strategy attractive: when a member leaves, only the slots in front of its points
change owner and every other member keeps all it had; when one joins, it takes slots only
from the members whose points follow its own. The price is balance — with 100 points a
member's share varies by roughly +-10% (one standard deviation), and hot keys are not
considered at all.

Point positions use the same hash as keys (`slot_for_key`, murmur3 masked, mod 65536), so
the ring is reproducible anywhere the slot numbers are.
"""

from __future__ import annotations

from keyshard.coordinator.strategies._common import capacity
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec, MemberSpec
from keyshard.core.model.hashing import MAX_SLOT, slot_for_key
from keyshard.core.model.ranges import RangeSet, SlotRange


def point_key(member_id: str, index: int) -> bytes:
    """The bytes hashed for one ring point: f"{len(id)}:{id}:{index}".

    A plain concatenation f"{id}{index}" would let different members produce the same
    bytes — "c1" point 11 and "c11" point 1 are both "c111" — so two members would land on
    the same positions by construction, not by chance. The length prefix makes the
    encoding injective: it says where the id ends, so "2:c1:11" and "3:c11:1" differ, and a
    ':' inside an id cannot fake a boundary. (Pulsar separates with NUL for the same
    reason.) Distinct keys can still hash to the same slot; `ring` resolves that.
    """
    return f"{len(member_id)}:{member_id}:{index}".encode()


def ring(members: tuple[MemberSpec, ...], points_per_member: int) -> list[tuple[int, str]]:
    """Sorted (position, owner) points; on a shared position the lowest member id wins.

    The tie rule depends only on the ids present, so it keeps the strategy a pure function
    of the member set: if the winner leaves, the position passes to the next-lowest id that
    has a point there — one of the leaver's own slots, so nobody else is disturbed.
    """
    owner: dict[int, str] = {}
    for m in members:
        for i in range(points_per_member * capacity(m)):
            pos = slot_for_key(point_key(m.member_id, i))
            held = owner.get(pos)
            if held is None or m.member_id < held:
                owner[pos] = m.member_id
    return sorted(owner.items())


class ConsistentHashAssignor:
    """A ring with `points_per_member` points per unit of capacity (Pulsar default 100).

    Capacity weights a member by giving it proportionally more points, so its expected
    share is proportional to its capacity; with capacity 1 this is Pulsar's selector.
    More points tighten balance (spread ~ 1/sqrt(points)) at the cost of more, smaller
    ranges per member.
    """

    name = "consistent-hash"

    def __init__(self, points_per_member: int = 100) -> None:
        if points_per_member < 1:
            raise ValueError("points_per_member must be at least 1")
        self.points_per_member = points_per_member

    def assign(self, spec: AssignmentSpec) -> Assignment:
        members = tuple(sorted(spec.members, key=lambda m: m.member_id))
        points = ring(members, self.points_per_member)
        owned: dict[str, list[SlotRange]] = {m.member_id: [] for m in members}
        if points:
            previous = -1
            for pos, member_id in points:
                owned[member_id].append(SlotRange(previous + 1, pos))
                previous = pos
            if previous < MAX_SLOT:  # wrap: slots past the last point go to the first point
                owned[points[0][1]].append(SlotRange(previous + 1, MAX_SLOT))
        return Assignment({mid: RangeSet(rs) for mid, rs in owned.items()})
