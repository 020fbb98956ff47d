"""The small statistics of test reports and benchmark tables.

No samples has no median and no percentile: both answer NaN then, so a missing measure
can never pass for a measured 0 (it prints as `nan` in a table, and compares false).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """The median of `values`; NaN when there are none."""
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100), a value that occurred: honest for small
    samples; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) / 100)))
    return ordered[rank - 1]
