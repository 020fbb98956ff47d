"""A member's report as a handler call to judge later (coordinator.runtime.report_order).

Each reply or request that carries numbers (a Ping reply, a StopFetcher reply, a Leave, a
claim at Register) becomes a `Judge`: the handler called on the group as it is when the
judging happens, which may be after Kafka was asked where partitions end. The group may
be gone by then (handed over to another replica): nothing to judge.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from keyshard.coordinator.group import handlers
from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.reports import KnownEnds
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.report_order import Judge
from keyshard.core.model.positions import TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.messages import (
    PartitionPositions,
    PingResponse,
    RegisterRequest,
    StopFetcherResponse,
)
from keyshard.core.protocol.wire import positions_from_wire, ranges_from_wire
from keyshard.core.security.identity import Principal

log = logging.getLogger(__name__)

Groups = Mapping[str, GroupState]


def ping_judge(
    groups: Groups, group: str, member_id: str, reply: PingResponse, now: float
) -> Judge:
    positions = positions_from_wire(reply.positions)
    load = sorted(reply.load.items())
    marks = [((h.topic, h.partition), h.offset, h.stable) for h in reply.high_watermarks]
    fetched = [
        ((f.topic, f.partition), f.start, f.end, tuple(sorted(f.buckets.items())))
        for f in reply.fetched
    ]
    busy = None if reply.busy_ms is None else (reply.busy_records, reply.busy_ms)
    silences = {(f.topic, f.partition): f.ms / 1000 for f in reply.fetch_silences}

    def judge(known: KnownEnds) -> Result | None:
        state = groups.get(group)
        if state is None:
            return None
        return handlers.ping_answered(
            state, member_id=member_id, epoch=reply.member_epoch, positions=positions,
            load=load, now=now, high_watermarks=marks, fetched=fetched, busy=busy, known=known,
            silences=silences,
        )  # fmt: skip

    return judge


def stop_judge(
    groups: Groups, group: str, member_id: str, ranges: RangeSet, reply: StopFetcherResponse,
    now: float,
) -> Judge:  # fmt: skip
    positions = positions_from_wire(reply.positions)

    def judge(known: KnownEnds) -> Result | None:
        state = groups.get(group)
        if state is None:
            return None
        return handlers.stop_completed(
            state, member_id=member_id, ranges=ranges, positions=positions, now=now, known=known
        )

    return judge


def leave_judge(
    groups: Groups, group: str, member_id: str, positions: list[PartitionPositions], now: float
) -> Judge:
    update = positions_from_wire(positions)

    def judge(known: KnownEnds) -> Result | None:
        state = groups.get(group)
        if state is None:
            return None
        return handlers.leave(state, member_id=member_id, positions=update, now=now, known=known)

    return judge


def claim_judge(
    state: GroupState, request: RegisterRequest, topics: tuple[str, ...],
    partitions: tuple[TopicPartition, ...], fixed: RangeSet | None, now: float,
) -> Judge:  # fmt: skip
    """A Register with a claim the group holds a pending claim for; None when that
    ended meanwhile (its lease ran out: it registers as a new member)."""
    claim = request.claim
    assert claim is not None
    claimed, positions = ranges_from_wire(claim.owned), positions_from_wire(claim.positions)

    def judge(known: KnownEnds) -> Result | None:
        if claim.member_id not in state.claims:
            return None
        return handlers.reclaim(
            state,
            member_id=claim.member_id,
            member_epoch=claim.member_epoch,
            claimed=claimed,
            positions=positions,
            name=request.consumer_name,
            capacity=request.capacity,
            session_timeout_ms=request.session_timeout_ms,
            topics=topics,
            partitions=partitions,
            now=now,
            fixed_ranges=fixed,
            known=known,
            topic_pattern=request.topic_pattern,
        )

    return judge


def claim_owned_by(state: GroupState, member_id: str, principal: Principal) -> bool:
    """Whether the group holds a pending claim for `member_id` that `principal` may
    adopt: member ids are public (admin API, metric labels), so only the principal that
    owned the member can take its ranges over; anyone else registers as a new member."""
    pending = state.claims.get(member_id)
    if pending is None:
        return False
    if pending.principal != str(principal):
        log.warning(
            "group %s: %s sent a claim for member %s of %s: not adopted",
            state.group, principal, member_id, pending.principal,
        )  # fmt: skip
        return False
    return True
