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
import bisect
import itertools
import logging
import math
import random
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


#: Durations kept per interval for the percentiles: beyond it, a uniform sample of them.
SAMPLES = 4096


@dataclass(slots=True)
class Timing:
    """Durations of one kind in an interval. The total says how much time went to them,
    the median and the 99th percentile what a typical and an unlucky caller waited (a
    state write: how long a grant waits to leave), the longest the worst."""

    count: int = 0
    total: float = 0.0
    longest: float = 0.0
    samples: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.longest = max(self.longest, seconds)
        if len(self.samples) < SAMPLES:
            self.samples.append(seconds)
        else:  # reservoir sampling: each of the `count` durations kept alike
            slot = random.randrange(self.count)
            if slot < SAMPLES:
                self.samples[slot] = seconds

    def percentile(self, fraction: float) -> float:
        """Nearest rank: the smallest kept duration with `fraction` of them at or below it."""
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)] if ordered else 0.0

    def __str__(self) -> str:
        ms = 1000
        return (
            f"{self.count} ({self.total * ms:.0f} ms, p50 {self.percentile(0.5) * ms:.0f} ms, "
            f"p99 {self.percentile(0.99) * ms:.0f} ms, longest {self.longest * ms:.0f} ms)"
        )


#: Upper bounds of the cumulative histograms' buckets, in seconds (Prometheus' defaults).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class Histogram:
    """Durations of one kind since start, for /metrics: a scrape sees every one, however
    seldom it comes."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))  # last: +Inf
    total: float = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, durations at or below it), as Prometheus exposes buckets."""
        bounds = [*(str(b) for b in BUCKETS), "+Inf"]
        return list(zip(bounds, itertools.accumulate(self.counts), strict=True))


@dataclass
class Activity:
    """Counters since the last report (`take`) and since start (`totals`)."""

    counts: Counter[str] = field(default_factory=Counter)
    timings: dict[str, Timing] = field(default_factory=dict)
    totals: Counter[str] = field(default_factory=Counter)
    histograms: dict[str, Histogram] = field(default_factory=dict)  # since start
    lag_longest: float = 0.0
    loop_lag: LoopLag = field(default_factory=LoopLag)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n
        self.totals[name] += n

    def timed(self, name: str, seconds: float) -> None:
        self.timings.setdefault(name, Timing()).add(seconds)
        self.histograms.setdefault(name, Histogram()).add(seconds)
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
