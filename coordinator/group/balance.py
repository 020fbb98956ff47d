"""The periodic load check: when the measured demand says the group should be
rebalanced, with hysteresis against rate noise and a short hold for a real backlog."""

from __future__ import annotations

from keyshard.coordinator.group.demand import backlog_excess
from keyshard.coordinator.group.effects import BalanceTimer, Result, SetTimer
from keyshard.coordinator.group.records import ImbalanceObserved, RebalanceRequested
from keyshard.coordinator.group.state import GroupState, MemberPhase
from keyshard.coordinator.group.targets import assignment_spec, backlog_now
from keyshard.coordinator.strategies._common import weight
from keyshard.coordinator.strategies.base import AssignmentSpec, ImbalanceMeter

_RENEWED_BY = 1.05
_IN_FLIGHT = (MemberPhase.DRAINING, MemberPhase.STARTING)


def balance_check(
    state: GroupState,
    *,
    now: float,
    imbalance: ImbalanceMeter | None,
) -> Result:
    """Periodic load check with hysteresis, for strategies that read load.

    1. Re-arm the check.
    2. Skip while a handoff is in flight or nothing was measured: moving boundaries on top
       of moving boundaries is how thrashing starts.
    3. Imbalance (busiest member's demand share / capacity share) above the threshold
       starts a clock; below it stops the clock; above it for `rebalance_hold_ms` requests
       a rebalance, which recomputes the target with the measured demand. When the
       imbalance is a backlog (the busiest member has `backlog_records` waiting beyond its
       share of the group's backlog) it only has to hold `backlog_hold_ms`: records
       already waiting are not rate noise, and every second spent deciding is a second
       the others idle at the end.
    4. Until the group is back under the threshold, only an imbalance worse (by
       `_RENEWED_BY`) than the one that set off the last load rebalance starts the clock:
       when the strategy cannot pack the load any better (a few heavy keys over many
       members), the same request every hold period would recompute the same target
       forever, and move boundaries with every drift of the load.
    """
    config = state.config
    result = Result(effects=[SetTimer(BalanceTimer(), now + config.balance_check_ms / 1000)])
    busy = any(m.phase in _IN_FLIGHT for m in state.members.values())
    if imbalance is None or not state.members or busy or state.quarantined:
        return result
    spec = assignment_spec(state, now)
    if spec.slot_load is None:
        return result
    measured = imbalance(spec, state.target)
    bar = config.rebalance_threshold
    if state.last_rebalance_imbalance is not None:
        bar = max(bar, state.last_rebalance_imbalance * _RENEWED_BY)
    if measured <= config.rebalance_threshold:
        if state.imbalanced_since is not None or state.last_rebalance_imbalance is not None:
            result.records.append(ImbalanceObserved(None))
    elif measured <= bar:
        pass  # no worse than what the last rebalance was asked to fix
    elif state.imbalanced_since is None:
        result.records.append(ImbalanceObserved(now))
    else:
        waiting = _waiting_beyond_share(state, spec, now)
        backlogged = waiting >= config.backlog_records
        hold_ms = config.backlog_hold_ms if backlogged else config.rebalance_hold_ms
        if now - state.imbalanced_since >= hold_ms / 1000:
            kind = f"backlog imbalance ({waiting:.0f} records waiting beyond a fair share)"
            reason = f"{kind if backlogged else 'load imbalance'} {measured:.2f} > {bar:.2f}"
            result.records.append(RebalanceRequested(reason, now, imbalance=measured))
    return result


def _waiting_beyond_share(state: GroupState, spec: AssignmentSpec, now: float) -> float:
    """Shares by the weights `spec` already carries (capacity at measured speed)."""
    backlog = backlog_now(state, now)
    if backlog is None:
        return 0.0
    weights = {m.member_id: weight(m) for m in spec.members}
    return backlog_excess(backlog, state.target, weights)
