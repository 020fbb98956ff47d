"""Durable positions on Kafka: the internal state topic, and the low watermark as an offset.

Range position maps live in a compacted topic (`DEFAULT_STATE_TOPIC`), keyed by group,
topic-partition and chunk so compaction keeps the latest of each. A map too large for one
record (thousands of members with fragmented ranges) is split by slot into chunks of at
most `MAX_RECORD_BYTES`, under Kafka's default 1 MiB `max.message.bytes`; loading takes
the union of every chunk of a partition. A union is always right, because a position
only says which offsets are done: a chunk left over from an older, longer write (or one
torn by a crash) can only say less than the newest, never something false.

Offset-commit metadata is not used: Kafka caps it at 4 KB and the bundled test broker drops
it. The minimum of each map is also committed as a plain offset under the group id, so lag
tooling sees the group. Every broker call is wrapped in a timeout: after a broker restart
some calls retry forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidReplicationFactorError,
    KafkaError,
    NoError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)

from coordinator.kafka.connect import KafkaUnreachable, start_client
from coordinator.kafka.metadata import fetch_partitions
from coordinator.kafka.settings import KafkaSettings
from coordinator.model.positions import RangePositionMap, TopicPartition
from coordinator.model.ranges import RangeSet
from coordinator.storage.base import DEFAULT_STATE_TOPIC, Positions, StoreError

log = logging.getLogger(__name__)
STATE_FORMAT_VERSION = 2  # 2: chunked maps; 1 (one record per partition) is still read
#: Half of Kafka's default max.message.bytes: room for the batch's own overhead.
MAX_RECORD_BYTES = 512 * 1024
#: What the state topic must be, and what a new one is created with.
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact"}
#: Keys starting with this are the store's own markers, not positions.
MARKER_KEY = b"\x00keyshard"


def state_key(group: str, topic: str, partition: int, chunk: int) -> bytes:
    return f"{group}\x00{topic}\x00{partition}\x00{chunk}".encode()


def encode_state(
    group: str, topic: str, partition: int, pmap: RangePositionMap,
    max_bytes: int = MAX_RECORD_BYTES,
) -> list[bytes]:  # fmt: skip
    """The map as one or more record values, each at most about `max_bytes` (a single
    segment larger than that still gets a record of its own)."""
    head = {"v": STATE_FORMAT_VERSION, "group": group, "topic": topic, "partition": partition}
    overhead = len(json.dumps(head)) + 32
    chunks: list[list[Any]] = [[]]
    size = overhead
    for segment in pmap.to_json():
        length = len(json.dumps(segment, separators=(",", ":"))) + 1
        if chunks[-1] and size + length > max_bytes:
            chunks.append([])
            size = overhead
        chunks[-1].append(segment)
        size += length
    return [
        json.dumps({**head, "chunk": i, "positions": chunk}, separators=(",", ":")).encode()
        for i, chunk in enumerate(chunks)
    ]


def decode_state(value: bytes) -> tuple[str, str, int, int, RangePositionMap]:
    """(group, topic, partition, chunk, the chunk's part of the map)."""
    data: dict[str, Any] = json.loads(value)
    if data.get("v") not in (1, STATE_FORMAT_VERSION):
        raise StoreError(f"state record of unknown format version {data.get('v')!r}")
    pmap = RangePositionMap.from_json(data["positions"])
    chunk = int(data.get("chunk", 0))
    return str(data["group"]), str(data["topic"]), int(data["partition"]), chunk, pmap


def merge_into(target: RangePositionMap, part: RangePositionMap) -> None:
    """`target` |= `part`, slot by slot (see the module docstring for why a union)."""
    for slots, position in part.segments():
        target.update((piece, old.union(position)) for piece, old in target.segments(
            RangeSet((slots,))))  # fmt: skip


class KafkaStateStore:
    """`StateStore` and `ClusterMetadata` (coordinator.storage.base) on one Kafka cluster.

    Every client it makes uses `settings` (security, client id); a failure to start one
    says why, naming the setting (coordinator.kafka.connect), and a missing permission
    names the ACL to grant.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = DEFAULT_STATE_TOPIC,
        timeout: float = 10.0,
        *,
        settings: KafkaSettings | None = None,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.timeout = timeout
        self.settings = settings or KafkaSettings.parse()
        self.max_record_bytes = max_record_bytes
        self._producer: AIOKafkaProducer | None = None
        self._committers: dict[str, AIOKafkaConsumer] = {}
        self._commit_locks: dict[str, asyncio.Lock] = {}
        self._metadata: AIOKafkaClient | None = None
        # Chunks last written (or loaded) per group and partition: fewer next time leaves
        # tombstones for the rest, so compaction drops them.
        self._chunks: dict[tuple[str, TopicPartition], int] = {}

    async def start(self) -> None:
        try:
            await self._ensure_topic()
            self._producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap_servers, acks="all", linger_ms=0,
                **self.settings.client_options(),
            )  # fmt: skip
            await start_client(
                self._producer, self.bootstrap_servers, self.settings, "state producer",
                self.timeout,
            )  # fmt: skip
            self._metadata = AIOKafkaClient(
                bootstrap_servers=self.bootstrap_servers, **self.settings.client_options()
            )
            await asyncio.wait_for(self._metadata.bootstrap(), self.timeout)
            await self._check_write_access()
        except KafkaUnreachable as err:
            await self.stop()
            raise StoreError(str(err)) from None
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        clients: list[Any] = [self._producer, *self._committers.values()]
        for client in clients:
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), self.timeout)
        if self._metadata is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._metadata.close(), self.timeout)
        self._producer = self._metadata = None
        self._committers.clear()

    def _denied(self, operation: str, err: BaseException) -> StoreError:
        user, _ = self.settings.credentials()
        principal = f"User:{user}" if user else "the coordinator's principal"
        return StoreError(
            f"Kafka refused {operation} on topic {self.topic!r} ({type(err).__name__}): grant "
            f"{principal} the ACL (kafka-acls --add --allow-principal {principal} "
            f"--operation {operation} --topic {self.topic}); README 'Running on Apache "
            "Kafka' lists every ACL the coordinator needs"
        )

    async def _ensure_topic(self) -> None:
        """Create the state topic compacted, or refuse an existing one that is not: a
        topic that deletes by age would lose the positions of every quiet group."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers, **self.settings.admin_options()
        )
        try:
            await start_client(
                admin, self.bootstrap_servers, self.settings, "admin client", self.timeout
            )
            existing = await asyncio.wait_for(admin.list_topics(), self.timeout)
            if self.topic not in existing:
                await self._create_topic(admin)
            else:
                await self._check_compacted(admin)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    async def _create_topic(self, admin: AIOKafkaAdminClient) -> None:
        # Replication factor -1: the cluster's default.replication.factor (KIP-464).
        # aiokafka's NewTopic wants replica assignments with a -1; none are given here.
        new = NewTopic(self.topic, 1, -1, {}, topic_configs=dict(STATE_TOPIC_CONFIG))
        response = await asyncio.wait_for(admin.create_topics([new]), self.timeout)
        for _, code, *_ in response.topic_errors:
            error = for_code(code)
            if error is NoError or error is TopicAlreadyExistsError:
                continue
            if error in (TopicAuthorizationFailedError, ClusterAuthorizationFailedError):
                raise StoreError(
                    f"Kafka refused to create the state topic {self.topic!r}: create it "
                    f"yourself (1 partition, cleanup.policy=compact) or grant the "
                    "coordinator's principal Create on it"
                )
            if error is InvalidReplicationFactorError:  # brokers before 2.4 need a number
                retry = NewTopic(self.topic, 1, 1, topic_configs=dict(STATE_TOPIC_CONFIG))
                await asyncio.wait_for(admin.create_topics([retry]), self.timeout)
                continue
            raise StoreError(f"cannot create the state topic {self.topic!r}: {error.__name__}")

    async def _check_compacted(self, admin: AIOKafkaAdminClient) -> None:
        resource = ConfigResource(ConfigResourceType.TOPIC, self.topic, {"cleanup.policy": None})
        try:
            (response,) = await asyncio.wait_for(admin.describe_configs([resource]), self.timeout)
        except (KafkaError, ValueError) as err:  # a broker without DescribeConfigs
            log.warning(
                "cannot check that state topic %r is compacted (%s): make sure its "
                "cleanup.policy is compact", self.topic, err,
            )  # fmt: skip
            return
        for _code, _message, _type, _name, entries, *_ in response.resources:
            values = {entry[0]: entry[1] for entry in entries}
            policy = values.get("cleanup.policy") or ""
            if "compact" not in policy.split(","):
                raise StoreError(
                    f"state topic {self.topic!r} exists with cleanup.policy={policy or 'delete'}; "
                    "keyshard needs compact (it keeps the latest record of every group "
                    "for as long as the group exists): kafka-configs --alter --entity-type "
                    f"topics --entity-name {self.topic} --add-config cleanup.policy=compact"
                )

    async def _check_write_access(self) -> None:
        """Write a start-up marker now, so a principal that may not write to the state
        topic is told at start, not at the first handoff minutes later."""
        assert self._producer is not None
        try:
            await asyncio.wait_for(
                self._producer.send_and_wait(self.topic, key=MARKER_KEY, value=b"{}"),
                self.timeout,
            )
        except (TopicAuthorizationFailedError, ClusterAuthorizationFailedError) as err:
            raise self._denied("Write", err) from None

    async def load(self) -> dict[str, Positions]:
        """Replay the state topic to its high watermark: per group and partition the union
        of its chunks, the newest record of each."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
            **self.settings.consumer_options(),
        )  # fmt: skip
        await asyncio.wait_for(consumer.start(), self.timeout)
        chunks: dict[bytes, tuple[str, TopicPartition, int, RangePositionMap]] = {}
        try:
            tp = KafkaTP(self.topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout
            while True:
                try:
                    batch = await consumer.getmany(tp, timeout_ms=200)
                except TopicAuthorizationFailedError as err:
                    raise self._denied("Read", err) from None
                for record in batch.get(tp, []):
                    if record.key is None or record.key.startswith(MARKER_KEY):
                        continue
                    if record.value is None:  # a tombstone: that chunk is gone
                        chunks.pop(record.key, None)
                        continue
                    try:
                        group, topic, partition, chunk, pmap = decode_state(record.value)
                    except (StoreError, ValueError, KeyError, TypeError) as err:
                        log.error("skipping unreadable state record at %d: %s", record.offset, err)
                        continue
                    chunks[record.key] = (group, (topic, partition), chunk, pmap)
                # The fetch high watermark, not end_offsets(): some brokers under-report it.
                highwater = consumer.highwater(tp)
                if highwater is not None and await consumer.position(tp) >= highwater:
                    return self._assemble(chunks.values())
                if loop.time() > deadline:
                    raise StoreError(
                        f"state topic {self.topic!r} not replayed within {self.timeout} s"
                    )
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    def _assemble(
        self, chunks: Iterable[tuple[str, TopicPartition, int, RangePositionMap]]
    ) -> dict[str, Positions]:
        groups: dict[str, Positions] = {}
        for group, tp, chunk, part in chunks:
            key = (group, tp)
            self._chunks[key] = max(self._chunks.get(key, 0), chunk + 1)
            merge_into(groups.setdefault(group, {}).setdefault(tp, RangePositionMap()), part)
        return groups

    async def save(self, group: str, positions: Positions) -> None:
        if self._producer is None:
            raise StoreError("state store is not started")
        futures = []
        try:
            for tp, pmap in positions.items():
                values = encode_state(group, *tp, pmap, self.max_record_bytes)
                keys = [state_key(group, *tp, i) for i in range(len(values))]
                stale = range(len(values), self._chunks.get((group, tp), 0))
                records: list[tuple[bytes, bytes | None]] = [*zip(keys, values, strict=True)]
                records += [(state_key(group, *tp, i), None) for i in stale]
                for key, value in records:
                    futures.append(await self._producer.send(self.topic, key=key, value=value))
                self._chunks[(group, tp)] = len(values)
            await asyncio.wait_for(asyncio.gather(*futures), self.timeout)
        except TopicAuthorizationFailedError as err:
            raise self._denied("Write", err) from None

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
                bootstrap_servers=self.bootstrap_servers, group_id=group,
                enable_auto_commit=False, **self.settings.consumer_options(),
            )  # fmt: skip
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
