"""The streaming `keyshard` source as a coordinated consumer: real broker, real coordinator
daemon, local[2] Spark, a Parquet sink written idempotently per batch id."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.dataset as ds
import pytest

from harness import CoordinatorProcess, create_topic, produce, wait_for
from harness.brokers import Broker
from keyshard.consumer_client import CoordinatedConsumer
from keyshard.local.verify import Produced
from keyshard.spark_jobs.source import register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

pytestmark = [pytest.mark.integration, pytest.mark.brokers("tansu", "kafka")]

GROUP = "spark-stream"
TOPIC = "stream.events"


def start_query(
    spark: SparkSession,
    broker: Broker,
    coord: CoordinatorProcess,
    out: Path,
    ckpt: Path,
    topic: str = TOPIC,
) -> StreamingQuery:
    from pyspark.sql import functions as F

    def write(batch: DataFrame, batch_id: int) -> None:
        # Idempotent per batch id: a re-run batch overwrites its own directory. `task` and
        # `seq` (row order inside a task) let the test check per-key order per task.
        (
            batch.withColumn("task", F.spark_partition_id())
            .withColumn("seq", F.monotonically_increasing_id())
            .select("key", "partition", "offset", "slot", "task", "seq")
            .write.mode("overwrite")
            .parquet(str(out / f"batch={batch_id}"))
        )

    register(spark)
    stream = (
        spark.readStream.format("keyshard")
        .option("group", GROUP)
        .option("topics", topic)
        .option("coordinator", coord.address)
        .option("bootstrap_servers", broker.bootstrap_servers)
        .option("session_timeout_ms", "5000")
        .load()
    )
    return (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="300 milliseconds")
        .start()
    )


def sink_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of every batch Spark has finished committing.

    Spark writes a batch under `_temporary/` and moves the files into place while the test
    polls, and a re-run batch deletes its directory before writing it again. So only
    batches with a `_SUCCESS` marker are read, and a file that vanishes between listing and
    reading makes the read start over (the test polls this until its condition holds)."""
    for _ in range(5):
        files = [
            str(part)
            for batch in sorted(out.glob("batch=*"))
            if (batch / "_SUCCESS").exists()
            for part in sorted(batch.glob("*.parquet"))
        ]
        if not files:
            return []
        try:
            table = ds.dataset(
                files, format="parquet", partitioning="hive", partition_base_dir=str(out)
            ).to_table()
        except FileNotFoundError:
            continue
        return table.to_pylist()  # type: ignore[no-any-return]
    raise AssertionError(f"the sink under {out} kept changing while it was read")


async def wait_until_written(
    out: Path, produced: list[Produced], query: StreamingQuery
) -> list[dict[str, Any]]:
    want = {(p.partition, p.offset) for p in produced}

    def probe() -> list[dict[str, Any]] | None:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        rows = sink_rows(out)
        return rows if {(r["partition"], r["offset"]) for r in rows} >= want else None

    result = await wait_for(probe, 60, f"{len(want)} records in the sink", interval=0.3)
    assert result is not None
    return result


def assert_exactly_once_and_ordered(rows: list[dict[str, Any]], produced: list[Produced]) -> None:
    got = [(r["partition"], r["offset"]) for r in rows]
    dupes = [k for k, n in collections.Counter(got).items() if n > 1]
    assert not dupes, f"{len(dupes)} records written twice, e.g. {dupes[:5]}"
    assert sorted(got) == sorted((p.partition, p.offset) for p in produced)
    assert {r["key"].decode() for r in rows} == {p.key for p in produced}
    by_task: dict[tuple[int, int, bytes], list[tuple[int, int]]] = collections.defaultdict(list)
    for r in rows:
        by_task[(r["batch"], r["task"], r["key"])].append((r["seq"], r["offset"]))
    for (batch, task, key), seen in by_task.items():
        offsets = [offset for _, offset in sorted(seen)]
        assert offsets == sorted(offsets), f"key {key!r} out of order in batch {batch} task {task}"


async def committed_low_watermarks(coord: CoordinatorProcess) -> dict[int, int]:
    view = await coord.group(GROUP)
    if view is None:
        return {}
    return {p["partition"]: p["low_watermark"] for p in view["partitions"] if p["topic"] == TOPIC}


async def test_stream_is_exactly_once_across_batches_and_a_restart(
    spark: SparkSession, broker: Broker, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    out, ckpt = tmp_path / "sink", tmp_path / "checkpoint"
    await create_topic(bootstrap, TOPIC, partitions=2)
    produced = await produce(bootstrap, 300, 25, topic=TOPIC)
    query = start_query(spark, broker, coordinator, out, ckpt)
    try:
        await wait_until_written(out, produced, query)
        # Data produced mid-stream lands in later micro-batches.
        for start in (300, 500):
            produced += await produce(bootstrap, 200, 25, topic=TOPIC, start=start)
            await wait_until_written(out, produced, query)
        view = await coordinator.group(GROUP)
        assert view is not None and len(view["members"]) == 1
        assert view["members"][0]["capacity"] == spark.sparkContext.defaultParallelism
        # Positions reach the coordinator: every partition's low watermark is its end.
        ends = collections.Counter(p.partition for p in produced)

        async def caught_up() -> bool:
            return await committed_low_watermarks(coordinator) == dict(ends)

        await wait_for(caught_up, 20, "positions committed to the coordinator", interval=0.2)
    finally:
        query.stop()
    rows = sink_rows(out)
    assert len({r["batch"] for r in rows}) >= 3, "expected at least 3 micro-batches with data"
    assert_exactly_once_and_ordered(rows, produced)

    # Restart from the checkpoint, with records produced while the query was down.
    produced += await produce(bootstrap, 250, 25, topic=TOPIC, start=700)
    query = start_query(spark, broker, coordinator, out, ckpt)
    try:
        await wait_until_written(out, produced, query)
        produced += await produce(bootstrap, 100, 25, topic=TOPIC, start=950)
        rows = await wait_until_written(out, produced, query)
    finally:
        query.stop()
    assert_exactly_once_and_ordered(sink_rows(out), produced)


async def test_a_joining_consumer_takes_ranges_from_the_query_without_loss_or_duplicates(
    spark: SparkSession, broker: Broker, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    """A plain consumer joins the query's group mid-stream: the coordinator moves ranges
    from the query (StopFetcher, answered after the covering batch commits) to it.
    Together they process every record once, and a key that moved was processed by the
    consumer only after the query had written all its earlier records."""
    bootstrap, topic = broker.bootstrap_servers, "handoff.events"
    out = tmp_path / "sink"
    await create_topic(bootstrap, topic, partitions=1)
    produced = await produce(bootstrap, 300, 40, topic=topic)
    query = start_query(spark, broker, coordinator, out, tmp_path / "ckpt", topic=topic)
    handled: list[tuple[int, int, str]] = []

    async def handle(record: Any) -> None:
        handled.append((record.partition, record.offset, record.key.decode()))

    joiner = CoordinatedConsumer(
        group=GROUP,
        topics=[topic],
        coordinator=coordinator.address,
        bootstrap_servers=bootstrap,
        name="joiner",
        session_timeout_ms=5000,
    )
    running = None
    try:
        await wait_until_written(out, produced, query)
        running = asyncio.create_task(joiner.run(handle))
        produced += await produce(bootstrap, 600, 40, topic=topic, start=300, rate=300)

        async def all_processed() -> bool:
            done = {(r["partition"], r["offset"]) for r in sink_rows(out)}
            done |= {(p, o) for p, o, _ in handled}
            return done >= {(p.partition, p.offset) for p in produced}

        await wait_for(all_processed, 60, "every record in the sink or at the consumer")
        view = await coordinator.group(GROUP)
        assert view is not None and len(view["members"]) == 2, view
    finally:
        await joiner.close()
        if running is not None:
            await asyncio.gather(running, return_exceptions=True)
        query.stop()
    rows = sink_rows(out)
    assert handled, "the joining consumer got no ranges"
    spark_side = [(r["partition"], r["offset"]) for r in rows]
    consumer_side = [(p, o) for p, o, _ in handled]
    both = collections.Counter(spark_side + consumer_side)
    assert [k for k, n in both.items() if n > 1] == [], "graceful handoff must not duplicate"
    assert set(both) == {(p.partition, p.offset) for p in produced}
    last_by_query: dict[str, int] = {}
    for r in rows:
        key = r["key"].decode()
        last_by_query[key] = max(last_by_query.get(key, -1), r["offset"])
    for _, offset, key in handled:
        assert offset > last_by_query.get(key, -1), f"{key}@{offset} ran before the query's"
