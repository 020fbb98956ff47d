"""Topics and keyed records on a real broker, through aiokafka and the Kafka settings a
client of that broker needs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.local.demo import TOPIC
from keyshard.local.verify import Produced


async def create_topic(
    bootstrap: str,
    topic: str = TOPIC,
    partitions: int = 1,
    kafka_config: Mapping[str, str] | None = None,
    replication_factor: int = 1,
) -> None:
    """`replication_factor` -1: the cluster's `default.replication.factor`."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, **KafkaSettings.parse(kafka_config).admin_options()
    )
    await admin.start()
    try:
        # aiokafka wants a replica assignment beside a -1, and an empty one says "none".
        assignment: dict[int, list[int]] | None = {} if replication_factor == -1 else None
        await admin.create_topics([NewTopic(topic, partitions, replication_factor, assignment)])
    finally:
        await admin.close()


async def append(
    bootstrap: str,
    topic: str,
    partition: int,
    *records: tuple[bytes, bytes | None],
    signed_by: ReplicaSecret | None = None,
) -> None:
    """Append (key, value) records to one partition, in one batch as far as the broker
    goes: what anyone who may write to the topic can do (unsigned), or a holder of a
    replica secret (`signed_by`)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50)
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic, v, k, partition=partition,
                headers=signed_by.headers(topic, partition, k, v) if signed_by else None,
            )
            for k, v in records
        ]  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*sent), 20)
    finally:
        await producer.stop()


async def produce(
    bootstrap: str,
    count: int,
    keys: int,
    *,
    topic: str = TOPIC,
    start: int = 0,
    rate: float | None = None,
    key_of: Callable[[int], str] | None = None,
    kafka_config: Mapping[str, str] | None = None,
    compression: str | None = None,
    sent_ns: list[int] | None = None,
    idempotent: bool = False,
    until: asyncio.Event | None = None,
) -> list[Produced]:
    """Produce `count` keyed records (key = record index mod `keys`, or `key_of(index)`),
    optionally paced to `rate` records per second, with Kafka settings and a codec.
    `sent_ns`, if given, gets each record's send time (CLOCK_MONOTONIC ns, as the
    handlers log theirs), in the order of the list returned. `idempotent`: acks=all and
    no duplicate or reordering from retries, as a producer that rides through a broker's
    failover is set up. `until`: stop early once it is set (traffic that must outlast
    something whose duration the machine's load decides)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=2,
        compression_type=compression,
        enable_idempotence=idempotent,
        **KafkaSettings.parse(kafka_config).client_options(),
    )
    await producer.start()
    try:
        began = time.monotonic()
        sent = []
        for i in range(start, start + count):
            if until is not None and until.is_set():
                break
            key = key_of(i) if key_of is not None else f"key-{i % keys}"
            if sent_ns is not None:
                sent_ns.append(time.monotonic_ns())
            sent.append((key, await producer.send(topic, key=key.encode(), value=str(i).encode())))
            if rate is not None and i % 50 == 0:
                await asyncio.sleep(max(0.0, began + (i - start) / rate - time.monotonic()))
        out = []
        for key, fut in sent:
            meta = await fut
            out.append(Produced(meta.partition, meta.offset, key))
        return out
    finally:
        await producer.stop()
