"""The `keyshard` Spark data source (Spark 4 Python Data Source API).

    register(spark)
    spark.read.format("keyshard").option("bootstrap_servers", "host:port")
        .option("topics", "t1,t2").option("ranges", "8").load()

Rows have Spark's Kafka source columns plus `slot`:
`key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
slot int`. The slot is the one the coordinator and the consumer client use
(`coordinator.hashing.slot_for_record`): the `ordering-key` header (option
`ordering_header`) wins over the record key; a record with neither is spread by offset
(`offset % 65536`) — it has no order to keep, exactly as the consumer client treats it.

Batch read: every record from the earliest offset (or `starting_positions`, the JSON of
Spark's Kafka `startingOffsets`) up to the fetch high watermark at planning time, one Spark
partition per (topic-partition x slot range), `ranges` equal slices of the slot space
(default: Spark's default parallelism, fixed by `register`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from coordinator.hashing import ORDERING_KEY_HEADER
from spark_jobs.kafka_io import read_slice, read_watermarks
from spark_jobs.planning import (
    ReadSlice,
    equal_ranges,
    parse_int,
    parse_starting_positions,
    parse_topics,
    plan_batch,
    require,
    resolve_start,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

FORMAT = "keyshard"


class SlicePartition(InputPartition):
    """A Spark partition: one `ReadSlice` (picklable, shipped to the executor)."""

    def __init__(self, piece: ReadSlice) -> None:
        super().__init__(piece)
        self.piece = piece


class ReadSettings:
    """What every executor needs besides its slice."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap_servers = require(options, "bootstrap_servers")
        self.ordering_header = options.get("ordering_header", ORDERING_KEY_HEADER)
        self.batch_rows = parse_int(options, "batch_rows", 8192, 1)
        self.stall_timeout = float(parse_int(options, "stall_timeout_s", 30, 1))


def arrow_batches(piece: ReadSlice, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Rows as Arrow batches in the exact schema Spark expects (no per-row conversion)."""
    import pyarrow as pa

    schema = arrow_schema()
    for rows in read_slice(
        piece,
        settings.bootstrap_servers,
        ordering_header=settings.ordering_header,
        batch_rows=settings.batch_rows,
        stall_timeout=settings.stall_timeout,
    ):
        keys, values, topics, parts, offsets, stamps, slots = zip(*rows, strict=True)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array(topics, pa.string()),
                pa.array(parts, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array([ms * 1000 for ms in stamps], schema.field("timestamp").type),
                pa.array(slots, pa.int32()),
            ],
            schema=schema,
        )


def spark_schema() -> StructType:
    """`SCHEMA_DDL` as a StructType, built without a session (executors have none)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("slot", IntegerType()),
        ]
    )


def arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(), timezone="UTC")


class BatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], default_ranges: int) -> None:
        self.settings = ReadSettings(options)
        self.topics = parse_topics(options)
        self.ranges = equal_ranges(parse_int(options, "ranges", default_ranges, 1, 65536))
        self.starting = parse_starting_positions(options.get("starting_positions"), self.topics)
        self.timeout = float(parse_int(options, "timeout_s", 15, 1))

    def partitions(self) -> list[InputPartition]:
        watermarks = asyncio.run(
            read_watermarks(self.settings.bootstrap_servers, self.topics, self.timeout)
        )
        bounds = resolve_start(watermarks, self.starting)
        return [SlicePartition(piece) for piece in plan_batch(bounds, self.ranges)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        return arrow_batches(partition.piece, self.settings)


class KeyshardDataSource(DataSource):
    default_ranges = 1  # `register` sets Spark's default parallelism here

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.options, self.default_ranges)


def register(spark: SparkSession) -> None:
    """Register the `keyshard` format on `spark`.

    The data source runs in Python workers that cannot see the SparkContext, so the default
    number of slot ranges (the session's default parallelism) is baked into a subclass
    here; cloudpickle ships that subclass by value.
    """
    parallelism = max(1, spark.sparkContext.defaultParallelism)
    source: Any = type("KeyshardDataSource", (KeyshardDataSource,), {"default_ranges": parallelism})
    spark.dataSource.register(source)
