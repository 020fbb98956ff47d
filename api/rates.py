"""Processed-records rate per member, measured from the admin API's own polling.

Members report cumulative processed counts on every ping; a rate needs two samples in
time. Sampling when a view is built (the dashboard polls every second) costs nothing when
nobody looks, and keeps the coordinator's hot path untouched.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 10.0


class ProcessedRates:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: dict[tuple[str, str], deque[tuple[float, int]]] = {}

    def observe(self, group: str, member_id: str, processed: int, now: float) -> float | None:
        """Record a sample; return records/s over the window, None until two samples."""
        samples = self._samples.setdefault((group, member_id), deque())
        if not samples or samples[-1][0] < now:
            samples.append((now, processed))
        while len(samples) > 2 and samples[0][0] < now - self.window_s:
            samples.popleft()
        first_t, first_n = samples[0]
        if now - first_t <= 0:
            return None
        return max(0, processed - first_n) / (now - first_t)

    def forget_except(self, group: str, member_ids: set[str]) -> None:
        """Drop samples of members that left, so the table does not grow without bound."""
        for key in [k for k in self._samples if k[0] == group and k[1] not in member_ids]:
            del self._samples[key]
