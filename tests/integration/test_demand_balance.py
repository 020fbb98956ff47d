"""Balance by demand on a live backlog: records arrive faster than one member can process
them and most of them belong to that member's ranges. The consumers' fetches see the
backlog's key distribution (every member reads every record of the partition), their
Ping replies report it, and the coordinator moves ranges after the short backlog hold,
long before the processed rate alone would (30 s), through the ordered handoff."""

from __future__ import annotations

import random
from typing import Any

import pytest

from harness import CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.core.model.hashing import slot_for_key
from keyshard.local.verify import Processed, check

pytestmark = pytest.mark.integration
NAMES = ("c0", "c1", "c2", "c3")
RECORDS = 3_000


def per_member(events: list[Processed]) -> dict[str, int]:
    """Records processed per worker, each record counted once (its last processing)."""
    last = {(e.partition, e.offset): e.worker for e in events}
    counts = dict.fromkeys(NAMES, 0)
    for worker in last.values():
        counts[worker] += 1
    return counts


def keys_owned_by(ranges: list[list[int]], owned: bool, count: int) -> list[str]:
    """`count` keys whose slots are (or are not) in `ranges`."""
    inside = [False] * 65536
    for start, end in ranges:
        inside[start : end + 1] = [True] * (end - start + 1)
    keys = (f"key-{i}" for i in range(10**6))
    return [k for k in keys if inside[slot_for_key(k.encode())] == owned][:count]


@pytest.mark.coordinator_args("--balance-check-ms", "250")
async def test_a_backlog_behind_one_member_is_spread_over_the_group(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap, partitions=1)
    for name in NAMES:  # one record at a time, 5 ms each: 200 records/s per member
        workers.spawn(name, "--max-concurrency", "1", "--handler-ms", "5")
    view: Any = await wait_for(lambda: coordinator.settled(len(NAMES)), 60, "4 settled members")
    busy = next(m for m in view["members"] if m["name"] == "c0")
    # 80 % of the records on c0's ranges: alone it would need ~12 s, the others ~1 s.
    hot = keys_owned_by(busy["ranges"], True, 150)
    cold = keys_owned_by(busy["ranges"], False, 450)
    rng = random.Random(7)
    key_of = {
        i: rng.choice(hot) if rng.random() < 0.8 else rng.choice(cold) for i in range(RECORDS)
    }
    handoffs_before = len(view["handoffs"])
    produced = await produce(coordinator.bootstrap, RECORDS, 0, key_of=key_of.__getitem__)
    await wait_for(lambda: workers.unique() >= RECORDS, 90, "every record processed")

    log = coordinator.read_log()
    assert "rebalancing: backlog imbalance" in log, log[-3000:]
    after: Any = await coordinator.group()
    assert len(after["handoffs"]) > handoffs_before
    processed = workers.processed()
    report = check(produced, processed)
    assert report.lost == [] and report.order_violations == [] and report.duplicates == 0
    counts = per_member(processed)
    mean = RECORDS / len(NAMES)
    print(f"records per member: {counts}, max/mean {max(counts.values()) / mean:.2f}")
    # Without demand balancing c0 processes 80 % (3.2x the mean) until the rate-based
    # rebalance, 30 s later; with it the others take over part of c0's backlog.
    assert counts["c0"] < 0.6 * RECORDS
