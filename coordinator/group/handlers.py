"""Pure group handlers: `(state, request, now) -> Result(records, effects, error)`.

Nothing here performs I/O or reads a clock; the runtime (`coordinator.runtime`) applies the
records with `replay` and carries out the effects (send StopFetcher/StartFetcher, close a
channel, arm or cancel a keyed timer). Tests drive these with a hand-moved clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from keyshard.coordinator.group.effects import (
    BalanceTimer,
    CancelTimer,
    CloseMember,
    DrainTimer,
    HoldTimer,
    QuarantineTimer,
    Result,
    SendStart,
    SendStop,
    SessionTimer,
    SetTimer,
    TimerKey,
)
from keyshard.coordinator.group.records import (
    DrainStarted,
    FetchedCounts,
    GrantAcknowledged,
    GrantsHeld,
    MemberAdopted,
    MemberContacted,
    MemberHeard,
    MemberJoined,
    MemberRemoved,
    PositionsAdvanced,
    QuarantineLifted,
    RangesGranted,
    RangesReleased,
    RangesRevoked,
    Record,
    TargetComputed,
)
from keyshard.coordinator.group.reports import (
    KnownEnds,
    Refusal,
    check_positions,
    check_progress,
    counted_completions,
)
from keyshard.coordinator.group.stalls import judge_progress
from keyshard.coordinator.group.state import ANONYMOUS_PRINCIPAL, GroupState, HandoffKind
from keyshard.coordinator.group.targets import assignment_spec, target_computed
from keyshard.coordinator.strategies.base import (
    Assignor,
    RangeValidator,
)
from keyshard.core.model.positions import PositionUpdate, TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet
from keyshard.core.protocol.messages import ErrorCode

# How long grants wait at most for the recompute that places members who joined after the
# current target's inputs. That recompute starts within the recomputer's max defer (2 s)
# of the change, or one recompute's duration after the previous one ended, and takes its
# own duration: the runtime passes twice its recompute_max_defer_ms.
GRANT_HOLD_S = 4.0


def _inconsistent_topics(
    state: GroupState, topics: tuple[str, ...], pattern: str | None = None
) -> Result | None:
    """Every member of a group reads the same topics: the slot space is shared by all of
    them (one key, one owner, in every topic). A group subscribed by pattern: the same
    pattern (the topics it matches change with the cluster, not with the member)."""
    if not state.members:
        return None
    if pattern is not None or state.topic_pattern is not None:
        if pattern == state.topic_pattern:
            return None
        theirs = _subscription(state.topics, state.topic_pattern)
        return Result(
            error=(
                ErrorCode.INCONSISTENT_TOPICS,
                f"group {state.group!r} reads {theirs}; this consumer asked for "
                f"{_subscription(topics, pattern)}",
            )
        )
    if set(topics) != set(state.topics):
        return Result(
            error=(
                ErrorCode.INCONSISTENT_TOPICS,
                f"group {state.group!r} reads topics {sorted(state.topics)}; "
                f"this consumer asked for {sorted(topics)}",
            )
        )
    return None


def _subscription(topics: tuple[str, ...], pattern: str | None) -> str:
    return f"topics {sorted(topics)}" if pattern is None else f"topic pattern {pattern!r}"


def register(
    state: GroupState,
    *,
    member_id: str,
    name: str,
    capacity: int,
    session_timeout_ms: int,
    topics: tuple[str, ...],
    partitions: tuple[TopicPartition, ...],
    now: float,
    fixed_ranges: RangeSet | None = None,
    validate_ranges: RangeValidator | None = None,
    topic_pattern: str | None = None,
    principal: str = ANONYMOUS_PRINCIPAL,
) -> Result:
    """A consumer joins.

    1. Validate: the session timeout within the server's bounds, room in the group
       (coordinator.group.bounds), and every member of a group reads the same topics,
       because the slot space is shared by all of them (one key, one owner, in every topic).
    2. A strategy with declared ranges (sticky) validates them against the other members'.
    3. Record the member (its capacity capped by the server's maximum) and arm its
       session timer.
    The next `reconcile` computes the new target and starts the handoff.
    """
    refusal = state.bounds.session_refusal(session_timeout_ms)
    refusal = refusal or state.bounds.members_refusal(state.group, len(state.members))
    if refusal is not None:
        return Result(error=refusal)
    if (refused := _inconsistent_topics(state, topics, topic_pattern)) is not None:
        return refused
    if validate_ranges is not None:
        declared = {
            mid: m.fixed_ranges for mid, m in state.members.items() if m.fixed_ranges is not None
        }
        problem = validate_ranges(declared, member_id, fixed_ranges)
        if problem is not None:
            return Result(error=(ErrorCode.INVALID_RANGES, problem))
    capacity = state.bounds.capped_capacity(capacity)
    return Result(
        records=[
            MemberJoined(
                member_id,
                name,
                capacity,
                session_timeout_ms,
                topics,
                partitions,
                now,
                fixed_ranges,
                topic_pattern,
                principal,
            )
        ],
        effects=[SetTimer(SessionTimer(member_id), now + session_timeout_ms / 1000)],
    )


def ping_answered(
    state: GroupState,
    *,
    member_id: str,
    epoch: int,
    positions: PositionUpdate,
    load: Iterable[tuple[int, int]],
    now: float,
    high_watermarks: Iterable[tuple[TopicPartition, int, bool]] = (),
    fetched: Iterable[FetchedCounts] = (),
    busy: tuple[int, int] | None = None,
    known: KnownEnds | None = None,
    silences: Mapping[TopicPartition, float] | None = None,
) -> Result:
    """A Ping reply: proof of life, progress, load, demand and the partition ends it sees.

    1. Unknown member (fenced or removed meanwhile): error, nothing applied.
    2. Check every number against what the coordinator knows (coordinator.group.reports,
       `known`: the partition ends): a lie fences the member and nothing of the reply
       counts; numbers past ends not confirmed yet wait (`Result.confirm`), the runtime
       then judges the reply again (its liveness counted meanwhile: `heard`).
    3. Renew the session.
    4. A stale epoch still proves life but its positions are dropped: they may describe
       ranges this member has since given up.
    5. Positions are applied only for slots the member owns right now; its completions
       count as far as its positions moved.
    6. No progress for the stall bound while records wait in its slots: the member has
       failed, whatever its channel says (coordinator.group.stalls): fenced.
    """
    member = state.members.get(member_id)
    if member is None:
        return Result(error=(ErrorCode.UNKNOWN_MEMBER, f"member {member_id!r} is not in the group"))
    progress = check_progress(state, high_watermarks, fetched, known)
    stale = epoch != member.epoch
    checked = check_positions(
        state, {} if stale else positions, member.owned, field="positions", known=known
    )
    refusal = progress.refusal or checked.refusal
    if refusal is not None:
        return fenced_for(state, member_id, refusal, now)
    if progress.confirm or checked.confirm:
        return Result(confirm={**progress.confirm, **checked.confirm})
    load, busy = counted_completions(tuple(load), busy, member.credit + checked.growth)
    stall = member.stalled_since
    if not stale:
        stall, verdict = judge_progress(
            state, member, advanced=checked.growth > 0, silences=silences or {}, now=now
        )
        if verdict is not None:
            return fence(state, member_id, verdict, now)
    heard = MemberHeard(
        member_id, now, load, progress.high_watermarks, progress.fetched, ping=True,
        busy=busy, advanced=checked.growth, stalled_since=stall,
    )  # fmt: skip
    result = Result(
        records=[heard],
        effects=[SetTimer(SessionTimer(member_id), now + member.session_timeout_ms / 1000)],
    )
    if stale:
        result.error = (
            ErrorCode.STALE_EPOCH,
            f"epoch {epoch} is stale, member {member_id!r} is at {member.epoch}",
        )
        return result
    if checked.advanced:
        result.records.append(PositionsAdvanced(checked.advanced))
    return result


def heard(state: GroupState, *, member_id: str, now: float) -> Result:
    """A reply that proves the member alive, whatever its numbers turn out to be."""
    member = state.members.get(member_id)
    if member is None:
        return Result()
    return Result(
        records=[MemberHeard(member_id, now)],
        effects=[SetTimer(SessionTimer(member_id), now + member.session_timeout_ms / 1000)],
    )


def fenced_for(state: GroupState, member_id: str, refusal: Refusal, now: float) -> Result:
    """A member whose report was refused: see `fence`."""
    return fence(state, member_id, refusal.message, now)


def fence(state: GroupState, member_id: str, why: str, now: float) -> Result:
    """A member judged failed: removed, its ranges moving from the last good positions
    once it must have stopped (it may run on while its lease lasts)."""
    member = state.members[member_id]
    stopped_by = now + member.session_timeout_ms / 1000
    close = (ErrorCode.FENCED_MEMBER, why)
    return _remove(state, member_id, HandoffKind.FENCED, stopped_by, now, close)


def stop_completed(
    state: GroupState,
    *,
    member_id: str,
    ranges: RangeSet,
    positions: PositionUpdate,
    now: float,
    known: KnownEnds | None = None,
) -> Result:
    """A StopFetcher reply: the member drained `ranges`; its final positions make them free.

    Positions are checked as a Ping's are (a lie fences the member: its ranges move from
    the last good positions) and applied before the release, so the next owner starts
    exactly where this one stopped: a graceful handoff produces no duplicates.
    """
    member = state.members.get(member_id)
    if member is None:
        return Result()  # fenced meanwhile: its ranges move from their last positions
    released = ranges & member.draining
    checked = check_positions(state, positions, released, field="positions", known=known)
    if checked.refusal is not None:
        return fenced_for(state, member_id, checked.refusal, now)
    if checked.confirm:
        return Result(confirm=checked.confirm)
    result = Result(records=[MemberHeard(member_id, now)])
    if checked.advanced:
        result.records.append(PositionsAdvanced(checked.advanced))
    if released:
        result.records.append(RangesReleased(member_id, released, now))
    left = [d for r, d in member.drains if r - released]
    if left:
        result.effects.append(SetTimer(DrainTimer(member_id), min(left)))
    else:
        result.effects.append(CancelTimer(DrainTimer(member_id)))
    return result


def stop_written(state: GroupState, *, member_id: str, ranges: RangeSet, now: float) -> Result:
    """The StopFetcher for `ranges` left: the drain deadline counts from now.

    A StopFetcher can wait behind an earlier StartFetcher to the same member (which waits
    for a position write) or behind a busy loop; counting from the decision would leave
    the member less than the drain timeout, and on an overloaded coordinator fence
    members that drained in time. Deadlines only move later.
    """
    member = state.members.get(member_id)
    if member is None or not member.drains:
        return Result()
    deadline = now + state.config.drain_timeout_ms / 1000
    moved = [d if r - ranges else max(d, deadline) for r, d in member.drains]
    return Result(
        records=[DrainStarted(member_id, ranges, deadline)],
        effects=[SetTimer(DrainTimer(member_id), min(moved))],
    )


def contacted(state: GroupState, *, member_id: str, now: float) -> Result:
    """We are sending a member a request: it will restart its session clock on it."""
    if member_id not in state.members:
        return Result()
    return Result(records=[MemberContacted(member_id, now)])


def start_completed(state: GroupState, *, member_id: str, ranges: RangeSet, now: float) -> Result:
    member = state.members.get(member_id)
    if member is None:
        return Result()
    return Result(records=[MemberHeard(member_id, now), GrantAcknowledged(member_id, ranges, now)])


def leave(
    state: GroupState,
    *,
    member_id: str,
    positions: PositionUpdate,
    now: float,
    known: KnownEnds | None = None,
) -> Result:
    """Graceful leave: the consumer drained everything and reports final positions, so its
    ranges are free at once (no quarantine). Final positions that do not check out
    fence it instead: its ranges then wait out its lease and move from the last good ones."""
    member = state.members.get(member_id)
    if member is None:
        return Result(error=(ErrorCode.UNKNOWN_MEMBER, f"member {member_id!r} is not in the group"))
    checked = check_positions(state, positions, member.owned, field="positions", known=known)
    if checked.refusal is not None:
        fenced = fenced_for(state, member_id, checked.refusal, now)
        fenced.error = (ErrorCode.FENCED_MEMBER, checked.refusal.message)
        return fenced
    if checked.confirm:
        return Result(confirm=checked.confirm)
    result = Result()
    if checked.advanced:
        result.records.append(PositionsAdvanced(checked.advanced))
    result.records.append(MemberRemoved(member_id, HandoffKind.LEAVE, None, now))
    result.effects += [CancelTimer(SessionTimer(member_id)), CancelTimer(DrainTimer(member_id))]
    return result


def connection_lost(
    state: GroupState, *, member_id: str, now: float, reclaimable: bool = True
) -> Result:
    """The channel closed without a Leave. The member keeps processing while its lease
    lasts (docs/protocol.md §7), so its ranges wait until it must have stopped on its own
    (session timeout after it last heard from us, plus a margin); until then it may come
    back with a claim for them (`reclaim`), unless `reclaimable` is False (fenced)."""
    member = state.members.get(member_id)
    if member is None:
        return Result()
    stopped_by = max(member.must_have_stopped_by(), now)
    return _remove(state, member_id, HandoffKind.LOST, stopped_by, now, None, reclaimable)


def reclaim(
    state: GroupState,
    *,
    member_id: str,
    member_epoch: int,
    claimed: RangeSet,
    positions: PositionUpdate,
    name: str,
    capacity: int,
    session_timeout_ms: int,
    topics: tuple[str, ...],
    partitions: tuple[TopicPartition, ...],
    now: float,
    fixed_ranges: RangeSet | None = None,
    known: KnownEnds | None = None,
    topic_pattern: str | None = None,
) -> Result:
    """A member that lost its coordinator is back, with what it still runs and exact
    positions (docs/protocol.md §7.4).

    1. Validate the session timeout and the topics, as for any Register, and the claim's
       positions as a Ping's (coordinator.group.reports): a claim that does not check
       out is refused (FENCED_MEMBER), and what it held waits out its lease.
    2. It keeps what it claims *and* its pending claim (the durable state, or what it
       owned when its channel closed) says it owns: no StopFetcher, no StartFetcher, no
       pause. What it claims beyond that is not adopted (it must stop those now); what
       the pending claim held beyond it becomes free.
    3. Its positions count for every range the pending claim held: nobody else has run
       them since, and done offsets are done (positions merge by union).
    4. Its epoch moves past both sides' last, so anything older from it is stale.
    5. The target stays what the previous coordinator decided, extended by what the
       member kept, as long as it was current, nothing is free and no one else is meant
       to have those slots: adopting is not a reason to move slots (a recompute would,
       with no load measured yet).
    The caller checks that a pending claim exists (else this is a fresh Register).
    """
    pending = state.claims[member_id]
    if (refusal := state.bounds.session_refusal(session_timeout_ms)) is not None:
        return Result(error=refusal)
    if (refused := _inconsistent_topics(state, topics, topic_pattern)) is not None:
        return refused
    checked = check_positions(
        state, positions, pending.owned, field="claim.positions", known=known,
        partitions=partitions,
    )  # fmt: skip
    if checked.refusal is not None:
        return Result(error=(ErrorCode.FENCED_MEMBER, checked.refusal.message))
    if checked.confirm:
        return Result(confirm=checked.confirm)
    owned = claimed & pending.owned
    records: list[Record] = []
    if checked.advanced:
        records.append(PositionsAdvanced(checked.advanced))
    epoch = max(member_epoch, pending.member_epoch) + 1
    records.append(
        MemberAdopted(
            member_id=member_id,
            name=name,
            capacity=state.bounds.capped_capacity(capacity),
            session_timeout_ms=session_timeout_ms,
            topics=topics,
            partitions=partitions,
            member_epoch=epoch,
            owned=owned,
            at=now,
            fixed_ranges=fixed_ranges,
            topic_pattern=topic_pattern,
            principal=pending.principal,
        )
    )
    others = (t for mid, t in state.target.items() if mid != member_id)
    if (
        state.target_version == state.inputs_version
        and not (state.free | (pending.owned - owned))
        and not any(t.overlaps(owned) for t in others)
    ):
        target = {**state.target, member_id: owned}
        kept = TargetComputed(
            tuple(sorted(target.items())), state.inputs_version + 1, state.unassigned, state.notes
        )
        records.append(kept)
    return Result(
        records=records,
        effects=[
            CancelTimer(QuarantineTimer(member_id)),
            SetTimer(SessionTimer(member_id), now + session_timeout_ms / 1000),
        ],
    )


def timer_fired(state: GroupState, *, key: TimerKey, now: float) -> Result:
    """A session, drain, quarantine or hold timer fired (`balance.balance_check` has its own).

    Timers may fire late or for a deadline that has moved since they were armed, so each
    one judges again with what is known now:
    - session: the member is lost only if nothing was heard for its session timeout
      (else the timer is re-armed for when it would be);
    - drain: the member is fenced only if a StopFetcher deadline really passed (else the
      timer is re-armed for the earliest one left);
    - quarantine: lost members' ranges whose wait is over become free (and their claims
      to come back for them end);
    - hold: nothing to record; the reconcile that follows grants what the hold kept back
      if it has lasted its longest (`reconcile`).
    """
    match key:
        case SessionTimer(member_id):
            member = state.members.get(member_id)
            if member is None:
                return Result()
            expires = member.last_heard + member.session_timeout_ms / 1000
            if now < expires:
                # Heard since the timer was armed (a Stop/StartFetcher reply renews the
                # session too, without re-arming): judge again then, or a member that
                # goes silent after such a reply would never expire.
                return Result(effects=[SetTimer(key, expires)])
            return _remove(
                state,
                member_id,
                HandoffKind.LOST,
                max(member.must_have_stopped_by(), now),
                now,
                (ErrorCode.FENCED_MEMBER, "session expired: no reply within the session timeout"),
            )
        case DrainTimer(member_id):
            member = state.members.get(member_id)
            if member is None or not member.drains:
                return Result()
            overdue = [ranges for ranges, deadline in member.drains if deadline <= now]
            if not overdue:
                return Result(effects=[SetTimer(key, min(d for _, d in member.drains))])
            late = RangeSet(r for ranges in overdue for r in ranges)
            return _remove(
                state,
                member_id,
                HandoffKind.FENCED,
                now + member.session_timeout_ms / 1000,
                now,
                (
                    ErrorCode.FENCED_MEMBER,
                    f"did not drain {late} within the drain deadline "
                    f"of {state.config.drain_timeout_ms} ms",
                ),
            )
        case QuarantineTimer():
            if any(q.until <= now for q in state.quarantined):
                return Result(records=[QuarantineLifted(now)])
            return Result()
        case HoldTimer() | BalanceTimer():
            return Result()


def _remove(
    state: GroupState,
    member_id: str,
    reason: HandoffKind,
    stopped_by: float,
    now: float,
    close: tuple[ErrorCode, str] | None,
    reclaimable: bool = False,
) -> Result:
    member = state.members[member_id]
    until = stopped_by + state.config.lost_member_margin_ms / 1000 if member.owned else None
    result = Result(
        records=[MemberRemoved(member_id, reason, until, now, reclaimable)],
        effects=[CancelTimer(SessionTimer(member_id)), CancelTimer(DrainTimer(member_id))],
    )
    if until is not None:
        result.effects.append(SetTimer(QuarantineTimer(member_id), until))
    if close is not None:
        result.effects.append(CloseMember(member_id, *close))
    return result


def reconcile(
    state: GroupState,
    *,
    now: float,
    assignor: Assignor,
    recompute: bool = True,
    hold_s: float = GRANT_HOLD_S,
) -> Result:
    """Drive ownership toward the target, in the order that keeps every key with one owner.

    1. Recompute the target when membership changed (sticky: current target is the input).
       With `recompute=False` a stale target is left for a later call: the runtime uses
       that to fold a burst of joins into one recompute; steps 2 and 3 still run against
       the current target, which is always a valid one.
    2. Members owning slots outside their target get StopFetcher for exactly those slots;
       everything else they own keeps flowing.
    3. Slots nobody owns, drains or quarantines are granted to their target owner with
       the positions where the previous owner stopped.
    Grants wait while members joined after the inputs of the target (a storm of joins
    with a pause in it: the target for the first wave lands after the second wave
    joined). That target gives the joiners nothing, so the one that places them takes a
    piece of every member's target:
    a grant now would be revoked moments later (at 5,000 members, thousands of
    StopFetchers). The recompute that places them is already due (the recomputer's max
    defer) and reads targets, not ownership, so holding changes no outcome; a lone join
    or leave is not held (its target is current when adopted). Bounded: at most `hold_s`
    from the first grant held back (a `HoldTimer` reconciles then), after which slots
    go to their owner under the current target anyway, so in a storm that never pauses
    no slot waits longer than that.

    The cost is what changed, not the group's size: step 2 visits only the members
    `replay` marked as owning slots outside their target (`state.excess`), step 3 only the
    free slots (`state.free`) and the target ranges over them (`state.target_owners`).
    """
    result = Result()
    if not state.members:
        return result
    target = state.target
    excess = state.excess
    free = state.free
    target_version = state.target_version
    if recompute and state.target_version != state.inputs_version:
        target_version = state.inputs_version
        record = target_computed(
            state, assignor.assign(assignment_spec(state, now)), state.inputs_version
        )
        target = dict(record.target)
        result.records.append(record)
        excess = {
            mid for mid, m in state.members.items() if m.owned - target.get(mid, EMPTY) - m.draining
        }
    epochs: dict[str, int] = {}
    drain_timeout = state.config.drain_timeout_ms / 1000
    for mid in sorted(excess):
        member = state.members[mid]
        revoke = member.owned - target.get(mid, EMPTY) - member.draining
        if revoke:
            epochs[mid] = member.epoch + 1
            result.records.append(RangesRevoked(mid, revoke, epochs[mid], now + drain_timeout, now))
            result.effects.append(SendStop(mid, revoke, epochs[mid]))
            if not member.draining:
                result.effects.append(SetTimer(DrainTimer(mid), now + drain_timeout))
    if not free:
        return result
    # (Decided before looking up the owners of every free slot: while a hold lasts, each
    # event of a storm reconciles, and with all slots free that lookup is O(members).)
    if hold_s > 0 and target_version < state.joined_version and state.has_target_owner(free):
        since = state.grants_held_since
        if since is None:
            since = now
            result.records.append(GrantsHeld(now))
        if now < since + hold_s:
            result.effects.append(SetTimer(HoldTimer(), since + hold_s))
            return result
    if target is state.target:
        owners = state.target_owners(free)
    else:
        owners = {mid: t & free for mid, t in target.items() if mid in state.members}
    for mid in sorted(owners):
        grant = owners[mid] & free
        if grant:
            epochs[mid] = epochs.get(mid, state.members[mid].epoch) + 1
            positions = {tp: state.position_map(tp).segments(grant) for tp in state.partitions}
            result.records.append(RangesGranted(mid, grant, epochs[mid], now))
            result.effects.append(SendStart(mid, grant, epochs[mid], positions))
            free = free - grant
    return result
