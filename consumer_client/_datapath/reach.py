"""Whether this consumer can read Kafka: per partition, when a fetch last succeeded.

aiokafka retries a broker it cannot reach inside its own fetch routine ("Unable connect
to node", `RequestTimedOutError` in its log) and tells `getmany` nothing: a partition
whose leader is cut off from this process just yields no records, as an idle one does.
What tells them apart is the partition's poll timestamp (aiokafka's
`last_poll_timestamp`), which every fetch response without an error sets, with records
or without: while it changes, Kafka answers; while it stands still, it does not.

Only partitions the consumer asks Kafka for count: a paused one, or every one while
fetching is held back (`max_pending` reached, records waiting to be dispatched: aiokafka
fetches no partition it still holds records of), is not failing, and its clock starts
again when it is asked for again. Pure: time comes in as `now` (monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from keyshard.core.model.positions import TopicPartition


@dataclass(frozen=True, slots=True)
class _Seen:
    polled: int | None  # the partition's poll timestamp as last seen (None: never polled)
    since: float  # the last sign of a fetch that succeeded, or when it was first asked for


class FetchReach:
    """The partitions being fetched and, for each, since when no fetch has succeeded."""

    def __init__(self) -> None:
        self._seen: dict[TopicPartition, _Seen] = {}

    def observe(self, polled: Mapping[TopicPartition, int | None], now: float) -> None:
        """The poll timestamps of the partitions asked for now (none while fetching is
        held back): a changed one is a fetch that succeeded; a partition asked for anew
        starts its clock; one no longer asked for is forgotten."""
        seen: dict[TopicPartition, _Seen] = {}
        for tp, stamp in polled.items():
            old = self._seen.get(tp)
            seen[tp] = old if old is not None and old.polled == stamp else _Seen(stamp, now)
        self._seen = seen

    def failing_for(self, now: float) -> float | None:
        """How long no partition asked for has been fetched (the shortest of their
        silences): a member that cannot read any of them cannot make progress. None: no
        partition is asked for."""
        if not self._seen:
            return None
        return min(now - seen.since for seen in self._seen.values())

    def silences(self, now: float) -> dict[TopicPartition, float]:
        """Per partition asked for: seconds since a fetch of it last succeeded."""
        return {tp: now - seen.since for tp, seen in self._seen.items()}
