"""Durable positions on Kafka: the internal state topic, and the low watermark as an offset.

Range position maps live in a compacted topic (`DEFAULT_STATE_TOPIC`), one record per
group and topic-partition, keyed so compaction keeps the latest. Offset-commit metadata is
not used: Kafka caps it at 4 KB and the bundled test broker drops it. The minimum of each
map is also committed as a plain offset under the group id, so lag tooling sees the group.
Every broker call is wrapped in a timeout: after a broker restart some calls retry forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from coordinator.kafka.metadata import fetch_partitions
from coordinator.model.positions import RangePositionMap
from coordinator.storage.base import DEFAULT_STATE_TOPIC, Positions, StoreError

log = logging.getLogger(__name__)
STATE_FORMAT_VERSION = 1


def state_key(group: str, topic: str, partition: int) -> bytes:
    return f"{group}\x00{topic}\x00{partition}".encode()


def encode_state(group: str, topic: str, partition: int, pmap: RangePositionMap) -> bytes:
    return json.dumps(
        {
            "v": STATE_FORMAT_VERSION,
            "group": group,
            "topic": topic,
            "partition": partition,
            "positions": pmap.to_json(),
        },
        separators=(",", ":"),
    ).encode()


def decode_state(value: bytes) -> tuple[str, str, int, RangePositionMap]:
    data: dict[str, Any] = json.loads(value)
    if data.get("v") != STATE_FORMAT_VERSION:
        raise StoreError(f"state record of unknown format version {data.get('v')!r}")
    pmap = RangePositionMap.from_json(data["positions"])
    return str(data["group"]), str(data["topic"]), int(data["partition"]), pmap


class KafkaStateStore:
    """`StateStore` and `ClusterMetadata` (coordinator.storage.base) on one Kafka cluster."""

    def __init__(
        self, bootstrap_servers: str, topic: str = DEFAULT_STATE_TOPIC, timeout: float = 10.0
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.timeout = timeout
        self._producer: AIOKafkaProducer | None = None
        self._committers: dict[str, AIOKafkaConsumer] = {}
        self._commit_locks: dict[str, asyncio.Lock] = {}
        self._metadata: AIOKafkaClient | None = None

    async def start(self) -> None:
        await self._ensure_topic()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers, acks="all", linger_ms=0
        )
        await asyncio.wait_for(self._producer.start(), self.timeout)
        self._metadata = AIOKafkaClient(bootstrap_servers=self.bootstrap_servers)
        await asyncio.wait_for(self._metadata.bootstrap(), self.timeout)

    async def stop(self) -> None:
        clients: list[Any] = [self._producer, *self._committers.values()]
        for client in clients:
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), self.timeout)
        if self._metadata is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._metadata.close(), self.timeout)
        self._committers.clear()

    async def _ensure_topic(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
        try:
            await asyncio.wait_for(admin.start(), self.timeout)
            existing = await asyncio.wait_for(admin.list_topics(), self.timeout)
            if self.topic not in existing:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await asyncio.wait_for(
                        admin.create_topics(
                            [
                                NewTopic(
                                    self.topic,
                                    1,
                                    1,
                                    topic_configs={"cleanup.policy": "compact"},
                                )
                            ]
                        ),
                        self.timeout,
                    )
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    async def load(self) -> dict[str, Positions]:
        """Replay the state topic to its high watermark; the last record of a key wins."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False
        )
        await asyncio.wait_for(consumer.start(), self.timeout)
        groups: dict[str, Positions] = {}
        try:
            tp = KafkaTP(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout
            while True:
                batch = await consumer.getmany(tp, timeout_ms=200)
                for record in batch.get(tp, []):
                    if record.value is None:
                        continue
                    try:
                        group, topic, partition, pmap = decode_state(record.value)
                    except (StoreError, ValueError, KeyError, TypeError) as err:
                        log.error("skipping unreadable state record at %d: %s", record.offset, err)
                        continue
                    groups.setdefault(group, {})[(topic, partition)] = pmap
                # The fetch high watermark, not end_offsets(): some brokers under-report it.
                highwater = consumer.highwater(tp)
                if highwater is not None and await consumer.position(tp) >= highwater:
                    return groups
                if loop.time() > deadline:
                    raise StoreError(
                        f"state topic {self.topic!r} not replayed within {self.timeout} s"
                    )
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def save(self, group: str, positions: Positions) -> None:
        if self._producer is None:
            raise StoreError("state store is not started")
        futures = [
            await self._producer.send(
                self.topic,
                key=state_key(group, topic, partition),
                value=encode_state(group, topic, partition, pmap),
            )
            for (topic, partition), pmap in positions.items()
        ]
        await asyncio.wait_for(asyncio.gather(*futures), self.timeout)

    async def commit_low_watermarks(self, group: str, positions: Positions) -> None:
        """Best effort: tooling visibility only, never the source of truth.

        One commit per group at a time: every position write sets one off, and two that
        overlapped both started a committer, and leaked one (asyncio then logged an
        unclosed consumer)."""
        offsets = {
            KafkaTP(topic, partition): pmap.minimum_offset()
            for (topic, partition), pmap in positions.items()
        }
        if not offsets:
            return
        async with self._commit_locks.setdefault(group, asyncio.Lock()):
            try:
                committer = await self._committer(group)
                assigned = set(committer.assignment())
                if not set(offsets) <= assigned:
                    committer.assign(sorted(assigned | set(offsets)))
                    committer.pause(*committer.assignment())  # commit only, never fetch
                await asyncio.wait_for(committer.commit(offsets), self.timeout)
            except (KafkaError, TimeoutError, OSError) as err:
                log.warning("could not commit low watermarks of group %r: %s", group, err)

    async def _committer(self, group: str) -> AIOKafkaConsumer:
        """The group's committer, started on first use (and stopped if it cannot start)."""
        committer = self._committers.get(group)
        if committer is None:
            committer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap_servers, group_id=group, enable_auto_commit=False
            )
            try:
                await asyncio.wait_for(committer.start(), self.timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(committer.stop(), self.timeout)
                raise
            self._committers[group] = committer
        return committer

    async def partition_counts(self, topics: tuple[str, ...]) -> dict[str, int]:
        """Partition count of every topic that exists (missing topics are left out)."""
        if self._metadata is None:
            raise StoreError("state store is not started")
        # A fresh metadata fetch each time: topics created after start-up must be seen.
        answer = await fetch_partitions(self._metadata, topics, self.timeout)
        return {topic: len(parts) for topic, parts in answer.partitions.items()}

    async def probe(self) -> None:
        """One metadata round trip to the cluster: raises when Kafka is unreachable.

        Used by the admin API's readiness check; the caller bounds it with a short timeout.
        """
        if self._metadata is None:
            raise StoreError("state store is not started")
        await self._metadata.fetch_all_metadata()
