"""What executors do for both reads: a `ReadSlice` in, Arrow batches in Spark's schema out."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from keyshard.core.kafka.fetch_sizes import DEFAULT_MAX_BUFFER_BYTES, MIN_BUFFER_BYTES
from keyshard.core.model.hashing import ORDERING_KEY_HEADER
from keyshard.spark_jobs.kafka_io import SparkKafka, read_slice
from keyshard.spark_jobs.planning import ReadSlice, parse_int, parse_ms

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


class SlicePartition(InputPartition):
    """A Spark partition: one `ReadSlice` (picklable, shipped to the executor)."""

    def __init__(self, piece: ReadSlice) -> None:
        super().__init__(piece)
        self.piece = piece


class ReadSettings:
    """What every executor needs besides its slice."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.kafka = SparkKafka.from_options(options)
        self.ordering_header = options.get("ordering_header", ORDERING_KEY_HEADER)
        self.batch_rows = parse_int(options, "batch_rows", 8192, 1)
        # Seconds, as asyncio takes them.
        self.stall_timeout = parse_ms(options, "stall_timeout_ms", 30_000) / 1000
        # Record bytes an executor's reader holds at most (see `read_slice`).
        self.max_buffer_bytes = parse_int(
            options, "max_buffer_bytes", DEFAULT_MAX_BUFFER_BYTES, MIN_BUFFER_BYTES
        )


def arrow_batches(piece: ReadSlice, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Rows as Arrow batches in the exact schema Spark expects (no per-row conversion)."""
    import pyarrow as pa

    schema = arrow_schema()
    for rows in read_slice(
        piece,
        settings.kafka,
        ordering_header=settings.ordering_header,
        batch_rows=settings.batch_rows,
        stall_timeout=settings.stall_timeout,
        max_buffer_bytes=settings.max_buffer_bytes,
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
    """The source's columns: Kafka's own source's (so a query can swap `kafka` for
    `keyshard`) plus `slot`; built without a session (executors have none)."""
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
