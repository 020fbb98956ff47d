"""What the group state machine needs from a strategy beyond `assign`.

Most strategies are only an assignor. Two also shape the protocol around it: `sticky`
checks the ranges a member declares at Register, and `load-aware` measures imbalance for
the periodic, hysteresis-guarded rebalance. Keeping that mapping here keeps handlers free
of strategy names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from coordinator.assignor import Assignment, AssignmentSpec
from coordinator.ranges import RangeSet

RangeValidator = Callable[[Mapping[str, RangeSet], str, RangeSet | None], str | None]
ImbalanceMeter = Callable[[AssignmentSpec, Mapping[str, RangeSet]], float]


@dataclass(frozen=True, slots=True)
class StrategyTraits:
    validate_ranges: RangeValidator | None = None
    imbalance: ImbalanceMeter | None = None


def strategy_traits(name: str) -> StrategyTraits:
    if name == "sticky":
        from coordinator.strategies.sticky import validate_fixed_ranges

        return StrategyTraits(validate_ranges=validate_fixed_ranges)
    if name == "load-aware":
        from coordinator.strategies.measures import balancing_imbalance

        def measure(spec: AssignmentSpec, target: Mapping[str, RangeSet]) -> float:
            if spec.slot_load is None:
                return 1.0
            return balancing_imbalance(Assignment(dict(target)), spec.slot_load, spec.members)

        return StrategyTraits(imbalance=measure)
    return StrategyTraits()
