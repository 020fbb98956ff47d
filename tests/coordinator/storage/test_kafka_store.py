"""The Kafka state store on a real broker: offset commits for tooling.

Every position write sets off a commit of the low watermarks; writes close together set
off commits that overlap. Each group must keep one committer (a second one was started
and then dropped unclosed: asyncio logged "Unclosed AIOKafkaConsumer" in the demo).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.local.broker import EmbeddedBroker
from coordinator.model.positions import Position, RangePositionMap
from coordinator.storage import kafka_store
from coordinator.storage.kafka_store import KafkaStateStore
from tests.integration.harness import create_topic

pytestmark = pytest.mark.integration


async def test_overlapping_commits_of_a_group_share_one_committer(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []

    class CountedConsumer(kafka_store.AIOKafkaConsumer):  # type: ignore[misc]
        async def start(self) -> None:
            started.append(self)
            await super().start()

    monkeypatch.setattr(kafka_store, "AIOKafkaConsumer", CountedConsumer)
    await create_topic(broker.bootstrap_servers, "orders")
    store = KafkaStateStore(broker.bootstrap_servers, timeout=15.0)
    await store.start()
    try:
        for done_upto in (10, 20):
            pmap = RangePositionMap(Position(done_upto))
            await asyncio.gather(
                *(store.commit_low_watermarks("g", {("orders", 0): pmap}) for _ in range(5))
            )
        assert len(started) == 1, "one committer per group, however the commits overlap"
    finally:
        await store.stop()
