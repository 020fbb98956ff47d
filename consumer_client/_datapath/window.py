"""The records a consumer fetched recently, per partition, kept for replaying grants.

Every consumer of a partition reads all of it and skips the slots it does not own, so when
it is granted a range whose previous owner stopped a little behind this consumer's fetch
position, the records the new range needs have usually passed through this consumer
already. Keeping the last few thousand of them lets it dispatch the granted range's
backlog from memory instead of seeking the partition back: no refetch, so the slots it
already owned never wait behind a re-read, and the granted range starts at once.

Pure: records only need an `offset`; the window is contiguous in fetch order from `start`
(everything the fetcher returned from `start` on is in it, up to its newest record). A
window holds at most about `limit` records, and the windows together what the consumer's
memory budget leaves them (`ReplayWindows`): they are an optimization, so they give way
first.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from keyshard.consumer_client._datapath.budget import BufferBudget
from keyshard.core.model.positions import TopicPartition


class ReplayWindow:
    __slots__ = ("bytes", "chunks", "count", "limit", "sizes", "start")

    def __init__(self, start: int, limit: int) -> None:
        self.start = start  # every fetched record at or above this offset is held
        self.limit = limit
        self.chunks: deque[Sequence[Any]] = deque()
        self.sizes: deque[int] = deque()  # each chunk's record bytes
        self.count = 0
        self.bytes = 0

    def reset(self, start: int) -> int:
        """The fetch position moved (a seek): what is held no longer joins up with it.
        Returns the bytes let go."""
        freed = self.bytes
        self.start = start
        self.chunks.clear()
        self.sizes.clear()
        self.count = self.bytes = 0
        return freed

    def append(self, records: Sequence[Any], size: int) -> int:
        """The next records the fetcher returned, in order, `size` bytes of them. Whole
        chunks are dropped from the front while the rest still holds at least `limit`
        records. Returns the change in bytes held."""
        if not records:
            return 0
        if self.limit == 0:
            return -self.reset(records[-1].offset + 1)
        self.chunks.append(records)
        self.sizes.append(size)
        self.count += len(records)
        self.bytes += size
        change = size
        while self.count - len(self.chunks[0]) >= self.limit and len(self.chunks) > 1:
            change -= self.evict_oldest()
        return change

    def evict_oldest(self) -> int:
        """Drop the oldest chunk held; returns its bytes."""
        dropped = self.chunks.popleft()
        size = self.sizes.popleft()
        self.count -= len(dropped)
        self.bytes -= size
        # Offsets between the dropped chunk and the next one do not exist as records
        # (transaction markers, compaction), so nothing is missing above this.
        self.start = dropped[-1].offset + 1
        return size

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


class ReplayWindows:
    """The replay window of each partition, their bytes counted in the memory budget.

    They hold what the budget leaves (`BufferBudget.window_room`) and give way first:
    `fit` drops the oldest chunks of the fullest windows until they fit again."""

    def __init__(self, budget: BufferBudget, limit: int) -> None:
        self.budget = budget
        self.limit = limit  # records per partition (0: no windows)
        self._windows: dict[TopicPartition, ReplayWindow] = {}

    def get(self, tp: TopicPartition) -> ReplayWindow | None:
        return self._windows.get(tp)

    def __getitem__(self, tp: TopicPartition) -> ReplayWindow:
        return self._windows[tp]

    def items(self) -> Iterator[tuple[TopicPartition, ReplayWindow]]:
        return iter(self._windows.items())

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """The fetch position of `tp` moved to `offset`: its window starts there."""
        if not self.limit:
            return
        window = self._windows.get(tp)
        if window is None:
            self._windows[tp] = ReplayWindow(offset, self.limit)
        else:
            self.budget.window -= window.reset(offset)

    def append(self, window: ReplayWindow, records: Sequence[Any], size: int) -> None:
        self.budget.window += window.append(records, size)
        self.fit()

    def reset(self, window: ReplayWindow, start: int) -> None:
        self.budget.window -= window.reset(start)

    def pop(self, tp: TopicPartition) -> None:
        window = self._windows.pop(tp, None)
        if window is not None:
            self.budget.window -= window.bytes

    def clear(self) -> None:
        self._windows.clear()
        self.budget.window = 0

    def fit(self) -> None:
        """Drop the oldest chunks of the fullest windows until they fit in the budget."""
        budget = self.budget
        room = budget.window_room()
        while budget.window > room:
            fullest = max(self._windows.values(), key=lambda window: window.bytes)
            budget.window -= fullest.evict_oldest()
