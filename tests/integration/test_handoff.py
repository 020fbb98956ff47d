"""The core contract on a real broker with real consumer processes: coverage, order,
ordered handoff on join and leave, and ranges not involved keep flowing."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import (
    CoordinatorProcess,
    Workers,
    create_topic,
    owned_ranges,
    produce,
    wait_for,
)
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.ranges import RangeSet
from keyshard.local.verify import check

pytestmark = pytest.mark.integration


async def test_three_consumers_share_one_partition_in_order(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """Every other record's handler finishes without awaiting: records of one key go
    through the inline path and through lane workers in turn, and must stay in order."""
    await create_topic(coordinator.bootstrap)
    for i in range(3):
        workers.spawn(f"c{i}", "--no-wait-every", "3")  # 500 keys: offsets of a key cycle mod 3
    view = await wait_for(lambda: coordinator.settled(3), 30, "3 members owning every slot")
    ranges = owned_ranges(view)
    union = RangeSet()
    for owned in ranges.values():
        assert not union.overlaps(owned), f"overlapping ownership: {ranges}"
        union = union | owned
    assert union.to_pairs() == [(0, MAX_SLOT)]

    produced = await produce(coordinator.bootstrap, 20_000, 500)
    await wait_for(lambda: workers.unique() >= 20_000, 90, "20,000 records processed")
    report = check(produced, workers.processed())
    assert report.lost == []
    assert report.order_violations == []
    assert report.duplicates == 0
    assert len(report.per_worker) == 3 and min(report.per_worker.values()) > 0


async def test_join_and_graceful_leave_mid_stream(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """A 4th consumer joins, then one leaves, while records flow: no duplicates, no order
    violation, and slots outside the moved ranges keep being processed during the drain."""
    await create_topic(coordinator.bootstrap)
    # Handlers (100 ms) outlast the gap between fetches, so each consumer always has work
    # in flight: a moved range has something to drain, an unmoved one something running.
    slow = ("--handler-ms", "100")
    for i in range(3):
        workers.spawn(f"c{i}", *slow)
    await wait_for(lambda: coordinator.settled(3), 30, "3 settled members")
    # Records flow at 600/s until the join and the leave below have settled (at most
    # 100 s: however long the machine's load makes them take).
    settled = asyncio.Event()
    producing = asyncio.ensure_future(
        produce(coordinator.bootstrap, 60_000, 300, rate=600, until=settled)
    )
    produced_until: list[int] = []  # CLOCK_MONOTONIC ns, like the handoffs and the events
    producing.add_done_callback(lambda _: produced_until.append(time.monotonic_ns()))
    await wait_for(lambda: workers.unique() > 300, 30, "traffic to flow")
    workers.spawn("c3", *slow)
    await wait_for(lambda: coordinator.settled(4), 30, "the 4th member to own its share")
    workers.stop("c0")  # SIGTERM: graceful close, drain, Leave with final positions
    await wait_for(lambda: coordinator.settled(3), 30, "3 members after the leave")
    assert not producing.done(), "the handoffs must happen under load"
    after_leave = workers.unique()
    await wait_for(lambda: workers.unique() > after_leave + 300, 30, "traffic after the leave")
    settled.set()
    produced = await producing
    await wait_for(lambda: workers.unique() >= len(produced), 90, "every record processed")

    processed = workers.processed()
    report = check(produced, processed)
    assert report.lost == []
    assert report.order_violations == []
    assert report.duplicates == 0, "a graceful handoff must not duplicate"
    assert report.per_worker.get("c3", 0) > 0

    view = await coordinator.group()
    assert view is not None
    # Handoffs entirely inside the traffic: a later one (a load rebalance after the last
    # record) has nothing in flight anywhere, which says nothing about unmoved ranges.
    under_load = [
        h for h in view["handoffs"]
        if h["kind"] in ("revoke", "leave") and h["resumed_at"]
        and h["started_at"] * 1e9 > min(e.t0 for e in processed)
        and h["resumed_at"] * 1e9 < produced_until[0]
    ]  # fmt: skip
    assert len(under_load) >= 2, "the join and the leave must have moved ranges under load"
    for h in under_load:
        moved = RangeSet.from_pairs(h["ranges"])
        start, end = h["started_at"] * 1e9, h["resumed_at"] * 1e9
        # Half a handler run (50 ms) either side: a pause of 20 ms can fall between two
        # records of the other slots on a busy machine; everything stopping cannot.
        lo, hi = start - 50e6, end + 50e6
        running = [e for e in processed if e.t0 <= hi and e.t1 >= lo and e.slot not in moved]
        print(
            f"handoff {h['handoff_id']} ({h['kind']}, {moved.size} slots): paused "
            f"{(end - start) / 1e6:.1f} ms from t={start / 1e9:.3f} s; records of other slots "
            f"being processed meanwhile: {len(running)}"
        )
        assert running, "ranges not involved in a handoff must keep flowing during it"
