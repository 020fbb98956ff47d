"""Partition ends for the Registers of a new group that starts at them, read once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from keyshard.coordinator.group import starting
from keyshard.coordinator.group.state import GroupConfig, GroupState
from keyshard.coordinator.storage.base import ClusterMetadata
from keyshard.core.model.positions import TopicPartition

Ends = dict[TopicPartition, int]


class PartitionEndsUnknown(Exception):
    """Kafka did not say where the partitions end: the Register is to be tried again."""


class SharedPartitionEnds:
    """One read of the partitions' ends per new group at a time, shared by the Registers
    that arrive while it runs: a group's first consumers usually start together, and a
    thousand of them must not cost a thousand reads (`starting.start_positions` keeps
    only the first answer anyway)."""

    def __init__(self, metadata: ClusterMetadata) -> None:
        self.metadata = metadata
        self._reading: dict[str, asyncio.Task[Ends]] = {}

    async def if_new(
        self, group: str, config: GroupConfig, state: GroupState | None,
        partitions: Sequence[TopicPartition],
    ) -> Ends | None:  # fmt: skip
        """The partitions' ends if the group (None: not created yet) is new and starts at
        them, else None. Read before the group exists, so its first grant starts there."""
        if not starting.needs_partition_ends(config, state):
            return None
        task = self._reading.get(group)
        if task is None:
            task = asyncio.create_task(self.metadata.partition_ends(partitions))
            self._reading[group] = task
            task.add_done_callback(lambda done: self._done(group, done))
        try:
            return await asyncio.shield(task)
        except Exception as err:
            raise PartitionEndsUnknown(
                f"group {group!r} starts at the partitions' ends (auto_offset_reset latest), "
                f"which Kafka did not tell: {err or type(err).__name__}; try again"
            ) from err

    def _done(self, group: str, task: asyncio.Task[Ends]) -> None:
        if self._reading.get(group) is task:
            del self._reading[group]
        if not task.cancelled():
            task.exception()  # retrieved: its waiters may all have gone


def describe(ends: Mapping[TopicPartition, int]) -> str:
    return ", ".join(
        f"{topic}/{partition}@{offset}" for (topic, partition), offset in sorted(ends.items())
    )
