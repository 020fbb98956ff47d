"""Kafka I/O of the `keyshard` source: watermarks on the driver, slice reads on executors.

Both sides use plain aiokafka with manual assignment (no consumer group: Spark's offsets
and the coordinator's positions are the truth, never a Kafka group commit).

The high watermark comes from a fetch response, not from `end_offsets()`: ListOffsets
"latest" under-reports on some brokers (Tansu, after batched produces), which
would silently cut a batch read short. `end_offsets()` is only a cheap lower bound to seek
to, so the probing fetch carries little data.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import KafkaError

from keyshard.core.kafka.connect import (
    KafkaUnreachable,
    quiet_bootstrap,
    start_client,
    unreachable,
)
from keyshard.core.kafka.ends import fetched_ends
from keyshard.core.kafka.fetch_sizes import DEFAULT_MAX_BUFFER_BYTES, fetch_sizes
from keyshard.core.kafka.metadata import TopicMetadataError, partitions_of
from keyshard.core.kafka.no_topic_creation import never_create_topics
from keyshard.core.kafka.settings import KafkaConfigError, KafkaSettings
from keyshard.core.model.hashing import ORDERING_KEY_HEADER, slot_for_record
from keyshard.core.model.positions import TopicPartition
from keyshard.spark_jobs.planning import ReadSlice, SourceError

Watermarks = dict[TopicPartition, tuple[int, int]]


@dataclass(frozen=True)
class SparkKafka:
    """The cluster and its client settings, from a read's options: `bootstrap_servers`
    (or `kafka.bootstrap.servers`) and every `kafka.`-prefixed option as a Kafka setting
    in Kafka's own name (`kafka.security.protocol`, `kafka.sasl.mechanism`, ...), the way
    Spark's own Kafka source takes them. Plain strings, so it pickles to executors; each
    side builds (and checks) the aiokafka settings from them."""

    bootstrap_servers: str
    properties: dict[str, str]

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SparkKafka:
        properties = {k[len(KAFKA_PREFIX) :]: str(v) for k, v in options.items()
                      if k.startswith(KAFKA_PREFIX)}  # fmt: skip
        given = str(options.get("bootstrap_servers") or "").strip() or None
        if given is None and not properties.get("bootstrap.servers"):
            raise SourceError("option 'bootstrap_servers' is required")
        try:
            bootstrap = cls("", properties).settings().with_bootstrap(given)
        except KafkaConfigError as err:
            raise SourceError(f"Kafka options: {err}") from None
        return cls(bootstrap, properties)

    def as_options(self) -> dict[str, str]:
        """The same as reader options again (a job handing its Kafka on to a read)."""
        return {"bootstrap_servers": self.bootstrap_servers,
                **{KAFKA_PREFIX + k: v for k, v in self.properties.items()}}  # fmt: skip

    def settings(self) -> KafkaSettings:
        try:
            return _parsed(tuple(sorted(self.properties.items())))
        except KafkaConfigError as err:
            raise SourceError(f"Kafka options: {err}") from None


KAFKA_PREFIX = "kafka."
#: The most a slice reader asks per partition fetch (a budget of 64 MiB and up).
_READ_FETCH_BYTES = 4 * 1024 * 1024


@functools.lru_cache(maxsize=16)
def _parsed(properties: tuple[tuple[str, str], ...]) -> KafkaSettings:
    """One TLS context per distinct settings per process, not one per slice."""
    return KafkaSettings.parse(dict(properties))


def make_consumer(kafka: SparkKafka, **extra: Any) -> AIOKafkaConsumer:
    """An aiokafka consumer with `extra` options, unless the user's Kafka settings set
    them (fetch sizes: `kafka.fetch.max.bytes` wins over what a budget derives)."""
    options = {
        "enable_auto_commit": False,
        "auto_offset_reset": "none",  # a read below the log start is an error, not a jump
        "fetch_max_wait_ms": 50,
        **extra,
        **kafka.settings().consumer_options(),
    }
    return never_create_topics(
        AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, **options)
    )


async def start_consumer(consumer: AIOKafkaConsumer, kafka: SparkKafka, timeout: float) -> None:
    try:
        await start_client(
            consumer, kafka.bootstrap_servers, kafka.settings(), "keyshard source", timeout
        )
    except KafkaUnreachable as err:
        raise SourceError(str(err)) from None


async def topic_partitions(
    kafka: SparkKafka, topics: Sequence[str], timeout: float
) -> list[TopicPartition]:
    """Every partition of `topics`, from a fresh metadata answer (keyshard.core.kafka.metadata);
    an unknown topic is an error (never auto-created), and so is one showing no partitions."""
    bootstrap, settings = kafka.bootstrap_servers, kafka.settings()
    try:
        with quiet_bootstrap():
            answer = await partitions_of(bootstrap, topics, timeout, **settings.client_options())
        found = answer.require(repr(bootstrap))
    except (KafkaError, OSError, TimeoutError) as err:
        explained = await unreachable(err, bootstrap, settings, "keyshard source", timeout)
        raise SourceError(str(explained)) from err
    except TopicMetadataError as err:
        raise SourceError(str(err)) from err
    return [(topic, p) for topic in topics for p in found[topic]]


async def probe_high_watermarks(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], seek_to: dict[KafkaTP, int],
    timeout: float, *, stable: bool = False,
) -> dict[TopicPartition, int]:  # fmt: skip
    """`keyshard.core.kafka.ends.fetched_ends`, a late answer being a SourceError: a read
    planned up to an end nobody confirmed would wait or stop short."""
    try:
        return await fetched_ends(consumer, tps, seek_to, timeout, stable=stable)
    except TimeoutError as err:
        raise SourceError(str(err)) from None


async def read_watermarks(
    kafka: SparkKafka, topics: Sequence[str], timeout: float = 15.0
) -> Watermarks:
    """(low, high) offsets of every partition of `topics`: high is the fetch high watermark,
    or the last stable offset when reading committed data (the default)."""
    tps = await topic_partitions(kafka, topics, timeout)
    consumer = make_consumer(kafka)
    await start_consumer(consumer, kafka, timeout)
    stable = kafka.settings().isolation_level == "read_committed"
    try:
        ktps = [KafkaTP(*tp) for tp in tps]
        low = await asyncio.wait_for(consumer.beginning_offsets(ktps), timeout)
        end = await asyncio.wait_for(consumer.end_offsets(ktps), timeout)
        high = await probe_high_watermarks(consumer, tps, end, timeout, stable=stable)
        return {tp: (int(low[KafkaTP(*tp)]), max(high[tp], int(end[KafkaTP(*tp)]))) for tp in tps}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer.stop(), timeout)


# ---- executor side --------------------------------------------------------------------


def read_slice(
    piece: ReadSlice,
    kafka: SparkKafka,
    *,
    ordering_header: str = ORDERING_KEY_HEADER,
    batch_rows: int = 8192,
    stall_timeout: float = 30.0,
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of `piece` in offset order, in lists of up to `batch_rows`.

    A plain generator driving an async one on a private event loop, so Spark pulls rows as
    it writes them and a slice never has to fit in memory. Rows: (key, value, topic,
    partition, offset, timestamp_ms, slot). `max_buffer_bytes` bounds the record bytes
    held: a list is handed over once its keys and values reach a quarter of it (Arrow
    copies it once more, and aiokafka's fetch sizes take a quarter and a sixteenth).
    """
    if piece.is_empty:
        return
    loop = asyncio.new_event_loop()
    rows = aread_slice(piece, kafka, ordering_header, batch_rows, stall_timeout, max_buffer_bytes)
    try:
        while True:
            try:
                yield loop.run_until_complete(rows.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(rows.aclose())
        loop.close()


async def aread_slice(
    piece: ReadSlice,
    kafka: SparkKafka,
    ordering_header: str,
    batch_rows: int,
    stall_timeout: float,
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
) -> AsyncGenerator[list[tuple[Any, ...]], None]:
    sizes = fetch_sizes(max_buffer_bytes)
    consumer = make_consumer(
        kafka,
        fetch_max_bytes=sizes["fetch_max_bytes"],
        max_partition_fetch_bytes=min(_READ_FETCH_BYTES, 4 * sizes["max_partition_fetch_bytes"]),
    )
    batch_bytes = max_buffer_bytes // 4
    await start_consumer(consumer, kafka, stall_timeout)
    try:
        ktp = KafkaTP(piece.topic, piece.partition)
        consumer.assign([ktp])
        consumer.seek(ktp, piece.from_offset)
        wants = piece.slot_filter().wants
        topic, partition, until = piece.topic, piece.partition, piece.until
        position = piece.from_offset
        last_progress = time.monotonic()
        rows: list[tuple[Any, ...]] = []
        held = 0  # bytes of the rows' keys and values
        while position < until:
            batch = await consumer.getmany(ktp, timeout_ms=200)
            for r in batch.get(ktp, []):
                if r.offset >= until:
                    break
                slot, _ = slot_for_record(r.key, r.headers, r.offset, ordering_header)
                if wants(slot, r.offset):
                    rows.append((r.key, r.value, topic, partition, r.offset, r.timestamp, slot))
                    held += len(r.key or b"") + len(r.value or b"")
            # Transaction markers and compaction leave gaps: trust the fetch position.
            fetched_to = await consumer.position(ktp)
            if fetched_to > position:
                position = fetched_to
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout:
                raise SourceError(
                    f"{topic}/{partition}: stuck at offset {position} below {until} "
                    f"for {stall_timeout} s (records deleted or broker unreachable?)"
                )
            if len(rows) >= batch_rows or held >= batch_bytes or (rows and position >= until):
                yield rows
                rows, held = [], 0
        if rows:
            yield rows
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer.stop(), 10)
