"""The `keyshard` Spark data source (Spark 4 Python Data Source API).

    register(spark)
    spark.read.format("keyshard").option("bootstrap_servers", "host:port")
        .option("topics", "t1,t2").option("ranges", "8").load()

Rows have Spark's Kafka source columns plus `slot`:
`key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
slot int`. The slot is the one the coordinator and the consumer client use
(`keyshard.core.model.hashing.slot_for_record`): the `ordering-key` header (option
`ordering_header`) wins over the record key; a record with neither is spread by offset
(`offset % 65536`) — it has no order to keep, exactly as the consumer client treats it.

Batch read: every record from the earliest offset (or `starting_positions`, the JSON of
Spark's Kafka `startingOffsets`) up to the fetch high watermark at planning time, one Spark
partition per (topic-partition x slot range), `ranges` equal slices of the slot space
(default: Spark's default parallelism, fixed by `register`). `timeout_ms` (15000): how long
planning may wait for Kafka; `stall_timeout_ms` (30000): a task whose read gets no record
for this long fails. The names in seconds, `timeout_s` and `stall_timeout_s`, are taken
for one release, with a warning.

Streaming read: the query is a coordinated consumer; see `spark_jobs.stream`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from keyshard.spark_jobs.kafka_io import read_watermarks
from keyshard.spark_jobs.planning import (
    equal_ranges,
    parse_int,
    parse_ms,
    parse_starting_positions,
    parse_topics,
    plan_batch,
    resolve_start,
)
from keyshard.spark_jobs.reading import ReadSettings, SlicePartition, arrow_batches, spark_schema
from keyshard.spark_jobs.stream import KeyshardStreamReader

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

FORMAT = "keyshard"


class BatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], default_ranges: int) -> None:
        self.settings = ReadSettings(options)
        self.topics = parse_topics(options)
        self.ranges = equal_ranges(parse_int(options, "ranges", default_ranges, 1, 65536))
        self.starting = parse_starting_positions(options.get("starting_positions"), self.topics)
        self.timeout = parse_ms(options, "timeout_ms", 15_000) / 1000  # seconds, for asyncio

    def partitions(self) -> list[InputPartition]:
        watermarks = asyncio.run(read_watermarks(self.settings.kafka, self.topics, self.timeout))
        bounds = resolve_start(watermarks, self.starting)
        return [SlicePartition(piece) for piece in plan_batch(bounds, self.ranges)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):
            return iter(())  # Spark's stand-in partition when nothing was planned
        return arrow_batches(partition.piece, self.settings)


class KeyshardDataSource(DataSource):
    default_ranges = 1  # `register` sets Spark's default parallelism here (also capacity)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.options, self.default_ranges)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KeyshardStreamReader(self.options, self.default_ranges)


def register(spark: SparkSession) -> None:
    """Register the `keyshard` format on `spark`.

    The data source runs in Python workers that cannot see the SparkContext, so the default
    number of slot ranges (the session's default parallelism) is baked into a subclass
    here; cloudpickle ships that subclass by value.
    """
    parallelism = max(1, spark.sparkContext.defaultParallelism)
    source: Any = type("KeyshardDataSource", (KeyshardDataSource,), {"default_ranges": parallelism})
    spark.dataSource.register(source)
