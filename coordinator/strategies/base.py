"""The strategy interface: pure functions from group membership to slot ownership.

Shaped like Kafka's `PartitionAssignor` (a `name` and `assign(spec)`): the group state
machine hands over immutable inputs and gets an `Assignment` back, so strategies can be
tested as plain functions and swapped per group. What moved is derived from the diff of
current and target (`slots_moved`), which is what the ordered handoff acts on.

A `Strategy` is an assignor plus what the group state machine needs from it beyond
`assign`: most strategies are only an assignor; `sticky` also checks the ranges a member
declares at Register, and `load-aware` measures imbalance for the periodic,
hysteresis-guarded rebalance. Carrying those with the assignor keeps handlers and the
runtime free of strategy names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from keyshard.core.model.hashing import SLOT_COUNT
from keyshard.core.model.ranges import EMPTY, RangeSet


@dataclass(frozen=True, slots=True)
class MemberSpec:
    member_id: str
    capacity: int = 1
    # Ranges the member declared at Register (the `sticky` strategy); None otherwise.
    fixed_ranges: RangeSet | None = None
    # Its measured speed per unit of capacity against the group's (1.0: typical, or not
    # measured; coordinator.group.speed). Only strategies that place by load read it.
    speed: float = 1.0


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


RangeValidator = Callable[[Mapping[str, RangeSet], str, RangeSet | None], str | None]
"""(declared ranges of the other members, member id, its declaration) -> why it may not
register, or None."""
ImbalanceMeter = Callable[[AssignmentSpec, Mapping[str, RangeSet]], float]
"""(inputs with measured load, current target) -> busiest load share / capacity share."""


@dataclass(frozen=True, slots=True)
class Strategy:
    assignor: Assignor
    validate_ranges: RangeValidator | None = None
    # Only strategies that place by load are rebalanced when the load drifts.
    imbalance: ImbalanceMeter | None = None

    @property
    def name(self) -> str:
        return self.assignor.name
