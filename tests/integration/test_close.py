"""A graceful close drains what is in flight and reports it: the Leave's positions cover
every record whose handler was running when `close()` was called."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from harness import CoordinatorProcess, create_topic, produce, wait_for
from keyshard.consumer_client import CoordinatedConsumer

pytestmark = pytest.mark.integration

HANDLER_S = 1.0  # far longer than a fetch round (getmany waits at most 200 ms)


async def test_close_lets_in_flight_handlers_finish_and_reports_them(
    coordinator: CoordinatorProcess,
) -> None:
    topic = f"close-{uuid.uuid4().hex[:8]}"
    group = f"close-group-{uuid.uuid4().hex[:6]}"
    await create_topic(coordinator.bootstrap, topic)
    await produce(coordinator.bootstrap, 20, 20, topic=topic)  # 20 keys: no key waits on another
    running: set[int] = set()
    finished: list[int] = []
    cancelled: list[int] = []

    async def handler(record: Any) -> None:
        running.add(record.offset)
        try:
            await asyncio.sleep(HANDLER_S)
        except asyncio.CancelledError:
            cancelled.append(record.offset)
            raise
        finished.append(record.offset)

    consumer = CoordinatedConsumer(
        group=group,
        topics=[topic],
        coordinator=coordinator.address,
        bootstrap_servers=coordinator.bootstrap,
        name="closer",
        session_timeout_ms=6000,
        max_concurrency=4,
    )
    task = asyncio.create_task(consumer.run(handler))
    try:
        await wait_for(lambda: len(running) == 4, 15, "four handlers in flight")
        in_flight = set(running)
        await asyncio.wait_for(consumer.close(), 15)
    finally:
        await asyncio.wait_for(task, 30)

    assert cancelled == [], f"close() cancelled in-flight handlers {cancelled}"
    assert sorted(finished) == sorted(in_flight) == [0, 1, 2, 3]

    async def reported() -> bool:
        view = await coordinator.group(group)
        marks = [p["low_watermark"] for p in view["partitions"]] if view else []
        return marks == [4]

    await wait_for(reported, 10, "the Leave's positions (offsets 0-3 done) at the coordinator")
