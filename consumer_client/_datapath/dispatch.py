"""Per-record dispatch: from fetched records to the lanes, and acknowledgements back.

For each record: the ordering key (header or record key), its slot, the fetch filter of
the grant that owns the slot (`PartitionProgress.accept`), then `KeyLanes.dispatch`,
which starts it inline when its key is idle. `dispatch_records` is the reference
implementation of that loop; the C fast path (`_datapath.fastpath`) does the same
for the common case and hands it every record it does not handle.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from keyshard.consumer_client._datapath import fastpath
from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.consumer_client._datapath.lanes import KeyLanes, Suspended, WorkItem
from keyshard.consumer_client._datapath.progress import (
    ConsumerProgress,
    PartitionProgress,
    bucket_counts,
)
from keyshard.consumer_client._datapath.stats import ConsumerStats
from keyshard.core.model.hashing import LOAD_BUCKET_SHIFT, SLOT_COUNT, ordering_key, slot_for_key

#: Makes the lanes that run the user's handler, given what to call when one completes.
LanesFactory = Callable[[Callable[[WorkItem], None]], KeyLanes]


class Dispatcher:
    def __init__(
        self,
        progress: ConsumerProgress,
        stats: ConsumerStats,
        make_lanes: LanesFactory,
        *,
        ordering_header: str,
        session: Callable[[], int],
        acked: Callable[[], None],
    ) -> None:
        self.progress = progress
        self.stats = stats
        self.ordering_header = ordering_header
        # The C fast path, or None for the Python loop only.
        self.native: ModuleType | None = fastpath.NATIVE
        # Handler completions per load bucket since the last Ping: an int64 array, not a
        # Counter (`counter[b] += 1` costs more than the fetch filter), which the C fast
        # path increments in place.
        self.load = bucket_counts()
        self._session = session  # the current registration: older work is stale
        self._acked = acked  # room for a fetcher held back by `max_pending`
        # The user's handler, per key; their completions are acknowledged here.
        self.lanes = make_lanes(self.on_done)

    def take_load(self) -> dict[int, int]:
        """Completions per load bucket since the last call (what a Ping reply reports)."""
        load, self.load = self.load, bucket_counts()
        return {bucket: n for bucket, n in enumerate(load) if n}

    def take_busy(self) -> tuple[int, int]:
        """Records completed in lanes since the last call and their handler time in
        milliseconds of the whole concurrency (`KeyLanes.take_busy`): a Ping reply's
        `busy_records` and `busy_ms`, the member's speed."""
        done, busy_s = self.lanes.take_busy()
        return done, round(busy_s * 1000)

    def dispatch_chunk(self, chunk: Chunk, progress: PartitionProgress) -> Suspended | None:
        """Dispatch the rest of `chunk`; stops at the first handler that suspends inline
        (the calling task must adopt it). Synchronous: nothing else runs meanwhile."""
        if self.native is not None and chunk.replay is None:
            return fastpath.dispatch_chunk(
                self.native, chunk, progress, self.lanes, self.ordering_header, self.load,
                self.stats, self.dispatch_records,
            )  # fmt: skip
        return self.dispatch_records(chunk, progress, len(chunk.records))

    def dispatch_records(
        self, chunk: Chunk, progress: PartitionProgress, end: int
    ) -> Suspended | None:
        """Filter and dispatch `chunk.records[chunk.next:end]`: the reference
        implementation of the per-record path."""
        dispatch, header = self.lanes.dispatch, self.ordering_header
        unkeyed = self.lanes.lane_key
        load = self.load
        accept = progress.accept if chunk.replay is None else chunk.replay.admit_replayed
        pending = progress.pending
        tp, session, records = chunk.tp, chunk.session, chunk.records
        admitted = processed = 0
        try:
            for i in range(chunk.next, end):
                record = records[i]
                offset = record.offset
                headers = record.headers
                okey = ordering_key(record.key, headers, header) if headers else record.key
                if okey is None:
                    slot = offset % SLOT_COUNT
                    if not accept(offset, slot):
                        continue
                    key: object = unkeyed(None)
                else:
                    slot = slot_for_key(okey)
                    if not accept(offset, slot):
                        continue
                    key = okey
                admitted += 1
                done = dispatch(tp, offset, slot, key, record, session)
                if done is True:
                    processed += 1
                    load[slot >> LOAD_BUCKET_SHIFT] += 1
                    continue
                pending[offset] = slot
                if done is not False:
                    chunk.next = i + 1
                    return done
        finally:
            self.stats.admitted += admitted
            self.stats.processed += processed
        return None

    def on_done(self, item: WorkItem) -> None:
        """A handler run by a lane completed: acknowledge it (unless its session ended)."""
        if item.session != self._session():
            return
        self.progress.ack(item.tp, item.offset)
        self.stats.processed += 1
        self.load[item.slot >> LOAD_BUCKET_SHIFT] += 1
        self._acked()
