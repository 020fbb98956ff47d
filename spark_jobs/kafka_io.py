"""Kafka I/O of the `keyshard` source: watermarks on the driver, slice reads on executors.

Both sides use plain aiokafka with manual assignment (no consumer group: Spark's offsets
and the coordinator's positions are the truth, never a Kafka group commit).

The high watermark comes from a fetch response, not from `end_offsets()`: ListOffsets
"latest" under-reports on some brokers (Tansu, after batched produces; DESIGN.md §3), which
would silently cut a batch read short. `end_offsets()` is only a cheap lower bound to seek
to, so the probing fetch carries little data.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import KafkaError

from coordinator.kafka.metadata import TopicMetadataError, partitions_of
from coordinator.model.hashing import ORDERING_KEY_HEADER, slot_for_record
from coordinator.model.positions import TopicPartition
from spark_jobs.planning import ReadSlice, SourceError

Watermarks = dict[TopicPartition, tuple[int, int]]


def make_consumer(bootstrap_servers: str, **extra: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="none",  # a read below the log start is an error, not a jump
        fetch_max_wait_ms=50,
        **extra,
    )


async def start_consumer(
    consumer: AIOKafkaConsumer, bootstrap_servers: str, timeout: float
) -> None:
    try:
        await asyncio.wait_for(consumer.start(), timeout)
    except (KafkaError, OSError, TimeoutError) as err:
        with contextlib.suppress(Exception):
            await consumer.stop()
        raise SourceError(f"cannot reach Kafka at {bootstrap_servers!r}: {err!r}") from err


async def topic_partitions(
    bootstrap_servers: str, topics: Sequence[str], timeout: float
) -> list[TopicPartition]:
    """Every partition of `topics`, from a fresh metadata answer (coordinator.kafka.metadata);
    an unknown topic is an error (never auto-created), and so is one showing no partitions."""
    try:
        answer = await partitions_of(bootstrap_servers, topics, timeout)
        found = answer.require(repr(bootstrap_servers))
    except (KafkaError, OSError, TimeoutError) as err:
        raise SourceError(f"cannot reach Kafka at {bootstrap_servers!r}: {err!r}") from err
    except TopicMetadataError as err:
        raise SourceError(str(err)) from err
    return [(topic, p) for topic in topics for p in found[topic]]


async def probe_high_watermarks(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], seek_to: dict[KafkaTP, int],
    timeout: float,
) -> dict[TopicPartition, int]:  # fmt: skip
    """Fetch once per partition (from `seek_to`) and read the high watermark of the answer."""
    ktps = [KafkaTP(*tp) for tp in tps]
    consumer.assign(ktps)
    for ktp in ktps:
        consumer.seek(ktp, seek_to[ktp])
    since = int(time.time() * 1000) - 1
    deadline = time.monotonic() + timeout
    while True:
        await consumer.getmany(*ktps, timeout_ms=50, max_records=1)
        fresh = [
            ktp
            for ktp in ktps
            if consumer.highwater(ktp) is not None
            and (consumer.last_poll_timestamp(ktp) or 0) >= since
        ]
        if len(fresh) == len(ktps):
            return {(k.topic, k.partition): int(consumer.highwater(k)) for k in ktps}
        if time.monotonic() > deadline:
            late = sorted(set(ktps) - set(fresh))
            raise SourceError(f"no fetch answer within {timeout} s for {late}")


async def read_watermarks(
    bootstrap_servers: str, topics: Sequence[str], timeout: float = 15.0
) -> Watermarks:
    """(low, high) offsets of every partition of `topics`, high = the fetch high watermark."""
    tps = await topic_partitions(bootstrap_servers, topics, timeout)
    consumer = make_consumer(bootstrap_servers)
    await start_consumer(consumer, bootstrap_servers, timeout)
    try:
        ktps = [KafkaTP(*tp) for tp in tps]
        low = await asyncio.wait_for(consumer.beginning_offsets(ktps), timeout)
        end = await asyncio.wait_for(consumer.end_offsets(ktps), timeout)
        high = await probe_high_watermarks(consumer, tps, end, timeout)
        return {tp: (int(low[KafkaTP(*tp)]), max(high[tp], int(end[KafkaTP(*tp)]))) for tp in tps}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer.stop(), timeout)


# ---- executor side --------------------------------------------------------------------


def read_slice(
    piece: ReadSlice,
    bootstrap_servers: str,
    *,
    ordering_header: str = ORDERING_KEY_HEADER,
    batch_rows: int = 8192,
    stall_timeout: float = 30.0,
) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of `piece` in offset order, in lists of up to `batch_rows`.

    A plain generator driving an async one on a private event loop, so Spark pulls rows as
    it writes them and a slice never has to fit in memory. Rows: (key, value, topic,
    partition, offset, timestamp_ms, slot).
    """
    if piece.is_empty:
        return
    loop = asyncio.new_event_loop()
    rows = aread_slice(piece, bootstrap_servers, ordering_header, batch_rows, stall_timeout)
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
    bootstrap_servers: str,
    ordering_header: str,
    batch_rows: int,
    stall_timeout: float,
) -> AsyncGenerator[list[tuple[Any, ...]], None]:
    consumer = make_consumer(bootstrap_servers, max_partition_fetch_bytes=4 * 1024 * 1024)
    await start_consumer(consumer, bootstrap_servers, stall_timeout)
    try:
        ktp = KafkaTP(piece.topic, piece.partition)
        consumer.assign([ktp])
        consumer.seek(ktp, piece.from_offset)
        wants = piece.slot_filter().wants
        topic, partition, until = piece.topic, piece.partition, piece.until
        position = piece.from_offset
        last_progress = time.monotonic()
        rows: list[tuple[Any, ...]] = []
        while position < until:
            batch = await consumer.getmany(ktp, timeout_ms=200)
            for r in batch.get(ktp, []):
                if r.offset >= until:
                    break
                slot, _ = slot_for_record(r.key, r.headers, r.offset, ordering_header)
                if wants(slot, r.offset):
                    rows.append((r.key, r.value, topic, partition, r.offset, r.timestamp, slot))
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
            if len(rows) >= batch_rows or (rows and position >= until):
                yield rows
                rows = []
        if rows:
            yield rows
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer.stop(), 10)
