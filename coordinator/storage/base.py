"""What the runtime needs from durable storage and from the cluster, as protocols.

`StateLog` is the durable home of every group: a log of P partitions (a group lives in
`partition_of(group)`), written by the partition's owner under its coordinator epoch and
tailed by every replica. `ClusterMetadata` answers what Register needs (partition
counts, and partition ends for a new group that starts at them), what the partition
watcher needs (every topic's count, partition ends for lag), what readiness needs
(is Kafka reachable), and commits each group's lowest position as a Kafka offset for
tooling. The Kafka implementations are `coordinator.storage.kafka_log` and
`coordinator.storage.kafka_cluster`; tests use in-memory ones, which these protocols let
mypy check like the real thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from keyshard.core.model.hashing import positive_hash
from keyshard.core.model.positions import RangePositionMap, TopicPartition

DEFAULT_STATE_TOPIC = "__keyshard_state"
#: Partitions of a state topic the coordinator creates: the most replicas that can share
#: the groups (an existing topic keeps its own count).
DEFAULT_STATE_PARTITIONS = 6
Positions = dict[TopicPartition, RangePositionMap]


class StoreError(RuntimeError):
    pass


class Fenced(StoreError):
    """Another replica took the partition over: this one may no longer write it."""


def partition_of(group: str, partitions: int) -> int:
    """The state partition a group lives in (murmur3 of its name, as slots are): its
    records, and so its coordinator, follow it."""
    return positive_hash(group.encode()) % partitions


class StateLog(Protocol):
    async def write(
        self, partition: int, epoch: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> None:
        """Store `records` in `partition` as its owner at `epoch`; when this returns they
        survive a coordinator crash. Raises `Fenced` (a StoreError) when another replica
        has taken the partition over."""
        ...


class ClusterMetadata(Protocol):
    async def partition_counts(self, topics: tuple[str, ...]) -> dict[str, int]:
        """Partition count of every topic that exists (missing topics are left out), as
        of now: topics created after start-up must be seen."""
        ...

    async def topic_counts(self) -> dict[str, int]:
        """Partition count of every topic on the cluster (internal ones included), from
        one metadata request made now: what a group's topics and pattern are checked
        against while it runs (coordinator.runtime.partition_watch)."""
        ...

    async def partition_ends(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Where each partition ends for a reader of committed data, right now: where a
        group that starts at the end (`OffsetReset.LATEST`) starts."""
        ...

    async def high_watermarks(
        self, partitions: Sequence[TopicPartition], needed: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Where each partition ends for any reader (its high watermark), right now: what
        no position a member reports can pass. `needed`: the offsets reports name; where
        a cheap answer already reaches them, it is enough (it can only under-report)."""
        ...

    async def earliest_offsets(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Where each partition starts (its log start offset), right now."""
        ...

    async def offsets_for_times(
        self, partitions: Sequence[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """Each partition's first offset whose record is at or after `timestamp_ms`
        (Kafka's offsets_for_times), None where no record is that late."""
        ...

    async def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The Kafka offsets committed under `group` (None: none), as Kafka tools see
        them: this coordinator's low watermarks, or a Kafka consumer group's own."""
        ...

    async def probe(self) -> None:
        """One round trip to the cluster: raises when Kafka is unreachable."""
        ...

    async def commit_low_watermarks(self, group: str, positions: Positions) -> None:
        """Best effort: each partition's lowest position as a plain Kafka offset, so lag
        tooling sees the group; never the source of truth."""
        ...
