"""A grant below the fetch position replays held records instead of seeking back.

Two in-process consumers share one partition; the slower one (`behind`) has a queue, so
when it leaves gracefully the positions of its slots lie below the other consumer's fetch
position. With a replay window the survivor dispatches those records from memory (no
seek); with the window off it rewinds the partition. Either way: every record exactly
once, each key in offset order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from harness import CoordinatorProcess, create_topic, produce, wait_for
from keyshard.consumer_client import CoordinatedConsumer

pytestmark = pytest.mark.integration

RECORDS = 3000
KEYS = 200


@pytest.mark.parametrize("window", [10_000, 0], ids=["replay", "rewind"])
async def test_a_leave_hands_the_queue_over_exactly(
    coordinator: CoordinatorProcess, window: int
) -> None:
    topic = f"replay-{uuid.uuid4().hex[:8]}"
    group = f"replay-group-{uuid.uuid4().hex[:6]}"
    await create_topic(coordinator.bootstrap, topic)
    starts: dict[str, list[tuple[float, int, bytes]]] = defaultdict(list)

    def consumer(name: str, concurrency: int, replay_window: int) -> CoordinatedConsumer:
        return CoordinatedConsumer(
            group=group,
            topics=[topic],
            coordinator=coordinator.address,
            bootstrap_servers=coordinator.bootstrap,
            name=name,
            max_concurrency=concurrency,
            session_timeout_ms=6000,
            replay_window=replay_window,
        )

    def handler(name: str, seconds: float, slow_key_seconds: float) -> Any:
        slow_key: list[bytes] = []

        async def handle(record: Any) -> None:
            starts[name].append((time.monotonic(), record.offset, record.key))
            slow_key[:] = slow_key or [record.key]
            await asyncio.sleep(slow_key_seconds if record.key == slow_key[0] else seconds)

        return handle

    # `behind` handles ~100 records/s of the ~300/s it owns: it queues up. The first key
    # it sees is slow, so records above its lowest pending one are done: the next owner
    # must skip those.
    behind, survivor = consumer("behind", 2, window), consumer("survivor", 64, window)
    tasks = [
        asyncio.create_task(behind.run(handler("behind", 0.01, 2.0))),
        asyncio.create_task(survivor.run(handler("survivor", 0.001, 0.001))),
    ]
    try:
        await wait_for(lambda: behind.owned_slots and survivor.owned_slots, 30, "both own slots")
        producing = asyncio.ensure_future(
            produce(coordinator.bootstrap, RECORDS, KEYS, topic=topic, rate=600)
        )
        await wait_for(
            lambda: len(starts["behind"]) > 150 and behind.progress.pending_count() > 100,
            30,
            "`behind` to have worked for a while and to have a queue",
        )
        await asyncio.wait_for(behind.close(), 30)
        everything = [(0, 65535)]
        await wait_for(lambda: survivor.owned_slots == everything, 30, "the survivor owning all")
        produced = await producing
        done = lambda: len({o for n in starts for _, o, _ in starts[n]}) >= len(produced)  # noqa: E731
        await wait_for(done, 60, "every record processed")
    finally:
        await survivor.close()
        await asyncio.gather(*tasks, return_exceptions=True)

    events = sorted(e for n in starts for e in starts[n])
    offsets = [o for _, o, _ in events]
    assert sorted(offsets) == list(range(RECORDS)), "each record exactly once"
    last: dict[bytes, int] = {}
    for _, offset, key in events:
        assert offset > last.get(key, -1), f"key {key!r}: {offset} started after {last[key]}"
        last[key] = offset
    stats = survivor.stats
    if window:
        assert stats.replayed > 0 and stats.rewinds == 0, stats
    else:
        assert stats.replayed == 0 and stats.rewinds > 0, stats
