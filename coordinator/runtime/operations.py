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
from dataclasses import dataclass
from typing import Any

from keyshard.coordinator.group.records import GroupConfigChanged, RebalanceRequested
from keyshard.coordinator.group.state import GroupConfig, GroupState
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.strategies.registry import known_assignors
from keyshard.core.model.hashing import slot_for_key
from keyshard.core.model.ranges import EMPTY, RangeSet

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


def fence(runtime: CoordinatorRuntime, group: str, member_id: str) -> None:
    """Operator fence: the member is closed and its ranges move once it must have stopped."""
    state = group_state(runtime, group)
    if member_id not in state.members:
        raise UnknownMemberError(f"group {group!r} has no member {member_id!r}")
    runtime.fence(group, member_id, "fenced by an operator through the admin API")


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
    process is alive.
    """
    if not runtime.ready:
        return "state not loaded: the coordinator is starting or stopping"
    reason = runtime.not_ready()
    if reason is not None:
        return reason
    try:
        await asyncio.wait_for(runtime.metadata.probe(), BROKER_PROBE_TIMEOUT_S)
    except Exception as err:
        detail = str(err) or type(err).__name__
        return f"broker unreachable at {runtime.config.bootstrap_servers}: {detail}"
    return None
