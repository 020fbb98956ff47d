"""The fetch loop gives the event loop a turn every 20 ms or so, whatever the handler does.

While aiokafka holds buffered records `getmany` returns without suspending, and a handler
that finishes inline does not suspend either: without a yield of its own the loop would
run batch after batch and the connector would never answer a Ping (a 1 ms CPU handler
would get its member fenced). No broker here: a fake client that always has a batch
buffered.

And a replay granted while the fetcher waits on `max_pending` runs at once, not at the
next ack.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from harness import wait_for
from keyshard.core.model.hashing import slot_for_key
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.consumer_client import parts

TP = ("t", 0)
GIVE_UP_AFTER = 100_000  # batches: seconds of work, far past the first 20 ms


class EndlessBuffer:
    """An aiokafka consumer with a 10-record batch always buffered."""

    def __init__(self) -> None:
        self.batches = 0

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(*TP)}

    def assign(self, tps: Any) -> None: ...

    def seek(self, tp: Any, offset: int) -> None: ...

    def resume(self, *tps: Any) -> None: ...

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[Any, list[Any]]:
        if self.batches >= GIVE_UP_AFTER:
            raise RuntimeError("the fetch loop never yielded")
        first = self.batches * 10
        self.batches += 1
        records = [
            ConsumerRecord("t", 0, o, 0, 0, f"k{o}".encode(), b"v", None, 2, 1, [])
            for o in range(first, first + 10)
        ]
        return {TopicPartition(*TP): records}


async def test_the_fetch_loop_lets_other_tasks_run() -> None:
    async def inline(_: Any) -> None:  # finishes without suspending
        return None

    kafka = EndlessBuffer()
    consumer = parts.build(inline, kafka, max_concurrency=4)
    consumer.hooks.start_fetcher(RangeSet.full(), {TP: [(SlotRange(0, 65535), Position(0))]})
    fetching = asyncio.create_task(consumer.fetcher.fetch())
    turns = 0
    while turns < 5 and not fetching.done():
        await asyncio.sleep(0)
        turns += 1
    consumer.fetcher.closing = True
    await fetching  # raises if the loop ran GIVE_UP_AFTER batches without a turn for us
    assert turns == 5
    assert consumer.stats.fetched == kafka.batches * 10
    assert consumer.stats.processed >= 10  # handlers ran inline meanwhile


def test_batches_shrink_while_a_batch_outlasts_a_turn_and_grow_back() -> None:
    """Handlers that finish inline run a whole batch in one turn: 2,000 records of 1 ms
    CPU would block Pings and StopFetchers for 2 s. Batches start small and adapt."""
    from keyshard.consumer_client._datapath.fetcher import _MAX_BATCH, _MAX_TURN_S, _MIN_BATCH

    fetcher = parts.build().fetcher
    assert fetcher._batch == _MIN_BATCH
    sizes = []
    for _ in range(12):  # quick batches: doubles up to the maximum
        fetcher._fit_batch(0.0)
        sizes.append(fetcher._batch)
    assert sizes[0] == 2 * _MIN_BATCH and sizes[-1] == _MAX_BATCH == max(sizes)
    fetcher._fit_batch(_MAX_TURN_S / 2)  # within a turn: kept
    assert fetcher._batch == _MAX_BATCH
    for _ in range(20):  # slow batches: halves down to the minimum
        fetcher._fit_batch(10 * _MAX_TURN_S)
    assert fetcher._batch == _MIN_BATCH


class FiniteLog:
    """An aiokafka consumer over a fixed list of records of one partition."""

    def __init__(self, records: list[Any]) -> None:
        self.records = records
        self.position = 0

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(*TP)}

    def assign(self, tps: Any) -> None: ...

    def seek(self, tp: Any, offset: int) -> None:
        self.position = offset

    def resume(self, *tps: Any) -> None: ...

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[Any, list[Any]]:
        batch = self.records[self.position : self.position + max(1, max_records)]
        if not batch:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        self.position += len(batch)
        return {TopicPartition(*TP): batch}


async def test_a_replay_is_dispatched_while_the_fetcher_waits_on_max_pending() -> None:
    """The consumer owns the lower half of the slots and its handlers there hang, so it
    reaches `max_pending` and stops fetching. Then it is granted the upper half from
    offset 0: those records are in its replay window, and it must run them now, not after
    the next ack (there would be none here)."""
    records = [
        ConsumerRecord("t", 0, o, 0, 0, f"k{o}".encode(), b"v", None, 2, 1, []) for o in range(5000)
    ]
    upper = {r.offset for r in records if slot_for_key(r.key) > 32767}
    hang = asyncio.Event()
    ran: list[int] = []

    async def handler(record: Any) -> None:
        if slot_for_key(record.key) <= 32767:
            await hang.wait()
        ran.append(record.offset)

    log = FiniteLog(records)
    # Room to run every key at once: only the fetcher can hold the replay back.
    consumer = parts.build(handler, log, max_pending=20, max_concurrency=len(records))
    lower, upper_half = SlotRange(0, 32767), SlotRange(32768, 65535)
    consumer.hooks.start_fetcher(RangeSet([lower]), {TP: [(lower, Position(0))]})
    consumer.fetcher.start()  # a handler that suspends inline moves the loop to a new task
    try:
        await wait_for(
            lambda: consumer.progress.pending_count() >= 20 and not consumer.fetcher.backlog,
            5,
            "the fetcher to stop at max_pending",
        )
        assert not ran
        consumer.hooks.start_fetcher(RangeSet([upper_half]), {TP: [(upper_half, Position(0))]})

        fetched = {o for o in upper if o < log.position}
        assert 0 < len(fetched) < len(upper)  # it did stop early
        await wait_for(lambda: set(ran) >= fetched, 5, "the replayed records to run")
        assert consumer.stats.replayed > 0
        assert consumer.fetcher.failed is not None and not consumer.fetcher.failed.done()
    finally:
        await parts.stop_fetching(consumer, hang)
