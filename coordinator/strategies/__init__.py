"""Built-in assignment strategies, registered with `coordinator.assignor` on import.

The strategies import `coordinator.assignor` (for the spec types), so `assignor.py`
cannot import them at module level; it imports this package lazily instead, and
importing it registers everything below.

- `load-aware` (the default): a few ranges per member whose measured load matches its
  capacity share, moving close to the minimum on a join or leave; stable under small
  load drift.
- `balanced`: capacity-weighted slot counts, fewest slots moved, ranges may fragment.
- `consistent-hash`: Pulsar's ring; a pure function of the member set.
- `auto-split`: PIP-34; a joiner halves the busiest range, a leaver's range goes to its
  quieter neighbour.
- `sticky`: every member consumes exactly the ranges it declared.
"""

from __future__ import annotations

from coordinator.assignor import BalancedAssignor, register_assignor
from coordinator.strategies.auto_split import AutoSplitAssignor
from coordinator.strategies.consistent_hash import ConsistentHashAssignor
from coordinator.strategies.load_aware import LoadAwareAssignor
from coordinator.strategies.measures import achievable_imbalance, balancing_imbalance, imbalance
from coordinator.strategies.sticky import StickyAssignor, validate_fixed_ranges

DEFAULT_STRATEGY = LoadAwareAssignor.name
# Every built-in name, the default first; "balanced" lives in coordinator.assignor itself.
STRATEGY_NAMES: tuple[str, ...] = (
    LoadAwareAssignor.name,
    BalancedAssignor.name,
    ConsistentHashAssignor.name,
    AutoSplitAssignor.name,
    StickyAssignor.name,
)


def _register_builtin() -> None:
    register_assignor(LoadAwareAssignor())
    register_assignor(ConsistentHashAssignor())
    register_assignor(AutoSplitAssignor())
    register_assignor(StickyAssignor())


_register_builtin()

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGY_NAMES",
    "AutoSplitAssignor",
    "ConsistentHashAssignor",
    "LoadAwareAssignor",
    "StickyAssignor",
    "achievable_imbalance",
    "balancing_imbalance",
    "imbalance",
    "validate_fixed_ranges",
]
