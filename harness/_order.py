"""Per-key order, judged from the handler's own log.

Each worker logs every handler call as (partition, offset, key number, start, end), the
times from the system-wide monotonic clock, so logs of different processes line up. For
each key, its records are taken in offset order; a record is a **violation** when it
started before some earlier record of its key had finished: it overlapped an earlier one,
or ran entirely before it (then the earlier record, which started after a later one, is
out of order too, and the later one is the one counted). The violations split in two:
an **inversion** started before an earlier record of its key had even started (handled
out of order); an **overlap** started while an earlier record of its key was running
(same key, at the same time). Records handled more than once
(a share group redelivers what a consumer held when it left, or let time out) count as
**redelivered**, and only their first handling enters the order check.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass
class OrderStats:
    handled: int  # handler calls logged
    violations: int  # records started before an earlier record of their key had finished
    keys_violated: int  # keys with at least one violation
    redelivered: int  # handler calls for an offset already handled
    inversions: int = 0  # violations that started before an earlier record had started
    overlaps: int = 0  # violations that started while an earlier record was running

    def share(self) -> float:
        first = self.handled - self.redelivered
        return self.violations / first if first else 0.0


def order_stats(logs: Iterable[Sequence[Sequence[float]]]) -> OrderStats:
    """`logs`: one list per worker of [partition, offset, key, start, end] rows."""
    by_key: dict[int, dict[tuple[int, int], tuple[float, float]]] = defaultdict(dict)
    handled = redelivered = 0
    for log in logs:
        for partition, offset, key, start, end in log:
            handled += 1
            seen = by_key[int(key)]
            where = (int(partition), int(offset))
            if where in seen:
                redelivered += 1
                seen[where] = min(seen[where], (start, end))
            else:
                seen[where] = (start, end)
    violations = keys_violated = inversions = 0
    for records in by_key.values():
        latest_start = latest_end = float("-inf")
        bad = 0
        for _, (start, end) in sorted(records.items()):
            if start < latest_end:
                bad += 1
                inversions += start < latest_start
            latest_start = max(latest_start, start)
            latest_end = max(latest_end, end)
        violations += bad
        keys_violated += bad > 0
    overlaps = violations - inversions
    return OrderStats(handled, violations, keys_violated, redelivered, inversions, overlaps)
