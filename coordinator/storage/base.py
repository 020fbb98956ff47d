"""What the runtime needs from durable storage and from the cluster, as protocols.

`StateStore` is the durable home of the range position maps: loaded once at start-up,
written by group commit, and the low watermark committed for tooling. `ClusterMetadata`
answers what Register needs (partition counts) and what readiness needs (is Kafka
reachable). The Kafka implementation (`coordinator.storage.kafka_store`) is both; tests
use in-memory ones, which these protocols let mypy check like the real thing.
"""

from __future__ import annotations

from typing import Protocol

from coordinator.model.hashing import positive_hash
from coordinator.model.positions import RangePositionMap, TopicPartition

DEFAULT_STATE_TOPIC = "__keyshard_state"
Positions = dict[TopicPartition, RangePositionMap]


class StoreError(RuntimeError):
    pass


def partition_of(group: str, partitions: int) -> int:
    """The state partition a group lives in (murmur3 of its name, as slots are): its
    records, and so its coordinator, follow it."""
    return positive_hash(group.encode()) % partitions


class StateStore(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def load(self) -> dict[str, Positions]:
        """Every group's stored positions (the newest record per group and partition)."""
        ...

    async def save(self, group: str, positions: Positions) -> None:
        """Store a group's positions; when this returns they survive a coordinator crash."""
        ...

    async def commit_low_watermarks(self, group: str, positions: Positions) -> None:
        """Best effort: each partition's lowest position as a plain Kafka offset, so lag
        tooling sees the group; never the source of truth."""
        ...


class ClusterMetadata(Protocol):
    async def partition_counts(self, topics: tuple[str, ...]) -> dict[str, int]:
        """Partition count of every topic that exists (missing topics are left out), as
        of now: topics created after start-up must be seen."""
        ...

    async def probe(self) -> None:
        """One round trip to the cluster: raises when Kafka is unreachable."""
        ...
