"""A client of ours asking about a deleted topic does not create it again; a client left
alone (a user's producer) keeps aiokafka's default. Tansu creates topics on demand."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from harness.brokers import Broker
from keyshard.core.kafka.no_topic_creation import never_create_topics

pytestmark = pytest.mark.brokers("tansu")


async def _topics_after_a_fresh_fetch_of_deleted(bootstrap: str, guarded: bool) -> list[str]:
    """Create and delete topic `gone`, then fetch its partition with a fresh consumer."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("gone", 2, 1)])
        await admin.delete_topics(["gone"])
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        if guarded:
            never_create_topics(consumer)
        await consumer.start()
        try:
            consumer.assign([TopicPartition("gone", 0)])
            await asyncio.wait_for(consumer.getmany(timeout_ms=1500), 10)
        finally:
            await consumer.stop()
        return list(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_guarded_consumer_does_not_create_a_deleted_topic(broker: Broker) -> None:
    assert "gone" not in await _topics_after_a_fresh_fetch_of_deleted(
        broker.bootstrap_servers, True
    )


async def test_an_unguarded_consumer_still_does(broker: Broker) -> None:
    """The control: without the guard this broker creates the topic, so the test above
    is not passing for want of a broker that creates topics."""
    assert "gone" in await _topics_after_a_fresh_fetch_of_deleted(broker.bootstrap_servers, False)
