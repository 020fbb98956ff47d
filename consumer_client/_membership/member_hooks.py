"""What a member's own side does with the coordinator's requests: `MemberHooks`.

Finding the coordinator, registering and answering are the same for every kind of member
(`Membership`); what a member *does* with its ranges is not. The fetching consumer
(`CoordinatedConsumer`) and the Spark streaming source (whose "fetchers" are
micro-batches) each implement these hooks.

Every hook runs on the membership's event loop. `stop_fetcher` runs its synchronous part
(stop dispatching the ranges) when called and returns an awaitable that completes with
the final positions once the ranges are drained; the reply is sent only then.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Protocol

from keyshard.core.model.positions import PositionUpdate, TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.messages import HighWatermark


@dataclass(frozen=True, slots=True)
class Fetched:
    """Records examined in offsets [start, end) of one partition, per load bucket (owned
    or not): the demand a Ping reply reports (`FetchedWindow` on the wire)."""

    tp: TopicPartition
    start: int
    end: int
    buckets: dict[int, int]


@dataclass(frozen=True, slots=True)
class PingReport:
    """What a Ping reply tells the coordinator (docs/protocol.md §4)."""

    positions: PositionUpdate
    load: dict[int, int] = field(default_factory=dict)  # completions per load bucket
    high_watermarks: list[HighWatermark] = field(default_factory=list)
    fetched: list[Fetched] = field(default_factory=list)  # demand seen by the fetches
    # Records completed in lanes since the last reply, and their handler time (whole
    # concurrency, ms): the member's speed (docs/protocol.md §8.7).
    busy_records: int = 0
    busy_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A topic whose partition count changed lately (docs/protocol.md §9.5)."""

    topic: str
    counts: tuple[int, ...]  # the counts it went through, oldest first
    until_ms: int  # records up to this timestamp may still be written by an old count


@dataclass(frozen=True, slots=True)
class TopicsChange:
    """What a StartFetcher says of the group's topics besides its grant: the topics in
    transition, and the partitions no longer in the group (deleted, or no longer
    matching its pattern)."""

    transitions: tuple[Transition, ...] = ()
    dropped: tuple[TopicPartition, ...] = ()


class MemberHooks(Protocol):
    def ping_reply(self) -> PingReport:
        """Positions, per-bucket load and demand since the last ping, seen partition ends."""
        ...

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None: ...

    def topics_changed(self, change: TopicsChange) -> None:
        """Applied before the StartFetcher that carries it (docs/protocol.md §9.5)."""
        ...

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]: ...

    async def session_lost(self) -> None:
        """docs/protocol.md, §6.1 LOST: stop fetchers, drop queues, forget ownership."""
        ...

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        """The ranges this member runs and their exact positions: its claim."""
        ...
