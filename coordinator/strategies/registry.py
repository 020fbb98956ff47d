"""Every strategy by name: what `--assignor`, `--group-assignor` and the admin API accept.

Built from explicit imports of each strategy module, so importing the registry is all it
takes to know every name (no registration by side effect, no import inside a function).
"""

from __future__ import annotations

from collections.abc import Mapping

from keyshard.coordinator.strategies.auto_split import AutoSplitAssignor
from keyshard.coordinator.strategies.balanced import BalancedAssignor
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec, Strategy
from keyshard.coordinator.strategies.consistent_hash import ConsistentHashAssignor
from keyshard.coordinator.strategies.load_aware import LoadAwareAssignor
from keyshard.coordinator.strategies.measures import balancing_imbalance
from keyshard.coordinator.strategies.sticky import StickyAssignor, validate_fixed_ranges
from keyshard.core.model.ranges import RangeSet


def _load_aware_imbalance(spec: AssignmentSpec, target: Mapping[str, RangeSet]) -> float:
    """What the coordinator's hysteresis watches: the profile load-aware balances."""
    if spec.slot_load is None:
        return 1.0
    return balancing_imbalance(Assignment(dict(target)), spec.slot_load, spec.members)


BUILT_IN: tuple[Strategy, ...] = (
    Strategy(LoadAwareAssignor(), imbalance=_load_aware_imbalance),
    Strategy(BalancedAssignor()),
    Strategy(ConsistentHashAssignor()),
    Strategy(AutoSplitAssignor()),
    Strategy(StickyAssignor(), validate_ranges=validate_fixed_ranges),
)
DEFAULT_STRATEGY = LoadAwareAssignor.name
STRATEGIES: dict[str, Strategy] = {s.name: s for s in BUILT_IN}


def register(strategy: Strategy) -> None:
    """Add a strategy (tests add slow or failing ones); a name already taken is replaced."""
    STRATEGIES[strategy.name] = strategy


def known_assignors() -> list[str]:
    """Every registered strategy name."""
    return sorted(STRATEGIES)


def strategy_named(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown assignor {name!r}; known: {', '.join(known_assignors())}"
        ) from None
