"""Batch reads of the `keyshard` source against a real broker."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from coordinator.broker import EmbeddedBroker
from coordinator.hashing import slot_for_key
from spark_jobs.source import register
from tests.integration.harness import create_topic, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


async def test_batch_read_returns_exactly_what_was_produced(
    spark: SparkSession, broker: EmbeddedBroker
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topic(bootstrap, "orders", partitions=2)
    await create_topic(bootstrap, "clicks", partitions=1)
    produced = await produce(bootstrap, 1200, 40, topic="orders")
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
