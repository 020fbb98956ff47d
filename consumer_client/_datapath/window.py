"""The records a consumer fetched recently, per partition, kept for replaying grants.

Every consumer of a partition reads all of it and skips the slots it does not own, so when
it is granted a range whose previous owner stopped a little behind this consumer's fetch
position, the records the new range needs have usually passed through this consumer
already. Keeping the last few thousand of them lets it dispatch the granted range's
backlog from memory instead of seeking the partition back: no refetch, so the slots it
already owned never wait behind a re-read, and the granted range starts at once.

Pure: records only need an `offset`; the window is contiguous in fetch order from `start`
(everything the fetcher returned from `start` on is in it, up to its newest record).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from typing import Any


class ReplayWindow:
    __slots__ = ("chunks", "count", "limit", "start")

    def __init__(self, start: int, limit: int) -> None:
        self.start = start  # every fetched record at or above this offset is held
        self.limit = limit
        self.chunks: deque[Sequence[Any]] = deque()
        self.count = 0

    def reset(self, start: int) -> None:
        """The fetch position moved (a seek): what is held no longer joins up with it."""
        self.start = start
        self.chunks.clear()
        self.count = 0

    def append(self, records: Sequence[Any]) -> None:
        """The next records the fetcher returned, in order. Whole chunks are dropped from
        the front while the rest still holds at least `limit` records."""
        if not records:
            return
        self.chunks.append(records)
        self.count += len(records)
        while self.count - len(self.chunks[0]) >= self.limit and len(self.chunks) > 1:
            dropped = self.chunks.popleft()
            self.count -= len(dropped)
            # Offsets between the dropped chunk and the next one do not exist as records
            # (transaction markers, compaction), so nothing is missing above this.
            self.start = dropped[-1].offset + 1
        if self.limit == 0:
            self.reset(records[-1].offset + 1)

    def between(self, low: int, high: int) -> list[Any]:
        """The held records with low <= offset < high, in order."""
        out: list[Any] = []
        for chunk in self.chunks:
            if not chunk or chunk[-1].offset < low:
                continue
            if chunk[0].offset >= high:
                break
            first = _first_at_or_above(chunk, low)
            last = _first_at_or_above(chunk, high)
            out.extend(chunk[first:last])
        return out


def _first_at_or_above(chunk: Sequence[Any], offset: int) -> int:
    return bisect_left(chunk, offset, key=lambda record: record.offset)
