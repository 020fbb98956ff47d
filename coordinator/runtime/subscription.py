"""What a Register subscribes to: topics by name, or every topic a pattern matches, with
their partition counts as the cluster has them now, reconciled with what the group knows.

A Register counts its topics' partitions itself (a topic created since the last refresh
must be seen), so it can be the first to see a topic grow: the growth then goes through
`coordinator.group.growth` before the member joins, exactly as if the watcher had seen it.
A Register never makes the group lose partitions: removing them is the watcher's call,
after it saw them gone twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from keyshard.coordinator.group import growth
from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.partition_counts import CoalescedPartitionCounts


def matching(pattern: str, counts: Mapping[str, int]) -> dict[str, int]:
    """The topics whose whole name matches `pattern`, internal ones (`__` first, as
    Kafka's `exclude.internal.topics`) left out."""
    compiled = re.compile(pattern)
    return {
        topic: count
        for topic, count in counts.items()
        if not topic.startswith("__") and compiled.fullmatch(topic)
    }


class Subscriptions:
    def __init__(self, named: CoalescedPartitionCounts, every: CoalescedPartitionCounts) -> None:
        self._named = named  # the counts of the topics a Register names
        self._every = every  # the counts of every topic, for a pattern

    async def counts(
        self, topics: tuple[str, ...], pattern: str | None
    ) -> tuple[dict[str, int], list[str]]:
        """(topic -> partitions, topics named that do not exist). A pattern that matches
        nothing yet is no error: the group reads what it will match (as Kafka's
        consumers do)."""
        if pattern is not None:
            return matching(pattern, await self._every.get(())), []
        counts = await self._named.get(topics)
        return counts, [t for t in topics if t not in counts]


def same_subscription(state: GroupState, topics: tuple[str, ...], pattern: str | None) -> bool:
    if pattern is not None or state.topic_pattern is not None:
        return pattern == state.topic_pattern
    return set(topics) == set(state.topics)


def grown_before_join(
    state: GroupState,
    counts: Mapping[str, int],
    topics: tuple[str, ...],
    pattern: str | None,
    *,
    now: float,
    wall_ms: int,
    window_ms: int,
) -> tuple[dict[str, int], Result]:
    """The counts the joining member registers with, and what the group must do first.

    A group that reads these topics already keeps every partition it knows and gains what
    the Register counted beyond them (a growth, with its transition and extensions); any
    other group (new, or empty and about to change its topics) takes the Register's
    counts as they are."""
    if not state.partitions or not same_subscription(state, topics, pattern):
        return dict(counts), Result()
    known = growth.counts_of(state.partitions)
    merged = {t: max(counts.get(t, 0), known.get(t, 0)) for t in set(counts) | set(known)}
    return merged, growth.partitions_changed(
        state, merged, now=now, wall_ms=wall_ms, window_ms=window_ms
    )
