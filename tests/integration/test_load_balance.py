"""Load-aware balancing on live skewed traffic: the coordinator measures per-slot load from
the consumers' Ping reports, notices one member carrying most of it for longer than the
hold time, and moves boundaries through the ordered handoff."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from harness import CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.core.model.hashing import slot_for_key
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.verify import Processed, check

pytestmark = pytest.mark.integration
SECOND = 1_000_000_000


def spread(events: list[Processed], workers: list[str]) -> float:
    """max/mean of records processed per worker: 1.0 is perfectly even."""
    counts = [sum(1 for e in events if e.worker == w) for w in workers]
    mean = sum(counts) / len(counts)
    return max(counts) / mean if mean else float("inf")


async def test_load_aware_rebalances_skewed_traffic(broker: EmbeddedBroker, tmp_path: Path) -> None:
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers,
        tmp_path,
        extra=[
            "--assignor", "load-aware", "--rebalance-threshold", "1.3",
            "--rebalance-hold-ms", "2000", "--balance-check-ms", "500",
            "--load-half-life-ms", "2000",
        ],
    )  # fmt: skip
    workers = Workers(coordinator, tmp_path)
    names = ["c0", "c1", "c2"]
    try:
        await create_topic(broker.bootstrap_servers)
        await coordinator.start()
        for name in names:
            workers.spawn(name)
        initial = await wait_for(lambda: coordinator.settled(3), 30, "3 settled members")
        # 90 % of traffic on keys in the lowest third of the slot space: one member's share
        # of an even split by slot count.
        hot = [k for k in (f"key-{i}" for i in range(5000)) if slot_for_key(k.encode()) < 21845]
        producing = asyncio.ensure_future(
            produce(broker.bootstrap_servers, 14_000, 0, rate=1000, key_of=_skewed(hot, 300))
        )
        view = await wait_for(
            _rebalanced(coordinator, len(initial["handoffs"])), 30, "a load-driven rebalance"
        )
        settled = await wait_for(lambda: coordinator.settled(3), 30, "the handoff to finish")
        assert not producing.done(), "the rebalance must happen under load"
        produced = await producing
        await wait_for(lambda: workers.unique() >= len(produced), 60, "every record processed")

        processed = workers.processed()
        report = check(produced, processed)
        assert report.lost == [] and report.order_violations == [] and report.duplicates == 0
        moved_at = max(h["resumed_at"] for h in settled["handoffs"] if h["resumed_at"]) * SECOND
        start = min(e.t0 for e in processed)
        before = [e for e in processed if e.t0 < start + 2 * SECOND]
        after = [e for e in processed if e.t0 > moved_at + SECOND]
        spread_before, spread_after = spread(before, names), spread(after, names)
        print(
            f"processed-per-consumer max/mean: {spread_before:.2f} before, "
            f"{spread_after:.2f} after the rebalance ({view['notes']})"
        )
        assert spread_before > 2.0, "the traffic must start skewed"
        assert spread_after < 1.3
        # A backlog when the hot member falls behind (records waiting: the short hold),
        # else the measured rate (the long hold).
        assert re.search(r"rebalancing: (backlog|load) imbalance", coordinator.read_log())
    finally:
        workers.stop_all()
        coordinator.stop()


def _skewed(hot: list[str], cold_keys: int):  # type: ignore[no-untyped-def]
    def key_of(i: int) -> str:
        return hot[i % len(hot)] if i % 10 else f"cold-{i % cold_keys}"

    return key_of


def _rebalanced(coordinator: CoordinatorProcess, handoffs_before: int):  # type: ignore[no-untyped-def]
    async def probe() -> dict | None:  # type: ignore[type-arg]
        view = await coordinator.group()
        return view if view is not None and len(view["handoffs"]) > handoffs_before else None

    return probe
