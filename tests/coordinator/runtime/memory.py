"""A state log and a cluster in memory, for runtime tests that need no broker.

`MemoryLog` is both the runtime's `StateLog` and its `ClusterMetadata`; what it is given
to write lands in one `PartitionImage` per partition, so a test can read back what a
replica taking the groups over would find. `serving_runtime` makes a runtime that owns
every partition (at epoch 1), as a lone replica does after its claims.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.log_format import decode
from keyshard.core.model.positions import TopicPartition


class MemoryLog:
    def __init__(self, partitions: int = 1, topic_partitions: int = 1) -> None:
        self.images = {p: PartitionImage(p) for p in range(partitions)}
        self.topic_partitions = topic_partitions
        self.released = asyncio.Event()  # writes wait for it (set: they don't)
        self.released.set()
        self.writes = 0
        self.reachable = True  # drives the readiness probe
        self.on_write: Callable[[], None] | None = None
        self.ends: dict[TopicPartition, int] = {}  # where partitions end (default 0)
        self.ends_asked = 0
        # High watermarks: where no reported position may pass (default: wherever
        # reports say, as for a partition that always holds what its members read).
        self.high: dict[TopicPartition, int] = {}
        self.high_asked: list[dict[TopicPartition, int]] = []
        # Topics on the "cluster" -> partitions: those named at a Register appear with
        # `topic_partitions`; a test grows, adds or deletes topics here.
        self.counts: dict[str, int] = {}
        # What a reset of positions asks (default: every partition starts at 0, holds no
        # record at any time asked, and has no committed Kafka offset).
        self.starts: dict[TopicPartition, int] = {}
        self.at_times: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}

    def admit(self, partition: int, epoch: int) -> None:
        """Whether a write let through lands: a subclass refuses one (e.g. fenced)."""

    async def write(
        self, partition: int, epoch: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> None:
        if self.on_write is not None:
            self.on_write()
        await self.released.wait()
        self.admit(partition, epoch)
        image = self.images[partition]
        for key, value in records:
            image.apply(image.next_offset, decode(key, value))
        self.writes += 1

    async def partition_counts(self, topics: tuple[str, ...]) -> dict[str, int]:
        for topic in topics:
            self.counts.setdefault(topic, self.topic_partitions)
        return {topic: self.counts[topic] for topic in topics}

    async def topic_counts(self) -> dict[str, int]:
        return dict(self.counts)

    async def partition_ends(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        self.ends_asked += 1
        return {tp: self.ends.get(tp, 0) for tp in partitions}

    async def high_watermarks(
        self, partitions: Sequence[TopicPartition], needed: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        self.high_asked.append(dict(needed))
        return {tp: self.high.get(tp, needed.get(tp, 0)) for tp in partitions}

    async def earliest_offsets(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        return {tp: self.starts.get(tp, 0) for tp in partitions}

    async def offsets_for_times(
        self, partitions: Sequence[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        return {tp: self.at_times.get(tp) for tp in partitions}

    async def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        return {tp: self.committed.get(tp) for tp in partitions}

    async def commit_low_watermarks(self, group: str, positions: Any) -> None: ...

    async def probe(self) -> None:
        if not self.reachable:
            raise ConnectionError("no broker")


def serving_runtime(
    config: RuntimeConfig, log: MemoryLog | None = None, **kwargs: Any
) -> CoordinatorRuntime:
    """A runtime that serves every group: it owns every partition of `log`, at epoch 1."""
    log = log or MemoryLog()
    runtime = CoordinatorRuntime(config, log, metadata=log, partitions=len(log.images), **kwargs)
    for partition, image in log.images.items():
        runtime.adopt_partition(partition, 1, image)
    return runtime
