"""What the coordinator spends its time on: counters, durations and event-loop lag.

An overloaded coordinator looks the same from outside whatever the cause (slow state
writes, recomputes, a backlog of unread replies); these numbers say which. One INFO line
per interval while anything happened, nothing while idle or only pinging, so a steady
group is quiet unless its loop lags.

The loop's lag is also kept over a window (`LoopLag`): a metric, and readiness, which
fails while the loop lagged more than `LAG_NOT_READY_S` lately, so that a Service sends
new connections to replicas that can serve them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
#: How long a lag counts for the metric and readiness.
LAG_WINDOW_S = 10.0
#: A loop late this much delays every ping by as much, so every member's lease: past it
#: the coordinator says it is not ready.
LAG_NOT_READY_S = 2.0
# Lags below this are the loop's ordinary jitter, not worth keeping.
LAG_NOTICED_S = 0.05


class LoopLag:
    """The longest event-loop lag within the last `window_s` seconds (times: the caller's
    monotonic clock)."""

    def __init__(self, window_s: float = LAG_WINDOW_S) -> None:
        self.window_s = window_s
        self._lags: deque[tuple[float, float]] = deque()  # (when measured, lag), in order

    def add(self, now: float, seconds: float) -> None:
        if seconds >= LAG_NOTICED_S:
            self._lags.append((now, seconds))
        self._forget(now)

    def longest(self, now: float) -> float:
        self._forget(now)
        return max((lag for _, lag in self._lags), default=0.0)

    def _forget(self, now: float) -> None:
        while self._lags and self._lags[0][0] < now - self.window_s:
            self._lags.popleft()


@dataclass(slots=True)
class Timing:
    count: int = 0
    total: float = 0.0
    longest: float = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.longest = max(self.longest, seconds)

    def __str__(self) -> str:
        return f"{self.count} ({self.total * 1000:.0f} ms, longest {self.longest * 1000:.0f} ms)"


@dataclass
class Activity:
    """Counters since the last report (`take`) and since start (`totals`)."""

    counts: Counter[str] = field(default_factory=Counter)
    timings: dict[str, Timing] = field(default_factory=dict)
    totals: Counter[str] = field(default_factory=Counter)
    lag_longest: float = 0.0
    loop_lag: LoopLag = field(default_factory=LoopLag)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n
        self.totals[name] += n

    def timed(self, name: str, seconds: float) -> None:
        self.timings.setdefault(name, Timing()).add(seconds)
        self.totals[name] += 1

    def lag(self, seconds: float) -> None:
        self.lag_longest = max(self.lag_longest, seconds)
        self.loop_lag.add(time.monotonic(), seconds)

    def recent_lag(self) -> float:
        """The longest loop lag within the last `LAG_WINDOW_S` (the metric, readiness)."""
        return self.loop_lag.longest(time.monotonic())

    def take(self, gauges: dict[str, int] | None = None) -> str | None:
        """The report since the last call, or None when nothing worth saying happened."""
        # Pings alone are a healthy group's heartbeat, not news.
        routine = {"ping round trip"}
        busy = bool(self.counts or set(self.timings) - routine) or self.lag_longest >= 0.1
        parts = [f"loop lag {self.lag_longest * 1000:.0f} ms"]
        parts += [f"{name} {timing}" for name, timing in sorted(self.timings.items())]
        parts += [f"{name} {n}" for name, n in sorted(self.counts.items())]
        parts += [f"{name} {n}" for name, n in sorted((gauges or {}).items()) if n]
        self.counts.clear()
        self.timings.clear()
        self.lag_longest = 0.0
        return "; ".join(parts) if busy else None


async def watch_loop(activity: Activity, tick: float = 0.05) -> None:
    """Record how late the loop runs a callback due every `tick`: the delay every reply,
    timer and request is seeing on top of its own work."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(tick)
        activity.lag(max(0.0, time.perf_counter() - began - tick))


async def report_loop(
    activity: Activity, gauges: Callable[[], dict[str, int]], interval: float = 1.0
) -> None:
    """One line a second while anything happens: what an overloaded coordinator is busy
    with."""
    while True:
        await asyncio.sleep(interval)
        report = activity.take(gauges())
        if report is not None:
            log.info("activity: %s", report)
