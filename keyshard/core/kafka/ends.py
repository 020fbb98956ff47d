"""Where partitions end, as a fetch answer says, not as ListOffsets does.

ListOffsets "latest" (`end_offsets()`) under-reports on some brokers: Tansu, after batched
produces, answers an offset near the start of the partition (DESIGN.md §3). A fetch
answer carries the partition's high watermark and last stable offset, right on every
broker, so the end is read from one: `end_offsets()` is only the cheap lower bound the
probing fetch starts from, so that it carries little data.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from keyshard.core.model.positions import TopicPartition


async def fetched_ends(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], seek_to: Mapping[KafkaTP, int],
    timeout: float, *, stable: bool = False,
) -> dict[TopicPartition, int]:  # fmt: skip
    """Fetch once per partition (from `seek_to`) and read the high watermark of the answer,
    or with `stable` its last stable offset: reading committed data, nothing at or past
    an open transaction can be read yet. Raises TimeoutError when some partition's fetch
    has not answered within `timeout`."""

    def end(ktp: KafkaTP) -> int | None:
        offset = consumer.last_stable_offset(ktp) if stable else consumer.highwater(ktp)
        return None if offset is None else int(offset)

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
            if end(ktp) is not None and (consumer.last_poll_timestamp(ktp) or 0) >= since
        ]
        if len(fresh) == len(ktps):
            return {(k.topic, k.partition): int(end(k) or 0) for k in ktps}
        if time.monotonic() > deadline:
            late = sorted(set(ktps) - set(fresh))
            raise TimeoutError(f"no fetch answer within {timeout} s for {late}")


async def partition_ends(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition], timeout: float
) -> dict[TopicPartition, int]:
    """Where each partition ends for a reader of committed data, right now: the last
    stable offset (the high watermark where no transaction is open). `consumer` is
    started, in no group, and reads committed data (so that its ListOffsets answers a
    last stable offset too); its assignment is replaced."""
    ktps = [KafkaTP(*tp) for tp in tps]
    listed = await asyncio.wait_for(consumer.end_offsets(ktps), timeout)
    fetched = await fetched_ends(consumer, tps, listed, timeout, stable=True)
    return {tp: max(fetched[tp], int(listed[KafkaTP(*tp)])) for tp in tps}
