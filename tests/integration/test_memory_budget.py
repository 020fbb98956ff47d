"""A consumer holds at most its memory budget of records, whatever their size.

Records of 2 MB against a budget of 1 MB: each is still processed (a record is taken
whenever the budget is not used up, so a consumer always makes progress), a WARNING names
its size, the Kafka client's fetch sizes follow the budget, and the records the consumer
holds never pass the budget by more than one record.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from harness import CoordinatorProcess, wait_for
from keyshard.consumer_client import CoordinatedConsumer

pytestmark = pytest.mark.integration

RECORD_BYTES = 2 * 1024 * 1024
BUDGET = 1024 * 1024
RECORDS = 12
KEYS = 3


async def _topic_for_large_records(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:  # Apache Kafka refuses records over 1 MB by default
        configs = {"max.message.bytes": str(4 * RECORD_BYTES)}
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
    finally:
        await admin.close()


async def _produce_large(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * RECORD_BYTES)
    await producer.start()
    try:
        for i in range(RECORDS):
            value = bytes([i]) * RECORD_BYTES
            await producer.send_and_wait(topic, value, key=f"key-{i % KEYS}".encode())
    finally:
        await producer.stop()


async def test_records_larger_than_the_budget_are_processed_with_a_warning(
    coordinator: CoordinatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"large-{uuid.uuid4().hex[:8]}"
    await _topic_for_large_records(coordinator.bootstrap, topic)
    processed: list[tuple[bytes, int]] = []

    async def handler(record: Any) -> None:
        assert len(record.value) == RECORD_BYTES
        await asyncio.sleep(0.02)
        processed.append((record.key, record.offset))

    consumer = CoordinatedConsumer(
        group=f"large-group-{uuid.uuid4().hex[:6]}",
        topics=[topic],
        coordinator=coordinator.address,
        bootstrap_servers=coordinator.bootstrap,
        max_buffer_bytes=BUDGET,
        session_timeout_ms=6000,
    )
    most_held = 0

    async def watch() -> None:
        nonlocal most_held
        while True:
            running = consumer._running
            if running is not None:
                budget = running.path.fetcher.budget
                most_held = max(most_held, budget.used() + budget.window)
            await asyncio.sleep(0.002)

    caplog.set_level(logging.WARNING, logger="keyshard.consumer_client")
    run = asyncio.create_task(consumer.run(handler))
    watching = asyncio.create_task(watch())
    try:
        await wait_for(lambda: consumer.owned_slots, 30, "the consumer to own its slots")
        await _produce_large(coordinator.bootstrap, topic)
        await wait_for(lambda: len(processed) == RECORDS, 60, "every large record processed")
        assert sorted(offset for _, offset in processed) == list(range(RECORDS))  # once each
        for key in {k for k, _ in processed}:
            offsets = [o for k, o in processed if k == key]
            assert offsets == sorted(offsets)
        one_record = RECORD_BYTES + len(b"key-0")
        assert 0 < most_held <= BUDGET + one_record
        assert consumer._running is not None
        fetcher = consumer._running.path.fetcher
        assert fetcher.budget.pauses >= RECORDS - 1
        options = fetcher.kafka._fetcher  # aiokafka's: the sizes the budget set
        assert options._max_partition_fetch_bytes == BUDGET // 16
        assert options._fetch_max_bytes == BUDGET // 4
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            f"is {one_record} bytes, more than the whole memory budget" in w for w in warnings
        ), warnings
    finally:
        watching.cancel()
        await asyncio.wait_for(consumer.close(), 30)
        await asyncio.wait_for(asyncio.gather(run, watching, return_exceptions=True), 30)
