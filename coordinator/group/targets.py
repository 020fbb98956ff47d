"""The assignor's side of a group: what it is asked (`assignment_spec`: members, their
measured speed, the demand per slot) and how its answer becomes a record
(`target_computed`). Pure, like the handlers; the runtime runs the assignor off the event
loop (`coordinator.runtime.recompute`) and `handlers.reconcile` inline."""

from __future__ import annotations

from keyshard.coordinator.group.demand import demand_profile, discounted
from keyshard.coordinator.group.records import TargetComputed
from keyshard.coordinator.group.speed import speed_factors
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec, MemberSpec


def assignment_spec(state: GroupState, now: float) -> AssignmentSpec:
    """The assignor's inputs: members, their previous targets (stickiness), and the demand
    per slot (records waiting plus the measured rate over the demand horizon)."""
    factors = speed_factors_of(state)
    return AssignmentSpec(
        members=tuple(
            MemberSpec(m.member_id, m.capacity, m.fixed_ranges, factors[m.member_id])
            for m in state.members.values()
        ),
        current={mid: state.target.get(mid, m.owned) for mid, m in state.members.items()},
        slot_load=demand_profile(
            state.load.rates(now), backlog_now(state, now), state.config.demand_horizon_ms / 1000
        ),
    )


def speed_factors_of(state: GroupState) -> dict[str, float]:
    """Each member's measured speed per unit of capacity against the group's median."""
    return speed_factors(
        {mid: (m.capacity, m.speed.speed) for mid, m in state.members.items()},
        state.bounds.max_speed_factor,
    )


def backlog_now(state: GroupState, now: float) -> list[float] | None:
    """Records waiting per load bucket as of `now`, None when nothing is.

    Fetched minus completed, as `state.demand` counts it, is stale for each owner by the
    age of its last Ping reply: it has gone on completing records since, at about its
    last measured rate. Uncorrected, whoever was pinged longest ago looks the most
    backlogged (at 600 records/s and 3 s between pings, by up to ~2,000 records that are
    long done), and the balance check would chase the ping phase.
    """
    backlog = state.demand.backlog(now)
    if backlog is None:
        return None
    owned = {mid: m.owned for mid, m in state.members.items() if m.owned}
    done = {mid: m.completed_since_ping(now) for mid, m in state.members.items()}
    return discounted(backlog, owned, done)


def target_computed(
    state: GroupState, assignment: Assignment, inputs_version: int
) -> TargetComputed:
    """The record adopting `assignment`, computed from the inputs as of `inputs_version`.

    The runtime computes off the event loop, so members may have left meanwhile: their
    share stays unassigned until the next recompute (which the newer inputs_version
    schedules). Members that joined meanwhile get nothing until then either.
    """
    target = {mid: r for mid, r in assignment.ranges.items() if mid in state.members}
    return TargetComputed(
        tuple(sorted(target.items())), inputs_version, assignment.unassigned, assignment.notes
    )
