"""Batch reads of the `keyshard` source against a real broker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiokafka import AIOKafkaProducer

from harness import create_topic, produce
from harness.brokers import Broker
from keyshard.core.model.hashing import SLOT_COUNT, slot_for_key
from keyshard.spark_jobs.source import register
from tests.conftest import SECURED_PREFIX, SecuredKafka

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu", "kafka")]


async def test_batch_read_returns_exactly_what_was_produced(
    spark: SparkSession, broker: Broker
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topic(bootstrap, "orders", partitions=2)
    await create_topic(bootstrap, "clicks", partitions=1)
    produced = []
    for i, codec in enumerate(("gzip", "snappy", "lz4", "zstd")):  # every codec, read back
        produced += await produce(
            bootstrap, 300, 40, topic="orders", start=300 * i, compression=codec
        )
    produced += await produce(bootstrap, 300, 7, topic="clicks")
    register(spark)
    df = (
        spark.read.format("keyshard")
        .option("bootstrap_servers", bootstrap)
        .option("topics", "orders,clicks")
        .option("ranges", "4")
        .load()
    )
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "slot"]
    rows = df.collect()
    assert df.rdd.getNumPartitions() == 3 * 4  # (topic-partition x slot range)
    got = sorted((r.topic, r.partition, r.offset) for r in rows)
    topics = ["orders"] * 1200 + ["clicks"] * 300
    want = sorted((t, p.partition, p.offset) for t, p in zip(topics, produced, strict=True))
    assert got == want
    assert all(r.slot == slot_for_key(r.key) for r in rows)


async def test_unkeyed_records_spread_by_offset_and_the_ordering_header_wins(
    spark: SparkSession, broker: Broker
) -> None:
    """The slot column is the consumer client's: header `ordering-key` over the record key,
    and records with neither are spread by offset (they have no order to keep)."""
    bootstrap = broker.bootstrap_servers
    await create_topic(bootstrap, "mixed", partitions=1)
    await create_topic(bootstrap, "empty", partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(6):
            await producer.send_and_wait("mixed", key=None, value=str(i).encode())
        await producer.send_and_wait(
            "mixed", key=b"k", value=b"h", headers=[("ordering-key", b"user-7")]
        )
    finally:
        await producer.stop()
    register(spark)

    def read(topics: str) -> list[Any]:
        return (
            spark.read.format("keyshard")
            .option("bootstrap_servers", bootstrap)
            .option("topics", topics)
            .load()
            .collect()
        )

    rows = sorted(read("mixed"), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(7))
    assert all(r.key is None and r.slot == r.offset % SLOT_COUNT for r in rows[:6])
    assert rows[6].slot == slot_for_key(b"user-7")
    assert read("empty") == []


@pytest.mark.brokers()  # its own broker: the session's SASL_SSL node
async def test_a_batch_read_over_sasl_ssl_takes_kafka_options(
    spark: SparkSession, secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    """`kafka.`-prefixed options are Kafka settings, as in Spark's own Kafka source; the
    principal `app` holds only a consumer's ACLs. A wrong password is a clear error."""
    topic = f"{SECURED_PREFIX}{tmp_path.name}"
    admin = secured_kafka.client_config("admin")
    await create_topic(secured_kafka.address, topic, partitions=2, kafka_config=admin)
    produced = await produce(secured_kafka.address, 500, 20, topic=topic, kafka_config=admin)
    register(spark)

    def read(password: str) -> list[Any]:
        config = secured_kafka.client_config("app", **{"sasl.password": password})
        reader = spark.read.format("keyshard").option("topics", topic).option("ranges", "2")
        reader = reader.option("kafka.bootstrap.servers", secured_kafka.address)
        for name, value in config.items():
            reader = reader.option(f"kafka.{name}", value)
        return reader.load().collect()

    rows = read(secured_kafka.users["app"])
    assert sorted((r.partition, r.offset) for r in rows) == sorted(
        (p.partition, p.offset) for p in produced
    )
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match=r"refused the SASL SCRAM-SHA-512 credentials"):
        read("wrong")


@pytest.mark.brokers("kafka")  # transactions: Tansu has no transactional producer
async def test_a_batch_read_skips_aborted_records_and_stops_at_an_open_transaction(
    spark: SparkSession, broker: Broker
) -> None:
    """Read committed data (the default): aborted records are never rows, and a read
    planned while a transaction is open ends where it begins instead of waiting on it."""
    bootstrap = broker.bootstrap_servers
    await create_topic(bootstrap, "payments", partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="payments-tx")
    await producer.start()
    committed: list[int] = []
    try:
        for commit in (True, False, True, None):  # None: left open
            await producer.begin_transaction()
            futures = [await producer.send("payments", key=f"k{i % 9}".encode(), value=b"v")
                       for i in range(200)]  # fmt: skip
            offsets = [(await f).offset for f in futures]
            if commit:
                await producer.commit_transaction()
                committed += offsets
            elif commit is False:
                await producer.abort_transaction()
            # batch 3 stays open while Spark reads
        register(spark)
        df = (
            spark.read.format("keyshard")
            .option("bootstrap_servers", bootstrap)
            .option("topics", "payments")
            .option("ranges", "3")
            .load()
        )
        assert sorted(r.offset for r in df.collect()) == committed
    finally:
        await producer.stop()  # aborts the open transaction
