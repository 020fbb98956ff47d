"""The state topic and the cluster on a real broker: records within Kafka's size limit, a
state topic that compacts, offset commits for tooling.

Every position write sets off a commit of the low watermarks; writes close together set
off commits that overlap. Each group must keep one committer (a second one would be
dropped unclosed, and asyncio would log "Unclosed AIOKafkaConsumer").
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from harness import create_topic, produce, wait_for
from harness.brokers import Broker
from keyshard.coordinator.storage import kafka_cluster
from keyshard.coordinator.storage.base import DEFAULT_STATE_TOPIC, StoreError
from keyshard.coordinator.storage.kafka_cluster import KafkaCluster, ensure_state_topic
from keyshard.coordinator.storage.kafka_log import KafkaStateLog, ReplicaIdentity
from keyshard.coordinator.storage.log_format import (
    MAX_RECORD_BYTES,
    encode_positions,
    merge_into,
)
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.hashing import SLOT_COUNT
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import SlotRange

pytestmark = pytest.mark.integration


async def test_overlapping_commits_of_a_group_share_one_committer(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []

    class CountedConsumer(AIOKafkaConsumer):  # type: ignore[misc]  # aiokafka is untyped (Any)
        async def start(self) -> None:
            started.append(self)
            await super().start()

    monkeypatch.setattr(kafka_cluster, "AIOKafkaConsumer", CountedConsumer)
    await create_topic(broker.bootstrap_servers, "orders")
    cluster = KafkaCluster(broker.bootstrap_servers, KafkaSettings.parse(), timeout=15.0)
    await cluster.start()
    try:
        for done_upto in (10, 20):
            pmap = RangePositionMap(Position(done_upto))
            await asyncio.gather(
                *(cluster.commit_low_watermarks("g", {("orders", 0): pmap}) for _ in range(5))
            )
        assert len(started) == 1, "one committer per group, however the commits overlap"
    finally:
        await cluster.stop()


async def test_partition_ends_are_right_after_batched_produces(broker: Broker) -> None:
    """Where a `latest` group starts: ListOffsets under-reports on Tansu after batched
    produces (DESIGN.md §3), so the ends come from a fetch answer."""
    await create_topic(broker.bootstrap_servers, "orders", partitions=2)
    produced = await produce(broker.bootstrap_servers, 500, 20, topic="orders")
    expected = {
        ("orders", p): 1 + max(r.offset for r in produced if r.partition == p) for p in (0, 1)
    }
    store = KafkaCluster(broker.bootstrap_servers, KafkaSettings.parse(), timeout=15.0)
    await store.start()
    try:
        assert await store.partition_ends(sorted(expected)) == expected
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
    max.message.bytes, so the map goes in chunks, and what a replica reads back is the
    same map."""
    pmap = fragmented_map(5_000)
    ((_, whole),) = encode_positions("g", ("orders", 0), pmap, 1, max_bytes=1 << 40)
    assert whole is not None and len(whole) > 1_048_588, "over Kafka's default limit"
    chunks = encode_positions("g", ("orders", 0), pmap, 1)
    assert len(chunks) >= 2 and max(len(v) for _, v in chunks) <= MAX_RECORD_BYTES
    identity = ReplicaIdentity("a", "a:1", "http://a:2")
    log = KafkaStateLog(
        broker.bootstrap_servers, DEFAULT_STATE_TOPIC, settings=KafkaSettings.parse(),
        identity=identity, partitions=1, timeout=30.0,
    )  # fmt: skip
    await log.start()
    try:
        epoch, _ = await log.claim(0)
        await log.write(0, epoch, chunks)
        # Not `end_of` right after the write: the broker writes the commit markers after
        # the commit returns, and until then the records are not committed to a reader.
        image = log.images[0]
        await wait_for(
            lambda: image.chunk_count("g", ("orders", 0)) == len(chunks),
            30,
            "every chunk read back",
        )
        read = image.groups()["g"].positions[("orders", 0)]
    finally:
        await log.stop()
    assert read.to_json() == pmap.to_json()


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
        merge_into(target, part)
    assert target.to_json() == new.to_json()


@pytest.mark.brokers("kafka")
async def test_the_state_topic_is_created_compacted_and_a_deleting_one_is_refused(
    broker: Broker,
) -> None:
    settings = KafkaSettings.parse()
    count = await ensure_state_topic(broker.bootstrap_servers, settings, DEFAULT_STATE_TOPIC, 3, 30)
    assert count == 3
    assert await topic_config(broker.bootstrap_servers, DEFAULT_STATE_TOPIC) == "compact"

    await create_topic(broker.bootstrap_servers, "deleting.state")
    with pytest.raises(StoreError, match=r"'deleting.state' exists with cleanup.policy=delete"):
        await ensure_state_topic(broker.bootstrap_servers, settings, "deleting.state", 3, 30)


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
