"""A group as a replica taking it over finds it in the state log, as group records.

Positions come back as they were stored, and so do the group's topics, partitions and
transitions (a transition is not on the cluster to be seen again), and its audit trail
(who changed the group through the admin API: it goes on here). Members the log says
owned ranges become pending claims: their ranges are quarantined until the member must
have stopped on its own (the lease rule: its session timeout from now, when it could at
the latest have heard from the coordinator that had the group, plus the margin), and a
member that re-registers with a matching claim before then keeps them with no pause
(`handlers.reclaim`). Slots no
member owned are free at once: a cold start with an empty log grants immediately.

The target starts empty and current: the members that come back fill it in with what they
kept (`handlers.reclaim`), so adopting them moves nothing; anything else (a slot free, a
new member) makes the strategy compute a new one, as always.
"""

from __future__ import annotations

from keyshard.coordinator.group.effects import QuarantineTimer, Result, SetTimer
from keyshard.coordinator.group.growth import partitions_of
from keyshard.coordinator.group.records import (
    AdminActed,
    ClaimAwaited,
    PartitionsChanged,
    PositionsLoaded,
    Record,
    TargetComputed,
)
from keyshard.coordinator.group.state import PendingClaim
from keyshard.coordinator.storage.image import GroupImage


def takeover_result(image: GroupImage, now: float, margin_s: float) -> Result:
    records: list[Record] = [PositionsLoaded(tp, pmap) for tp, pmap in image.positions.items()]
    if image.topics is not None:
        stored = image.topics
        partitions = partitions_of(dict(stored.counts))
        records.append(
            PartitionsChanged(
                stored.topics, partitions, stored.transitions, now, stored.topic_pattern
            )
        )
    records.append(TargetComputed((), inputs_version=0))  # a fresh group's first inputs
    records += [AdminActed(entry) for entry in image.audit]  # the trail goes on from there
    result = Result(records=records)
    for member in image.members.values():
        if not member.owned:
            continue
        until = now + member.session_timeout_ms / 1000 + margin_s
        claim = PendingClaim(
            member.member_id, member.name, member.member_epoch, member.owned, until,
            member.principal,
        )  # fmt: skip
        result.records.append(ClaimAwaited(claim))
        result.effects.append(SetTimer(QuarantineTimer(member.member_id), until))
    return result
