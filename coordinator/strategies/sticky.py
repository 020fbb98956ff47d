"""Fixed ranges: every member consumes exactly the slot ranges it declared at Register.

This is Pulsar's Key_Shared STICKY mode (`HashRangeExclusiveStickyKeyConsumerSelector`):
the operator, not the coordinator, decides who owns what — for example to pin a tenant's
keys to a dedicated consumer. Nothing is balanced and nothing moves unless a member
re-registers with other ranges.

Two rules keep the contract (one owner per key, nothing lost):
- declarations must not overlap: `validate_fixed_ranges` is the check the Register
  handler runs, and it rejects the newcomer, never silently shrinks anyone;
- slots nobody declared are not skipped: they are reported as `unassigned`, their records
  stay in the log at the committed position, and they are delivered as soon as some member
  declares them.
"""

from __future__ import annotations

from collections.abc import Mapping

from keyshard.coordinator.strategies._common import describe_ranges
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec
from keyshard.core.model.ranges import EMPTY, RangeSet


def validate_fixed_ranges(
    existing: Mapping[str, RangeSet], member_id: str, ranges: RangeSet | None
) -> str | None:
    """Why `member_id` may not register with `ranges`, or None if it may.

    `existing` maps the other members to their declared ranges; an entry for `member_id`
    itself is ignored (a re-registration replaces its own declaration). The message names
    every member it collides with and the exact slots, so the operator can fix the config.
    """
    if ranges is None or not ranges:
        return (
            f"member {member_id!r} declared no fixed ranges; the sticky strategy needs "
            "at least one slot range per member"
        )
    clashes = []
    for other in sorted(existing):
        if other == member_id:
            continue
        overlap = ranges & existing[other]
        if overlap:
            clashes.append(f"{other!r} at slots {describe_ranges(overlap)}")
    if clashes:
        return f"fixed ranges of {member_id!r} overlap those of " + "; ".join(clashes)
    return None


class StickyAssignor:
    """Each member gets its `fixed_ranges`; undeclared slots are reported, not given away.

    The Register handler should have rejected overlapping declarations already; should two
    reach the assignor anyway (e.g. replayed from an older version), the lower member id
    keeps the contested slots and a note names them, so ownership stays exclusive.
    """

    name = "sticky"

    def assign(self, spec: AssignmentSpec) -> Assignment:
        ranges: dict[str, RangeSet] = {}
        notes: list[str] = []
        claimed = EMPTY
        for m in sorted(spec.members, key=lambda m: m.member_id):
            declared = m.fixed_ranges or EMPTY
            contested = declared & claimed
            if contested:
                notes.append(
                    f"{m.member_id!r} declared slots {describe_ranges(contested)} that a "
                    "lower member id already owns; they stay with that member"
                )
            ranges[m.member_id] = declared - claimed
            claimed = claimed | ranges[m.member_id]
        unassigned = claimed.complement()
        if unassigned:
            notes.append(
                f"{unassigned.size} slots are declared by no member: "
                f"{describe_ranges(unassigned)}; their records wait until a member declares them"
            )
        return Assignment(ranges, unassigned=unassigned, notes=tuple(notes))
