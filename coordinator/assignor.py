"""Assignors: pure functions from group membership to slot ownership.

Shaped like Kafka's `PartitionAssignor` (a `name` and `assign(spec)`): the group state
machine hands over immutable inputs and gets an `Assignment` back, so strategies can be
tested as plain functions and swapped per group. What moved is derived from the diff of
current and target (`slots_moved`), which is what the ordered handoff acts on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.hashing import SLOT_COUNT
from coordinator.ranges import EMPTY, RangeSet, SlotRange


@dataclass(frozen=True, slots=True)
class MemberSpec:
    member_id: str
    capacity: int = 1
    # Ranges the member declared at Register (the `sticky` strategy); None otherwise.
    fixed_ranges: RangeSet | None = None


@dataclass(frozen=True, slots=True)
class AssignmentSpec:
    members: tuple[MemberSpec, ...]
    # The previous target of each member (sticky input; departed members are absent).
    current: Mapping[str, RangeSet] = field(default_factory=dict)
    # Measured load per slot (len SLOT_COUNT, e.g. records/s), or None before any
    # measurement. Only load-aware strategies read it.
    slot_load: Sequence[float] | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    ranges: Mapping[str, RangeSet]
    # Slots no member may take (sticky: nobody declared them). Their records wait.
    unassigned: RangeSet = EMPTY
    # Human-readable findings worth surfacing (e.g. a slot hotter than a fair share).
    notes: tuple[str, ...] = ()

    def owner_of(self, slot: int) -> str | None:
        for member_id, owned in self.ranges.items():
            if slot in owned:
                return member_id
        return None


class Assignor(Protocol):
    name: str

    def assign(self, spec: AssignmentSpec) -> Assignment: ...


def quotas(members: tuple[MemberSpec, ...]) -> dict[str, int]:
    """Slots each member should own, proportional to capacity (largest remainder, ties by id),
    summing to exactly SLOT_COUNT."""
    if not members:
        return {}
    total = sum(max(1, m.capacity) for m in members)
    exact = {m.member_id: SLOT_COUNT * max(1, m.capacity) / total for m in members}
    base = {mid: int(v) for mid, v in exact.items()}
    short = SLOT_COUNT - sum(base.values())
    by_remainder = sorted(exact, key=lambda mid: (-(exact[mid] - base[mid]), mid))
    for mid in by_remainder[:short]:
        base[mid] += 1
    return base


def slots_moved(current: Mapping[str, RangeSet], target: Mapping[str, RangeSet]) -> int:
    """Slots whose owner changes (orphaned slots of departed members count as moved)."""
    moved = 0
    for member_id, owned in current.items():
        moved += (owned - target.get(member_id, EMPTY)).size
    return moved


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


ASSIGNORS: dict[str, Assignor] = {BalancedAssignor.name: BalancedAssignor()}


def register_assignor(assignor: Assignor) -> None:
    ASSIGNORS[assignor.name] = assignor


def known_assignors() -> list[str]:
    """Every registered strategy name, the built-in ones included."""
    import coordinator.strategies  # noqa: F401 - registers the built-in strategies

    return sorted(ASSIGNORS)


def assignor_named(name: str) -> Assignor:
    import coordinator.strategies  # noqa: F401 - registers the built-in strategies

    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ValueError(
            f"unknown assignor {name!r}; known: {', '.join(sorted(ASSIGNORS))}"
        ) from None
