"""Partition counts for Register, fetched once for many concurrent registrations (of the
topics they name, or of every topic for those that subscribe by pattern)."""

from __future__ import annotations

import asyncio
import contextlib

from keyshard.coordinator.storage.base import ClusterMetadata


class CoalescedPartitionCounts:
    """Partition counts for Register, one metadata request for many concurrent callers.

    A caller never gets an answer fetched before it asked (topics created after start-up
    must be seen), but callers arriving while a fetch is in flight share the next one:
    a thousand consumers registering at once cost two metadata round trips, not a
    thousand.
    """

    def __init__(self, metadata: ClusterMetadata, *, every_topic: bool = False) -> None:
        self.metadata = metadata
        # Every topic on the cluster, whatever the callers name (a pattern's Register).
        self.every_topic = every_topic
        self._running: asyncio.Task[dict[str, int]] | None = None
        self._next: asyncio.Task[dict[str, int]] | None = None
        self._next_topics: set[str] = set()

    async def get(self, topics: tuple[str, ...]) -> dict[str, int]:
        if self._next is None:
            self._next_topics = set()
            self._next = asyncio.create_task(self._fetch_after(self._running))
        self._next_topics.update(topics)
        counts = await asyncio.shield(self._next)
        if self.every_topic:
            return dict(counts)
        return {t: counts[t] for t in topics if t in counts}

    async def _fetch_after(self, previous: asyncio.Task[dict[str, int]] | None) -> dict[str, int]:
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        await asyncio.sleep(0)  # let the callers of this loop turn add their topics
        self._running, self._next = self._next, None
        if self.every_topic:
            return await self.metadata.topic_counts()
        return await self.metadata.partition_counts(tuple(sorted(self._next_topics)))
