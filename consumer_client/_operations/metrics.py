"""A consumer's own Prometheus metrics: what its handler did, and what it holds now.

The coordinator sees members from outside (ranges, processed counts, handoffs); what only
the process knows — failures and retries per topic, how long the handler takes, how many
records are in flight, how far behind each partition's fetch is, how long ago a
coordinator last spoke — is here. Each consumer has its own registry, so two consumers in
one process do not collide, and nothing is registered in prometheus-client's global one.

Counters are counted by wrapping the handler (and the dead-letter sender), which only
happens when metrics are asked for (`CoordinatedConsumer(metrics_listen=...)` or
`ConsumerEndpoints`): the hot path of a consumer without them is unchanged. The gauges are
read from a `ConsumerSnapshot` the event loop takes once a second (`endpoints`), never
from the consumer's live structures from the HTTP thread.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

Handler = Callable[[Any], Awaitable[None]]
DeadLetter = Callable[[Any, BaseException], Awaitable[None]]

#: Handler latency buckets, seconds: from an inline no-op to a slow external call.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                   5, 10, 30)  # fmt: skip
#: Records that failed and may be retried, remembered to count their retries; a bound
#: for handlers that fail everything (their records are retried, not forgotten).
MAX_FAILING = 100_000


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """What the consumer holds, as the event loop saw it at `taken` (monotonic)."""

    taken: float
    registered: bool
    closing: bool
    heard_ago: float | None  # seconds since a coordinator spoke; None: never
    in_flight: int
    busy_lanes: int
    owned_slots: int
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    # Seconds this member has not been able to read Kafka, past its fetch failure
    # timeout (None: it reads).
    unreadable_for: float | None = None
    reads: dict[str, int] = field(default_factory=dict)  # ConsumerStats.as_dict()
    # The memory budget: record bytes held by kind (BUFFER_KINDS), the budget, and how
    # often fetching paused because it was used up.
    buffered: dict[str, int] = field(default_factory=dict)
    max_buffer_bytes: int = 0
    budget_pauses: int = 0


class ConsumerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.processed = Counter(
            "keyshard_consumer_records_processed", "Records the handler completed", ["topic"],
            registry=r,
        )  # fmt: skip
        self.failed = Counter(
            "keyshard_consumer_records_failed", "Handler attempts that raised", ["topic"],
            registry=r,
        )  # fmt: skip
        self.retried = Counter(
            "keyshard_consumer_records_retried", "Handler attempts retrying a failed record",
            ["topic"], registry=r,
        )  # fmt: skip
        self.dead_lettered = Counter(
            "keyshard_consumer_records_dead_lettered", "Records sent to the dead-letter topic",
            ["topic"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "keyshard_consumer_handler_seconds", "Handler run time per attempt", ["topic"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.snapshot: ConsumerSnapshot | None = None
        r.register(_SnapshotCollector(self))
        self._failing: set[tuple[str, int, int]] = set()

    def prime(self, topics: list[str]) -> None:
        """Every per-topic series at zero from the start: a rate() over a counter that
        appears only with its first failure misses that failure, and a dashboard shows
        "no data" instead of 0."""
        for topic in topics:
            for family in (self.processed, self.failed, self.retried, self.dead_lettered):
                family.labels(topic)
            self.latency.labels(topic)

    def wrap(self, handler: Handler) -> Handler:
        """`handler`, counted and timed. A coroutine function itself, so a handler that
        completes without awaiting still completes inline (`KeyLanes.dispatch`)."""
        failing = self._failing

        async def counted(record: Any) -> None:
            topic = record.topic
            ident = (topic, record.partition, record.offset)
            if ident in failing:
                self.retried.labels(topic).inc()
            began = time.perf_counter()
            try:
                await handler(record)
            except BaseException:
                self.latency.labels(topic).observe(time.perf_counter() - began)
                self.failed.labels(topic).inc()
                if len(failing) >= MAX_FAILING:
                    failing.clear()
                failing.add(ident)
                raise
            self.latency.labels(topic).observe(time.perf_counter() - began)
            self.processed.labels(topic).inc()
            failing.discard(ident)

        return counted

    def wrap_dead_letter(self, send: DeadLetter) -> DeadLetter:
        async def counted(record: Any, error: BaseException) -> None:
            await send(record, error)
            self.dead_lettered.labels(record.topic).inc()
            self._failing.discard((record.topic, record.partition, record.offset))

        return counted


class _SnapshotCollector(Collector):
    """The gauges, from the last snapshot (scraped from the HTTP server's thread)."""

    def __init__(self, metrics: ConsumerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        snap = self._metrics.snapshot
        if snap is None:
            return
        yield _gauge("keyshard_consumer_registered",
                     "1 while a member of its group (riding through a failover too)",
                     int(snap.registered))  # fmt: skip
        yield _gauge("keyshard_consumer_in_flight", "Records whose handler is running",
                     snap.in_flight)  # fmt: skip
        yield _gauge("keyshard_consumer_busy_lanes",
                     "Keys with a record running, queued or backing off",
                     snap.busy_lanes)  # fmt: skip
        yield _gauge("keyshard_consumer_owned_slots", "Slots this consumer owns",
                     snap.owned_slots)  # fmt: skip
        contact = GaugeMetricFamily(
            "keyshard_consumer_coordinator_contact_age_seconds",
            "Seconds since a coordinator last spoke to this consumer (absent: never)",
        )
        if snap.heard_ago is not None:
            contact.add_metric([], snap.heard_ago + (time.monotonic() - snap.taken))
        yield contact
        lag = GaugeMetricFamily(
            "keyshard_consumer_fetch_lag",
            "Records between the fetch position and the partition's end",
            labels=["topic", "partition"],
        )
        for (topic, partition), behind in sorted(snap.lag.items()):
            lag.add_metric([topic, str(partition)], behind)
        yield lag
        buffered = GaugeMetricFamily(
            "keyshard_consumer_buffered_bytes",
            "Record bytes held, by kind: waiting (fetched, not dispatched), in_flight "
            "(in a lane), replay_window",
            labels=["kind"],
        )
        for kind in BUFFER_KINDS:
            buffered.add_metric([kind], snap.buffered.get(kind, 0))
        yield buffered
        yield _gauge("keyshard_consumer_max_buffer_bytes",
                     "The memory budget: record bytes held at most (max_buffer_bytes)",
                     snap.max_buffer_bytes)  # fmt: skip
        pauses = CounterMetricFamily(
            "keyshard_consumer_budget_pauses",
            "Times fetching paused because the memory budget was used up",
        )
        pauses.add_metric([], snap.budget_pauses)
        yield pauses
        for field_name, (name, help_text) in READ_COUNTERS.items():
            family = CounterMetricFamily(f"keyshard_consumer_{name}", help_text)
            family.add_metric([], snap.reads.get(field_name, 0))
            yield family


#: The kinds of `keyshard_consumer_buffered_bytes`.
BUFFER_KINDS = ("waiting", "in_flight", "replay_window")

#: ConsumerStats fields as counters: fetched / admitted is the read amplification.
READ_COUNTERS = {
    "fetched": ("records_fetched",
                "Records fetched from Kafka, owned here or not (read amplification)"),
    "admitted": ("records_admitted", "Fetched records owned here and handed to a lane"),
    "replayed": ("records_replayed", "Records replayed from the replay window for a grant"),
    "rewinds": ("partition_rewinds", "Partitions sought back for a grant"),
}  # fmt: skip


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)
