"""Group commit: the writes waiting for one state partition go to Kafka together.

A replica serves many groups per state partition, and every StartFetcher of a group waits
until its group's state is durable. Written one after another (one transaction each,
behind the partition's lock), a registration storm over 150 groups would queue each
group's write behind every other's, and the last would wait for all of them: tens of
seconds. Kafka's own
group coordinator batches instead: one append carries many groups' records. So here: the
writes that arrive while one is in flight wait together, and the next transaction
carries all of them (up to `max_records`); each caller is released when the transaction
that carries its records is committed, or gets its error.

A batch carries writes of one coordinator epoch only: a write made at an older epoch
must meet its own fencing, not be committed under the newer one, nor fail a newer one.
All or none per transaction, as before per write: a failed batch fails each of its
writes, and each writer's own retry logic (the periodic flush, the StartFetcher's wait)
sees the error it would have seen alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

Record = tuple[bytes, bytes | None]
#: Writes `records` to `partition` at `epoch` in one transaction.
WriteBatch = Callable[[int, int, list[Record]], Awaitable[None]]

#: A transaction carries at most this many records, unless one write alone has more.
MAX_BATCH_RECORDS = 10_000


@dataclass(slots=True)
class _Pending:
    epoch: int
    records: Sequence[Record]
    done: asyncio.Future[None]


@dataclass(slots=True)
class Batch:
    """Which of the pending writes the next transaction carries: the oldest, and those
    after it of the same epoch while the records fit."""

    epoch: int
    count: int  # pending writes taken, from the front of the queue
    records: list[Record] = field(default_factory=list)


def next_batch(pending: Sequence[tuple[int, Sequence[Record]]], max_records: int) -> Batch:
    """The batch to write from `pending` ((epoch, records) in arrival order, non-empty):
    in order, so a group's writes stay in the order they were made."""
    epoch, records = pending[0]
    batch = Batch(epoch, 1, list(records))
    for later_epoch, later in pending[1:]:
        if later_epoch != epoch or len(batch.records) + len(later) > max_records:
            break
        batch.records += later
        batch.count += 1
    return batch


class GroupCommit:
    """One queue and at most one transaction in flight per partition."""

    def __init__(self, write_batch: WriteBatch, max_records: int = MAX_BATCH_RECORDS) -> None:
        self._write_batch = write_batch
        self._max_records = max_records
        self._queues: dict[int, list[_Pending]] = {}
        self._writers: dict[int, asyncio.Task[None]] = {}
        # Told how many writes each committed transaction carried: the daemon counts them
        # in the activity line, where writes per transaction show group commit at work.
        self.committed: Callable[[int], None] = lambda writes: None

    async def write(self, partition: int, epoch: int, records: Sequence[Record]) -> None:
        """Durable when this returns: committed with whatever else was waiting."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Retrieved even when its caller was cancelled meanwhile: a failure then is not
        # "never retrieved" noise in the log.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queues.setdefault(partition, []).append(_Pending(epoch, records, done))
        if partition not in self._writers:
            self._writers[partition] = asyncio.create_task(
                self._drain(partition), name=f"state-commit-{partition}"
            )
        # A caller cancelled while its records are on their way does not cancel them:
        # they are in a transaction with others' by then.
        await asyncio.shield(done)

    async def _drain(self, partition: int) -> None:
        queue = self._queues[partition]
        try:
            while queue:
                batch = next_batch([(p.epoch, p.records) for p in queue], self._max_records)
                taken, queue[: batch.count] = queue[: batch.count], []
                try:
                    await self._write_batch(partition, batch.epoch, batch.records)
                except BaseException as err:
                    for pending in taken:
                        _settle(pending.done, err)
                    if not isinstance(err, Exception):
                        raise  # cancelled (the log stops): the rest are failed below
                else:
                    self.committed(len(taken))
                    for pending in taken:
                        _settle(pending.done, None)
        finally:
            del self._writers[partition]
            left = self._queues.pop(partition)
            for pending in left:
                pending.done.cancel()

    async def stop(self) -> None:
        """Cancel the transactions in flight; their writers see CancelledError."""
        writers = list(self._writers.values())
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*writers, return_exceptions=True)


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    elif isinstance(error, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(error)
