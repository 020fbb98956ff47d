"""Prometheus metrics, read from the live group state at scrape time.

A custom collector on a registry owned by the app (not prometheus-client's global one):
nothing is updated on the coordinator's hot path, two apps in one process (tests) do not
collide, and a scrape always shows the state as it is, not as it was last pushed.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from keyshard.coordinator.runtime.activity import LAG_WINDOW_S
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime


class RuntimeCollector(Collector):
    def __init__(self, runtime: CoordinatorRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        members = GaugeMetricFamily(
            "keyshard_group_members", "Members of the group.", labels=["group"]
        )
        owned = GaugeMetricFamily(
            "keyshard_member_owned_slots",
            "Slots a member owns (granted, including draining).",
            labels=["group", "member"],
        )
        processed = CounterMetricFamily(
            "keyshard_member_processed",
            "Records a member reported processed since it joined.",
            labels=["group", "member"],
        )
        handoffs = CounterMetricFamily(
            "keyshard_handoffs", "Handoffs started in the group.", labels=["group"]
        )
        last_pause = GaugeMetricFamily(
            "keyshard_handoff_last_pause_seconds",
            "Pause of the most recently completed handoff (StopFetcher sent -> running again).",
            labels=["group"],
        )
        draining = GaugeMetricFamily(
            "keyshard_draining_ranges",
            "Ranges a member was asked to stop and has not yet released.",
            labels=["group", "member"],
        )
        low_watermark = GaugeMetricFamily(
            "keyshard_position_low_watermark",
            "Lowest next offset over all slots of a partition (what is committed to Kafka).",
            labels=["group", "topic", "partition"],
        )
        partition_lag = GaugeMetricFamily(
            "keyshard_partition_lag",
            "Records of a partition past its low watermark: its end (as last seen) minus the "
            "low watermark. A partition nobody has read yet counts from its first offset.",
            labels=["group", "topic", "partition"],
        )
        unowned = GaugeMetricFamily(
            "keyshard_unowned_slots",
            "Slots nobody owns, drains or quarantines (records for them wait).",
            labels=["group"],
        )
        for name, state in sorted(self.runtime.group_states().items()):
            members.add_metric([name], len(state.members))
            unowned.add_metric([name], state.busy().complement().size)
            for member_id, member in sorted(state.members.items()):
                owned.add_metric([name, member_id], member.owned.size)
                processed.add_metric([name, member_id], member.processed)
                draining.add_metric([name, member_id], len(member.draining))
            handoffs.add_metric([name], state.next_handoff_id - 1)
            done = [h for h in state.handoffs if h.pause_s is not None]
            if done:
                latest = max(done, key=lambda h: h.resumed_at or 0.0)
                last_pause.add_metric([name], latest.pause_s or 0.0)
            for tp in sorted(set(state.partitions) | set(state.positions)):
                labels = [name, tp[0], str(tp[1])]
                low = state.position_map(tp).minimum_offset()
                low_watermark.add_metric(labels, low)
                end = state.high_watermarks.get(tp)
                if end is not None:
                    partition_lag.add_metric(labels, max(0, end - low))
        loop_lag = GaugeMetricFamily(
            "keyshard_coordinator_loop_lag_seconds",
            f"Longest lag of the coordinator's event loop within the last {LAG_WINDOW_S:g} s "
            "(every reply, ping and timer is that much late).",
        )
        loop_lag.add_metric([], self.runtime.activity.recent_lag())
        yield from (members, owned, processed, handoffs, last_pause, draining, low_watermark)
        yield from (partition_lag, unowned, loop_lag, self.durations())

    def durations(self) -> Metric:
        """How long the coordinator's own work took, by kind, since start: `flush` is a
        group's state write as a grant waits for it (queued behind the transaction in
        flight, then written with the others waiting: group commit)."""
        family = HistogramMetricFamily(
            "keyshard_coordinator_duration_seconds",
            "Durations of the coordinator's work by kind (flush: a group's state write).",
            labels=["kind"],
        )
        for kind, histogram in sorted(self.runtime.activity.histograms.items()):
            family.add_metric([kind], histogram.cumulative(), histogram.total)
        return family


def metrics_registry(runtime: CoordinatorRuntime) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RuntimeCollector(runtime))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
