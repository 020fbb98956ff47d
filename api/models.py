"""Response models of the admin API, built from the coordinator's group state."""

from __future__ import annotations

from pydantic import BaseModel

from coordinator.group import GroupState, Handoff
from coordinator.positions import RangePositionMap


class PositionSegment(BaseModel):
    start: int
    end: int
    next_offset: int
    acked: list[tuple[int, int]]


class PartitionView(BaseModel):
    topic: str
    partition: int
    low_watermark: int
    segments: list[PositionSegment]


class DrainView(BaseModel):
    ranges: list[tuple[int, int]]
    deadline_in_s: float | None
    blocking_offsets: dict[str, int]  # "topic/partition" -> lowest unfinished offset


class MemberView(BaseModel):
    member_id: str
    name: str
    epoch: int
    capacity: int
    session_timeout_ms: int
    ranges: list[tuple[int, int]]
    slots: int
    starting: list[tuple[int, int]]
    draining: DrainView | None
    processed: int
    last_heard_s_ago: float


class HandoffView(BaseModel):
    handoff_id: int
    kind: str
    from_member: str
    to_members: list[str]
    ranges: list[tuple[int, int]]
    waiting: list[tuple[int, int]]
    started_at: float  # coordinator's CLOCK_MONOTONIC seconds
    resumed_at: float | None
    released_after_s: float | None
    pause_s: float | None


class QuarantineView(BaseModel):
    former_member: str
    ranges: list[tuple[int, int]]
    until_in_s: float


class GroupView(BaseModel):
    group: str
    topics: list[str]
    assignor: str
    members: list[MemberView]
    unowned: list[tuple[int, int]]
    unassigned: list[tuple[int, int]]  # the strategy gives these to nobody: records wait
    notes: list[str]  # what the strategy reported, e.g. a slot hotter than a fair share
    imbalanced_for_s: float | None  # load imbalance above the threshold for this long
    quarantined: list[QuarantineView]
    partitions: list[PartitionView]
    handoffs: list[HandoffView]


def partition_view(tp: tuple[str, int], pmap: RangePositionMap) -> PartitionView:
    return PartitionView(
        topic=tp[0],
        partition=tp[1],
        low_watermark=pmap.minimum_offset(),
        segments=[
            PositionSegment(
                start=s.start, end=s.end, next_offset=p.next_offset, acked=list(p.acked)
            )
            for s, p in pmap.segments()
        ],
    )


def handoff_view(h: Handoff) -> HandoffView:
    return HandoffView(
        handoff_id=h.handoff_id,
        kind=h.kind,
        from_member=h.from_member,
        to_members=list(h.to_members),
        ranges=h.ranges.to_pairs(),
        waiting=h.waiting.to_pairs(),
        started_at=h.started_at,
        resumed_at=h.resumed_at,
        released_after_s=None if h.released_at is None else h.released_at - h.started_at,
        pause_s=h.pause_s,
    )


def group_view(state: GroupState, now: float) -> GroupView:
    members = []
    for m in sorted(state.members.values(), key=lambda m: m.member_id):
        drain = None
        if m.draining:
            drain = DrainView(
                ranges=m.draining.to_pairs(),
                deadline_in_s=None if m.drain_deadline is None else m.drain_deadline - now,
                blocking_offsets={
                    f"{t}/{p}": state.position_map((t, p)).minimum_offset(m.draining)
                    for t, p in state.partitions
                },
            )
        members.append(
            MemberView(
                member_id=m.member_id,
                name=m.name,
                epoch=m.epoch,
                capacity=m.capacity,
                session_timeout_ms=m.session_timeout_ms,
                ranges=m.owned.to_pairs(),
                slots=m.owned.size,
                starting=m.starting.to_pairs(),
                draining=drain,
                processed=m.processed,
                last_heard_s_ago=now - m.last_heard,
            )
        )
    return GroupView(
        group=state.group,
        topics=list(state.topics),
        assignor=state.config.assignor,
        members=members,
        unowned=state.busy().complement().to_pairs(),
        unassigned=state.unassigned.to_pairs(),
        notes=list(state.notes),
        imbalanced_for_s=None if state.imbalanced_since is None else now - state.imbalanced_since,
        quarantined=[
            QuarantineView(
                former_member=q.former_member, ranges=q.ranges.to_pairs(), until_in_s=q.until - now
            )
            for q in state.quarantined
        ],
        partitions=[partition_view(tp, state.positions[tp]) for tp in sorted(state.positions)],
        handoffs=[handoff_view(h) for h in reversed(state.handoffs)],
    )
