"""Operator actions on a running coordinator and the reads they need: the admin API's
one way into the runtime.

Each action is a list of records fed through the runtime's one apply path
(`CoordinatorRuntime.apply_records`), so an operator change goes through the same
replay -> reconcile -> effects sequence as a consumer's request and can never bypass
the handoff rules. Reads (where a key lives, readiness) are pure functions of the
runtime's state (`CoordinatorRuntime.group_states`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keyshard.coordinator.group import resets
from keyshard.coordinator.group.records import AdminActed, GroupConfigChanged, RebalanceRequested
from keyshard.coordinator.group.resets import Move, ResetTarget, ResetTargetMissing, ResetTo
from keyshard.coordinator.group.state import AuditEntry, GroupConfig, GroupState
from keyshard.coordinator.runtime.activity import LAG_NOT_READY_S, LAG_WINDOW_S
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.storage.base import ClusterMetadata
from keyshard.coordinator.strategies.registry import known_assignors
from keyshard.core.model.hashing import slot_for_key
from keyshard.core.model.positions import TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet

log = logging.getLogger(__name__)
BROKER_PROBE_TIMEOUT_S = 1.0


class UnknownGroupError(LookupError):
    pass


class UnknownMemberError(LookupError):
    pass


class InvalidConfigError(ValueError):
    pass


def group_state(runtime: CoordinatorRuntime, group: str) -> GroupState:
    state = runtime.group_states().get(group)
    if state is None:
        raise UnknownGroupError(f"unknown group {group!r}")
    return state


@dataclass(frozen=True, slots=True)
class RebalanceOutcome:
    target_before: dict[str, RangeSet]
    target_after: dict[str, RangeSet]

    def moved_slots(self) -> int:
        """Slots whose target owner changed; 0 means the current assignment was already
        the balanced one (the assignor is sticky)."""
        moved = 0
        for member, after in self.target_after.items():
            moved += (after - self.target_before.get(member, EMPTY)).size
        return moved


def rebalance(runtime: CoordinatorRuntime, group: str) -> RebalanceOutcome:
    """Recompute the group's target now and start whatever handoffs it implies."""
    state = group_state(runtime, group)
    before = dict(state.target)
    runtime.apply_records(group, [RebalanceRequested("operator request", runtime.clock())])
    return RebalanceOutcome(before, dict(state.target))


def update_config(runtime: CoordinatorRuntime, group: str, **knobs: Any) -> GroupConfig:
    """Change a group's knobs (GroupConfig field names); None leaves a knob as it is.

    Session timeouts are not here: each member chooses its own at Register. A changed
    assignor is followed by a rebalance so it takes effect now, not at the next join.
    """
    state = group_state(runtime, group)
    changes = {name: value for name, value in knobs.items() if value is not None}
    unknown = set(changes) - {f.name for f in dataclasses.fields(GroupConfig)}
    if unknown:
        raise InvalidConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    assignor = changes.get("assignor")
    if assignor is not None and assignor not in known_assignors():
        raise InvalidConfigError(
            f"unknown assignor {assignor!r}; known: {', '.join(known_assignors())}"
        )
    config = dataclasses.replace(state.config, **changes)
    if config == state.config:
        return config
    now = runtime.clock()
    records: list[GroupConfigChanged | RebalanceRequested] = [GroupConfigChanged(config, now)]
    if config.assignor != state.config.assignor:
        records.append(RebalanceRequested(f"assignor changed to {config.assignor}", now))
    # Config alone moves nothing, so apply without a reconcile unless asked to rebalance.
    runtime.apply_records(group, records, reconcile=len(records) > 1)
    return state.config


def audit(
    runtime: CoordinatorRuntime, group: str, principal: str, action: str, detail: str
) -> None:
    """Record a state-changing admin call in the group's audit trail (stored with its
    state, coordinator.runtime.durability) and in a log line."""
    at_ms = int(runtime.wall_clock() * 1000)
    seq = group_state(runtime, group).next_audit_seq
    entry = AuditEntry(at_ms, principal, action, detail, seq)
    runtime.apply_records(group, [AdminActed(entry)], reconcile=False)
    log.info("admin: %s %s group %s: %s", principal, action, group, detail)


def fence(runtime: CoordinatorRuntime, group: str, member_id: str) -> None:
    """Operator fence: the member is closed and its ranges move once it must have stopped."""
    state = group_state(runtime, group)
    if member_id not in state.members:
        raise UnknownMemberError(f"group {group!r} has no member {member_id!r}")
    runtime.fence(group, member_id, "fenced by an operator through the admin API")


class ResetRefusedError(Exception):
    """Members own slots of a reset, or may come back for them (coordinator.group.resets)."""

    def __init__(self, owners: dict[str, RangeSet], message: str) -> None:
        super().__init__(message)
        self.owners = owners


async def reset_positions(
    runtime: CoordinatorRuntime,
    group: str,
    target: ResetTarget,
    *,
    topic: str | None = None,
    partition: int | None = None,
    slots: RangeSet | None = None,
    execute: bool = False,
) -> list[Move]:
    """Where the scope's slot ranges resume now and after a reset to `target`, and with
    `execute` the reset itself, stored before this returns. Refused (ResetRefusedError)
    while members own the slots, a dry run too, as kafka-consumer-groups refuses any
    reset of an active group; ResetTargetMissing for what the group does not read."""
    scope = resets.scope_of(group_state(runtime, group), topic, partition, slots)
    _refuse_if_owned(group_state(runtime, group), scope.slots)
    offsets = await _target_offsets(runtime.metadata, group, scope.partitions, target)
    state = group_state(runtime, group)  # Kafka was asked meanwhile: look again
    _refuse_if_owned(state, scope.slots)
    moves = resets.planned(state, scope, offsets)
    if not execute:
        return moves
    result = resets.reset_positions(state, scope, offsets, runtime.clock())
    runtime.apply_records(group, result.records, reconcile=False)
    await runtime.writer.flush(group)
    where = _slots_named(scope.slots)
    log.info(
        "group %s: positions reset to %s by an operator: %s", group, target,
        ", ".join(f"{t}:{p} slots {where} at {o}" for (t, p), o in offsets.items()),
    )  # fmt: skip
    return moves


def _refuse_if_owned(state: GroupState, slots: RangeSet) -> None:
    owners = resets.blockers(state, slots)
    if owners:
        raise ResetRefusedError(owners, resets.owned_message(state.group, owners))


def _slots_named(slots: RangeSet) -> str:
    return "all" if slots == RangeSet.full() else ",".join(f"{r.start}-{r.end}" for r in slots)


async def _target_offsets(
    metadata: ClusterMetadata, group: str, partitions: Sequence[TopicPartition], target: ResetTarget
) -> dict[TopicPartition, int]:
    """One offset per partition for `target`, within the partition's log."""
    earliest = await metadata.earliest_offsets(partitions)
    latest = await metadata.partition_ends(partitions)
    match target.to:
        case ResetTo.EARLIEST:
            wanted = dict(earliest)
        case ResetTo.LATEST:
            wanted = dict(latest)
        case ResetTo.OFFSET:
            wanted = dict.fromkeys(partitions, _or(target.offset, 0))
        case ResetTo.DATETIME:
            found = await metadata.offsets_for_times(partitions, _or(target.timestamp_ms, 0))
            wanted = {tp: _or(found[tp], latest[tp]) for tp in partitions}
        case ResetTo.COMMITTED:
            committed = await metadata.committed_offsets(group, partitions)
            missing = [f"{t}:{p}" for (t, p), offset in committed.items() if offset is None]
            if missing:
                raise ResetTargetMissing(
                    f"no Kafka offset committed under {group!r} for {', '.join(missing)}"
                )
            wanted = {tp: _or(offset, 0) for tp, offset in committed.items()}
    return resets.within_log(wanted, earliest, latest)


def _or(offset: int | None, otherwise: int) -> int:
    return otherwise if offset is None else offset


@dataclass(frozen=True, slots=True)
class KeyLocation:
    slot: int
    owner: str | None
    draining: bool
    starting: bool
    quarantined: bool
    # (topic, partition) -> next offset to process for this slot
    positions: dict[tuple[str, int], int]

    @property
    def blocked(self) -> bool:
        """Records of this key wait: nobody runs the slot, or it is between two owners."""
        return self.owner is None or self.draining or self.quarantined


def locate_key(state: GroupState, key: bytes, topic: str | None = None) -> KeyLocation:
    """Where a key's records go right now, and from which offset they resume."""
    slot = slot_for_key(key)
    owner = next((m for m in state.members.values() if slot in m.owned), None)
    quarantined = any(slot in q.ranges for q in state.quarantined)
    positions = {
        tp: state.positions[tp].get(slot).next_offset
        for tp in sorted(state.positions)
        if topic is None or tp[0] == topic
    }
    return KeyLocation(
        slot=slot,
        owner=None if owner is None else owner.member_id,
        draining=owner is not None and slot in owner.draining,
        starting=owner is not None and slot in owner.starting,
        quarantined=quarantined,
        positions=positions,
    )


async def not_ready_reason(runtime: CoordinatorRuntime) -> str | None:
    """Why this coordinator should not get traffic, or None when it should.

    The broker probe is a metadata request with a short timeout on the cluster client
    (`ClusterMetadata.probe`): if that cannot reach Kafka, positions cannot be made
    durable and no grant can leave, so the coordinator is useless even though its
    process is alive. An event loop that lagged past `LAG_NOT_READY_S` lately is
    overloaded: new connections are better sent to another replica.
    """
    if not runtime.ready:
        return "state not loaded: the coordinator is starting or stopping"
    reason = runtime.not_ready()
    if reason is not None:
        return reason
    lag = runtime.activity.recent_lag()
    if lag > LAG_NOT_READY_S:
        return (
            f"overloaded: the event loop lagged {lag:.1f} s within the last "
            f"{LAG_WINDOW_S:g} s (more than {LAG_NOT_READY_S:g} s delays every member's lease)"
        )
    try:
        await asyncio.wait_for(runtime.metadata.probe(), BROKER_PROBE_TIMEOUT_S)
    except Exception as err:
        detail = str(err) or type(err).__name__
        return f"broker unreachable at {runtime.config.bootstrap_servers}: {detail}"
    return None
