"""`replay`: the only code that mutates a `GroupState`.

Shaped like Kafka's new group coordinator: handlers (`coordinator.group.handlers`) are
pure functions that read the state and return records plus effects; the runtime applies
each record with `replay` and then carries out the effects. Keeping mutation in one place
makes the handoff rules testable with a fake clock and no sockets, and makes every change
of ownership a value that can be logged, persisted and asserted on.
"""

from __future__ import annotations

from keyshard.coordinator.group.demand import buckets_of
from keyshard.coordinator.group.records import (
    AdminActed,
    ClaimAwaited,
    DrainStarted,
    EndsObserved,
    GrantAcknowledged,
    GrantsHeld,
    GroupConfigChanged,
    ImbalanceObserved,
    MemberAdopted,
    MemberContacted,
    MemberHeard,
    MemberJoined,
    MemberRemoved,
    PartitionsChanged,
    PositionsAdvanced,
    PositionsLoaded,
    PositionsReset,
    QuarantineLifted,
    RangesGranted,
    RangesReleased,
    RangesRevoked,
    RebalanceRequested,
    Record,
    TargetComputed,
    TransitionsChanged,
)
from keyshard.coordinator.group.stalls import latest_readers
from keyshard.coordinator.group.state import (
    GroupState,
    Handoff,
    HandoffKind,
    Member,
    PendingClaim,
    Quarantine,
    Reset,
)
from keyshard.core.model.positions import RangePositionMap, TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet


def _caught_up(state: GroupState) -> bool:
    """Every partition of the group done to the end its members' fetches last saw."""
    ends = state.fetched_ends
    return bool(state.partitions) and all(
        tp in ends and tp in state.positions and state.positions[tp].minimum_offset() >= ends[tp]
        for tp in state.partitions
    )


def replay(state: GroupState, record: Record) -> None:
    """Apply one record. The only function that mutates a GroupState."""
    match record:
        case MemberJoined():
            state.members[record.member_id] = Member(
                member_id=record.member_id,
                name=record.name,
                capacity=record.capacity,
                session_timeout_ms=record.session_timeout_ms,
                last_heard=record.at,
                fixed_ranges=record.fixed_ranges,
                principal=record.principal,
            )
            _subscribe(state, record.topics, record.partitions, record.topic_pattern)
            state.inputs_version += 1
            state.joined_version = state.inputs_version
        case MemberHeard():
            member = state.members.get(record.member_id)
            if member is not None:
                # (A report judged after a check with Kafka may follow one heard later.)
                member.last_heard = max(member.last_heard, record.at)
                member.credit = max(0, member.credit + record.advanced - _completions(record))
                for tp, start, end, buckets in record.fetched:  # before the completions
                    state.demand.fetched(tp, start, end, buckets, record.at)
                if record.fetched:
                    state.readers = latest_readers(state.readers, record.member_id, record.at)
                if record.ping:
                    if member.pinged_at is not None and record.at > member.pinged_at:
                        completed = sum(c for _, c in record.load)
                        member.processed_per_s = completed / (record.at - member.pinged_at)
                    member.pinged_at = record.at
                    member.stalled_since = record.stalled_since
                if record.busy is not None:
                    busy_records, busy_ms = record.busy
                    member.speed.add(busy_records, busy_ms / 1000)
                if record.load:
                    member.load = dict(record.load)
                    member.processed += sum(c for _, c in record.load)
                    state.load.add(record.load, record.at)
                    state.demand.completed(record.load, record.at)
                for tp, offset, stable in record.high_watermarks:
                    state.high_watermarks[tp] = max(state.high_watermarks.get(tp, 0), offset)
                    state.fetched_ends[tp] = max(state.fetched_ends.get(tp, 0), offset)
                    state.stable_ends[tp] = stable
                if record.ping and state.demand.check_due(record.at) and _caught_up(state):
                    state.demand.settle()
        case MemberContacted():
            member = state.members.get(record.member_id)
            if member is not None:
                member.last_contacted = max(member.last_contacted, record.at)
        case PositionsAdvanced():
            known = set(state.partitions)
            for tp, segments in record.updates:
                if known and tp not in known:
                    continue  # left the group: a member that does not know yet reports it
                pmap = state.positions.get(tp)
                if pmap is None:
                    pmap = state.positions[tp] = RangePositionMap()
                for seg, pos in segments:
                    merged = [
                        (part, old.union(pos)) for part, old in pmap.segments(RangeSet((seg,)))
                    ]
                    pmap.update(merged)
                state.position_changes[tp] = state.positions_version + 1
            state.positions_version += 1
            state.log_version += 1
        case PositionsReset():
            pmap = state.positions.get(record.tp)
            if pmap is None:
                pmap = state.positions[record.tp] = RangePositionMap()
            for slots in record.slots:
                pmap.assign(slots, record.position)
            state.resets[record.tp] = Reset(record.slots, record.position, record.at)
            state.positions_version += 1
            state.position_changes[record.tp] = state.positions_version
            state.log_version += 1
        case TargetComputed():
            state.target = dict(record.target)
            state.target_version = record.inputs_version
            state.unassigned = record.unassigned
            state.notes = record.notes
            state.target_index = sorted(
                (r.start, r.end, mid) for mid, ranges in record.target for r in ranges
            )
            state.excess = {mid for mid in state.members if _has_excess(state, mid)}
            if state.target_version >= state.joined_version:
                state.grants_held_since = None
        case RebalanceRequested():
            state.inputs_version += 1
            state.imbalanced_since = None
            state.last_rebalance_imbalance = record.imbalance
        case ImbalanceObserved():
            state.imbalanced_since = record.since
            if record.since is None:
                state.last_rebalance_imbalance = None
        case RangesRevoked():
            member = state.members[record.member_id]
            member.draining = member.draining | record.ranges
            member.epoch = record.epoch
            member.last_contacted = max(member.last_contacted, record.at)
            member.drains.append((record.ranges, record.deadline))
            _member_changed(state, record.member_id)
            _refresh_excess(state, record.member_id)
            _open_handoff(state, HandoffKind.REVOKE, record.member_id, record.ranges, record.at)
        case DrainStarted():
            member = state.members.get(record.member_id)
            if member is not None:
                member.drains = [
                    (ranges, deadline if ranges - record.ranges else max(deadline, record.deadline))
                    for ranges, deadline in member.drains
                ]
        case RangesReleased():
            member = state.members[record.member_id]
            state.free = state.free | (record.ranges & member.owned)
            member.owned = member.owned - record.ranges
            member.draining = member.draining - record.ranges
            member.starting = member.starting - record.ranges
            member.drains = [
                (left, deadline)
                for ranges, deadline in member.drains
                if (left := ranges - record.ranges)
            ]
            _member_changed(state, record.member_id)
            _refresh_excess(state, record.member_id)
            _mark_released(state, record.ranges, record.at)
        case RangesGranted():
            member = state.members[record.member_id]
            member.owned = member.owned | record.ranges
            member.starting = member.starting | record.ranges
            member.epoch = record.epoch
            member.last_contacted = max(member.last_contacted, record.at)
            state.free = state.free - record.ranges
            state.grants_held_since = None
            state.ran_since_formed = True
            _member_changed(state, record.member_id)
            _refresh_excess(state, record.member_id)
            for h in state.open:
                if h.waiting.overlaps(record.ranges) and record.member_id not in h.to_members:
                    h.to_members.append(record.member_id)
        case GrantAcknowledged():
            member = state.members[record.member_id]
            member.starting = member.starting - record.ranges
            for h in list(state.open):
                if h.waiting.overlaps(record.ranges):
                    h.waiting = h.waiting - record.ranges
                    if not h.waiting:
                        h.resumed_at = record.at
                        state.open.remove(h)
        case MemberRemoved():
            member = state.members.pop(record.member_id)
            state.demand.forget(buckets_of(member.owned))  # its last completions are lost
            state.target.pop(record.member_id, None)
            state.excess.discard(record.member_id)
            if member.owned:
                kind = record.reason
                if record.quarantine_until is not None:
                    state.quarantined.append(
                        Quarantine(member.owned, record.quarantine_until, member.member_id)
                    )
                # Ranges already draining have an open "revoke" handoff; the rest open one.
                fresh = member.owned - member.draining
                if fresh:
                    _open_handoff(state, kind, member.member_id, fresh, record.at)
                if record.quarantine_until is None:
                    state.free = state.free | member.owned
                    _mark_released(state, member.owned, record.at)
                elif record.reclaimable:
                    state.claims[member.member_id] = PendingClaim(
                        member.member_id, member.name, member.epoch, member.owned,
                        record.quarantine_until, member.principal,
                    )  # fmt: skip
            _member_changed(state, record.member_id)
            state.inputs_version += 1
            if not state.members:
                state.ran_since_formed = False
        case ClaimAwaited(claim):
            state.claims[claim.member_id] = claim
            state.ran_since_formed = True
            state.quarantined.append(Quarantine(claim.owned, claim.until, claim.member_id))
            state.free = state.free - claim.owned
        case MemberAdopted():
            _adopt(state, record)
        case QuarantineLifted():
            lifted = [q for q in state.quarantined if q.until <= record.at]
            state.quarantined = [q for q in state.quarantined if q.until > record.at]
            for q in lifted:
                state.free = state.free | q.ranges
                _mark_released(state, q.ranges, record.at)
                if state.claims.pop(q.former_member, None) is not None:
                    _member_changed(state, q.former_member)  # it did not come back
        case GrantsHeld():
            state.grants_held_since = record.at
        case PositionsLoaded():
            state.positions[record.tp] = record.positions.copy()
        case GroupConfigChanged():
            state.config = record.config
        case AdminActed(entry):
            state.audit.append(entry)
            state.next_audit_seq = entry.seq + 1
            state.log_version += 1  # the trail is stored with the group
        case PartitionsChanged():
            kept = set(record.partitions)
            for tp in [tp for tp in state.partitions if tp not in kept]:
                _forget_partition(state, tp)
            state.dropped -= kept
            state.topics = record.topics
            state.partitions = record.partitions
            state.topic_pattern = record.topic_pattern
            state.transitions = {t.topic: t for t in record.transitions}
            state.topology_version += 1
            state.log_version += 1
            state.positions_version += 1  # the offsets committed for tooling cover them
        case TransitionsChanged():
            state.transitions = {t.topic: t for t in record.transitions}
            state.topology_version += 1
            state.log_version += 1
        case EndsObserved():
            known = set(state.partitions)
            for tp, offset in record.ends:
                if tp in known:
                    state.high_watermarks[tp] = max(state.high_watermarks.get(tp, 0), offset)
                    state.stable_ends.setdefault(tp, True)


def _completions(record: MemberHeard) -> int:
    """Records a reply says its member completed (`busy` counts some of `load`'s)."""
    return max(sum(c for _, c in record.load), record.busy[0] if record.busy else 0)


def _adopt(state: GroupState, record: MemberAdopted) -> None:
    """The member is back with the ranges both sides agree it owns; what its pending
    claim held beyond them is free now (it says it no longer runs them)."""
    mid = record.member_id
    state.claims.pop(mid, None)
    kept = [q for q in state.quarantined if q.former_member != mid]
    released = RangeSet(r for q in state.quarantined if q.former_member == mid for r in q.ranges)
    state.quarantined = kept
    state.free = (state.free | (released - record.owned)) - record.owned
    if released - record.owned:
        _mark_released(state, released - record.owned, record.at)
    state.members[mid] = Member(
        member_id=mid,
        name=record.name,
        capacity=record.capacity,
        session_timeout_ms=record.session_timeout_ms,
        last_heard=record.at,
        epoch=record.member_epoch,
        owned=record.owned,
        fixed_ranges=record.fixed_ranges,
        principal=record.principal,
    )
    _subscribe(state, record.topics, record.partitions, record.topic_pattern)
    state.inputs_version += 1
    state.joined_version = state.inputs_version
    for h in list(state.open):  # its lost ranges run again, on itself
        if h.waiting.overlaps(record.owned):
            h.waiting = h.waiting - record.owned
            if mid not in h.to_members:
                h.to_members.append(mid)
            if not h.waiting:
                h.resumed_at = record.at
                state.open.remove(h)
    state.ran_since_formed = True
    _member_changed(state, mid)
    _refresh_excess(state, mid)


def _subscribe(
    state: GroupState,
    topics: tuple[str, ...],
    partitions: tuple[TopicPartition, ...],
    pattern: str | None,
) -> None:
    """What a member registered with is what the group reads."""
    if (topics, partitions, pattern) != (state.topics, state.partitions, state.topic_pattern):
        state.topology_version += 1
        state.log_version += 1
    state.topics = topics
    state.partitions = partitions
    state.topic_pattern = pattern
    state.transitions = {t: tr for t, tr in state.transitions.items() if t in topics}


def _forget_partition(state: GroupState, tp: TopicPartition) -> None:
    """A partition that left the group: were its topic created again, its offsets would
    start over, and positions kept from before would skip its records."""
    state.positions.pop(tp, None)
    state.position_changes.pop(tp, None)
    state.resets.pop(tp, None)
    state.high_watermarks.pop(tp, None)
    state.fetched_ends.pop(tp, None)
    state.stable_ends.pop(tp, None)
    state.dropped.add(tp)


def _member_changed(state: GroupState, member_id: str) -> None:
    """What the state log holds of this member changed: its next write carries it."""
    state.log_version += 1
    state.member_changes[member_id] = state.log_version


def _open_handoff(
    state: GroupState, kind: HandoffKind, member_id: str, ranges: RangeSet, at: float
) -> None:
    if len(state.handoffs) == state.handoffs.maxlen and state.handoffs[0] in state.open:
        state.open.remove(state.handoffs[0])  # forgotten: history is bounded
    handoff = Handoff(state.next_handoff_id, kind, member_id, ranges, at, waiting=ranges)
    state.handoffs.append(handoff)
    state.open.append(handoff)
    state.next_handoff_id += 1


def _has_excess(state: GroupState, member_id: str) -> bool:
    member = state.members[member_id]
    return bool(member.owned - state.target.get(member_id, EMPTY) - member.draining)


def _refresh_excess(state: GroupState, member_id: str) -> None:
    if member_id in state.members and _has_excess(state, member_id):
        state.excess.add(member_id)
    else:
        state.excess.discard(member_id)


def _mark_released(state: GroupState, ranges: RangeSet, at: float) -> None:
    for h in state.open:
        if h.released_at is None and h.ranges.overlaps(ranges):
            h.released_at = at
