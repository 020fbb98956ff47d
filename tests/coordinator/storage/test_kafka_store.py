"""The Kafka state store on a real broker: records within Kafka's size limit, a state topic
that compacts, offset commits for tooling.

Every position write sets off a commit of the low watermarks; writes close together set
off commits that overlap. Each group must keep one committer (a second one was started
and then dropped unclosed: asyncio logged "Unclosed AIOKafkaConsumer" in the demo).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from coordinator.model.hashing import SLOT_COUNT
from coordinator.model.positions import Position, RangePositionMap
from coordinator.model.ranges import SlotRange
from coordinator.storage import kafka_store
from coordinator.storage.base import DEFAULT_STATE_TOPIC, StoreError
from coordinator.storage.kafka_store import MAX_RECORD_BYTES, KafkaStateStore, encode_state
from tests.brokers import Broker
from tests.integration.harness import create_topic

pytestmark = pytest.mark.integration


async def test_overlapping_commits_of_a_group_share_one_committer(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
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


def fragmented_map(members: int, seed: int = 7) -> RangePositionMap:
    """Positions as a group of `members` members with load-aware's few ranges each leaves
    them: ~3 segments per member, each its own next offset and a few acked intervals (keys
    complete out of order)."""
    rng = random.Random(seed)
    pmap = RangePositionMap()
    bounds = sorted(rng.sample(range(1, SLOT_COUNT), 3 * members - 1))
    starts = [0, *bounds]
    ends = [b - 1 for b in bounds] + [SLOT_COUNT - 1]
    for start, end in zip(starts, ends, strict=True):
        base = rng.randrange(5_000_000, 9_000_000)
        acked = [(base + 10 * i + 2, base + 10 * i + 2 + rng.randrange(1, 6)) for i in range(3)]
        pmap.assign(SlotRange(start, end), Position(base, tuple(acked)))
    return pmap


@pytest.mark.brokers("tansu", "kafka")
async def test_a_position_map_too_large_for_one_record_is_split_and_read_back(
    broker: Broker,
) -> None:
    """5,000 members with fragmented ranges: one record would pass Kafka's default 1 MiB
    max.message.bytes, so the map goes in chunks, and what loads is the same map."""
    pmap = fragmented_map(5_000)
    (whole,) = encode_state("g", "orders", 0, pmap, max_bytes=1 << 40)
    assert len(whole) > 1_048_588, "the case this test is about: over Kafka's default limit"
    chunks_of_pmap = encode_state("g", "orders", 0, pmap)
    assert len(chunks_of_pmap) >= 2 and max(map(len, chunks_of_pmap)) <= MAX_RECORD_BYTES
    store = KafkaStateStore(broker.bootstrap_servers, timeout=30.0)
    await store.start()
    try:
        await store.save("g", {("orders", 0): pmap})
        small = RangePositionMap(Position(10_000_000))  # later: everything done to here
        await store.save("g", {("orders", 0): small})  # one chunk: tombstones for the rest
        await store.save("h", {("orders", 0): pmap})
        reader = KafkaStateStore(broker.bootstrap_servers, timeout=30.0)
        loaded = await reader.load()
    finally:
        await store.stop()
    assert loaded["h"][("orders", 0)].to_json() == pmap.to_json()
    assert loaded["g"][("orders", 0)].to_json() == small.to_json()
    chunks = reader._chunks  # what the reader found live, tombstoned chunks not counted
    assert (chunks[("h", ("orders", 0))], chunks[("g", ("orders", 0))]) == (len(chunks_of_pmap), 1)


def test_a_torn_or_stale_chunk_only_says_less_than_the_newest() -> None:
    """Loading takes the union of chunks: an older chunk's positions are below the newer
    ones of the same slots, so the union is the newer map (nothing done is forgotten,
    nothing undone is claimed)."""
    old = fragmented_map(50, seed=1)
    new = RangePositionMap()
    for slots, position in old.segments():
        new.assign(slots, Position(position.next_offset + 100))
    target = RangePositionMap()
    for part in (new, old):
        kafka_store.merge_into(target, part)
    assert target.to_json() == new.to_json()


@pytest.mark.brokers("kafka")
async def test_the_state_topic_is_created_compacted_and_a_deleting_one_is_refused(
    broker: Broker,
) -> None:
    store = KafkaStateStore(broker.bootstrap_servers, timeout=30.0)
    await store.start()
    await store.stop()
    assert await topic_config(broker.bootstrap_servers, DEFAULT_STATE_TOPIC) == "compact"

    await create_topic(broker.bootstrap_servers, "deleting.state")
    refused = KafkaStateStore(broker.bootstrap_servers, "deleting.state", timeout=30.0)
    with pytest.raises(StoreError, match=r"'deleting.state' exists with cleanup.policy=delete"):
        await refused.start()


async def topic_config(bootstrap: str, topic: str) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})
        (response,) = await admin.describe_configs([resource])
        (resource_answer,) = response.resources
        return str({e[0]: e[1] for e in resource_answer[4]}["cleanup.policy"])
    finally:
        await admin.close()
