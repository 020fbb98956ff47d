"""The memory budget (`_datapath.budget`): record bytes held by kind, and what it lets in.

The property: whatever the order of fetches, dispatches and handler completions, the
records a consumer holds (waiting + in flight + replay windows) exceed the budget by at
most one record, the windows hold only what the others leave, and every byte counted in
is counted out again once the records are done.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition as KafkaTP
from aiokafka.structs import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import wait_for
from keyshard.consumer_client._datapath import budget as budget_module
from keyshard.consumer_client._datapath import fastpath
from keyshard.consumer_client._datapath.budget import BufferBudget, record_size, take
from keyshard.consumer_client._datapath.lanes import Suspended
from keyshard.core.kafka.fetch_sizes import MIN_BUFFER_BYTES
from keyshard.core.model.hashing import slot_for_key
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.consumer_client import parts

TOPIC = "t"


def rec(
    offset: int,
    size: int,
    *,
    partition: int = 0,
    key: bytes | None = b"k",
    headers: list[tuple[str, bytes | None]] | None = None,
) -> ConsumerRecord[bytes, bytes]:
    key_size = -1 if key is None else len(key)  # as aiokafka records them
    return ConsumerRecord(
        TOPIC, partition, offset, 0, 0, key, b"v" * size, None, key_size, size, headers or []
    )


# ---- what a record weighs, what a batch takes ------------------------------------------


def test_a_record_weighs_its_key_value_and_headers() -> None:
    assert record_size(rec(0, 100)) == 101
    assert record_size(rec(0, 0, key=None)) == 0
    assert record_size(rec(0, 10, headers=[("ordering-key", b"abc"), ("none", None)])) == (
        1 + 10 + len("ordering-key") + 3 + len("none")
    )


def deserialized(offset: int) -> ConsumerRecord[bytes, Any]:
    """What aiokafka hands out with a value_deserializer: the sizes are the wire's."""
    return ConsumerRecord(TOPIC, 0, offset, 0, 0, b"k", {"n": offset}, None, 1, 50, [])


def test_a_deserialized_value_weighs_what_it_weighed_on_the_wire() -> None:
    assert record_size(deserialized(0)) == 1 + 50
    assert record_size(Slotted(b"key", b"value", ())) == 8  # made elsewhere: its data


@pytest.mark.skipif(fastpath.NATIVE is None, reason="the C fast path is not built")
def test_the_c_take_counts_as_the_python_one() -> None:
    records: list[Any] = [
        rec(0, 10),
        rec(1, 0, key=None),
        rec(2, 5, headers=[("h", b"xyz"), ("g", None)]),
        rec(3, 3000),
        rec(4, 7),
        deserialized(5),
    ]
    records += [Slotted(b"key", b"value", ()), Slotted(None, b"v", (("h", b"1"),))]
    assert fastpath.NATIVE is not None
    for room in (-5, 0, 1, 11, 12, 40, 3040, 3060, 3100, 10**9):
        assert fastpath.NATIVE.take(records, room) == budget_module.take(records, room)


@dataclass(frozen=True, slots=True)
class Slotted:
    """A record with no instance dict: the C take reads it by attribute."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def test_a_batch_is_taken_up_to_the_record_that_uses_the_room_up() -> None:
    records = [rec(o, 99) for o in range(5)]  # 100 bytes each
    assert take(records, 250) == (3, 300, 100)  # the third passes 250: the last one taken
    assert take(records, 200) == (2, 200, 100)
    assert take(records, 1) == (1, 100, 100)  # at least one record while there is room
    assert take(records, 0) == (0, 0, 0)
    assert take(records, 10_000) == (5, 500, 100)


def test_fetching_pauses_when_the_budget_is_used_up_until_an_eighth_is_free() -> None:
    budget = BufferBudget(800)
    budget.waiting = 799
    assert budget.may_fetch()
    budget.in_flight = 1
    assert not budget.may_fetch() and budget.pauses == 1
    budget.waiting = 750  # 751 used: less than an eighth free
    assert not budget.may_fetch()
    budget.waiting = 699  # 700 used: an eighth free
    assert budget.may_fetch() and budget.pauses == 1


def test_the_next_batch_is_sized_by_the_room_and_the_last_largest_record() -> None:
    budget = BufferBudget(10_000)
    assert budget.batch(2000) == 2000  # nothing known yet
    budget.largest, budget.waiting = 1000, 6500
    assert budget.batch(2000) == 3
    budget.waiting = 9999
    assert budget.batch(2000) == 1


# ---- the whole data path under a budget ------------------------------------------------


class Log:
    """An aiokafka stand-in the test feeds by hand: it remembers where each partition is
    sought to (the fetcher puts back what the budget does not take)."""

    def __init__(self) -> None:
        self.positions: dict[int, int] = {}

    def assignment(self) -> set[KafkaTP]:
        return {KafkaTP(TOPIC, p) for p in self.positions}

    def assign(self, tps: Any) -> None:
        for tp in tps:
            self.positions.setdefault(tp.partition, 0)

    def seek(self, tp: KafkaTP, offset: int) -> None:
        self.positions[tp.partition] = offset

    def resume(self, *tps: Any) -> None: ...

    def pause(self, *tps: Any) -> None: ...

    async def position(self, tp: KafkaTP) -> int:
        return self.positions[tp.partition]


LIMIT = 10_000
PARTITIONS = 3
# Every partition shared: part of the slots is elsewhere, so the windows hold records.
OWNED = SlotRange(0, 49_999)

fetch_op = st.tuples(
    st.just("fetch"),
    st.integers(0, PARTITIONS - 1),
    st.lists(st.integers(0, 4_000) | st.integers(LIMIT, LIMIT + 3_000), min_size=1, max_size=8),
)
complete_op = st.tuples(st.just("complete"), st.integers(0, 10**6), st.just(list[int]()))


@settings(max_examples=60, deadline=None)
@given(st.lists(fetch_op | complete_op, min_size=1, max_size=40))
def test_the_budget_holds_whatever_the_order_of_fetches_and_completions(
    ops: list[tuple[str, int, list[int]]],
) -> None:
    asyncio.run(_run_ops(ops))


async def _run_ops(ops: list[tuple[str, int, list[int]]]) -> None:
    gates: dict[int, asyncio.Future[None]] = {}
    sizes: dict[tuple[int, int], int] = {}
    completed = 0

    async def handler(record: Any) -> None:
        nonlocal completed
        gate = gates.setdefault(id(record), asyncio.get_running_loop().create_future())
        await gate
        completed += 1

    log = Log()
    consumer = parts.build(handler, log, max_buffer_bytes=LIMIT, max_concurrency=4)
    fetcher, budget = consumer.fetcher, consumer.fetcher.budget
    positions = {(TOPIC, p): [(OWNED, Position(0))] for p in range(PARTITIONS)}
    consumer.hooks.start_fetcher(RangeSet([OWNED]), positions)
    workers: list[asyncio.Task[None]] = []
    largest_taken = 0

    def dispatch_all() -> None:
        while fetcher.backlog:
            suspended = fetcher.dispatch(fetcher.backlog)
            if isinstance(suspended, Suspended):
                workers.append(asyncio.create_task(consumer.lanes.adopt(suspended)))

    async def settle(done_before: int) -> None:
        for _ in range(1000):  # turns of the loop, not time: the handler's awaits
            if completed > done_before:
                return
            await asyncio.sleep(0)
        raise AssertionError("a released handler did not complete")

    def check() -> None:
        held = budget.waiting + budget.in_flight + budget.window
        assert held <= LIMIT + largest_taken, (budget, largest_taken)
        assert budget.window <= max(0, LIMIT - budget.waiting - budget.in_flight)
        assert budget.window == sum(w.bytes for _, w in fetcher.windows.items())

    try:
        for op, n, batch in ops:
            if op == "fetch":
                if not budget.may_fetch():
                    continue
                start = log.positions[n]
                records = [
                    rec(start + i, size, partition=n, key=f"k{(start + i) % 5}".encode())
                    for i, size in enumerate(batch)
                ]
                for r in records:
                    sizes[(n, r.offset)] = record_size(r)
                log.positions[n] = start + len(records)
                generations = {tp: p.generation for tp, p in consumer.progress.partitions.items()}
                fetcher.queue_fetched({KafkaTP(TOPIC, n): records}, generations, parts.SESSION)
                taken = fetcher.fetched_upto.get((TOPIC, n), 0)
                largest_taken = max([largest_taken] + [sizes[(n, o)] for o in range(start, taken)])
                assert log.positions[n] == max(taken, start)  # the rest was put back
                dispatch_all()
            else:
                waiting = [g for g in gates.values() if not g.done()]
                if waiting:
                    before = completed
                    waiting[n % len(waiting)].set_result(None)
                    await settle(before)
            check()
        for _ in range(1000):  # drain: every byte counted in is counted out
            if not consumer.progress.pending_count():
                break
            for gate in gates.values():  # those of records queued behind their key too
                if not gate.done():
                    gate.set_result(None)
            await asyncio.sleep(0)
        assert budget.in_flight == 0 and budget.waiting == 0
        check()
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


# ---- the fetch loop: it pauses while the budget is used up, and resumes ----------------


class FiniteLog(Log):
    """One partition of `records`; `getmany` hands out what is left from the position."""

    def __init__(self, records: list[Any]) -> None:
        super().__init__()
        self.records = records
        self.positions[0] = 0
        self.calls = 0

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[Any, list[Any]]:
        self.calls += 1
        at = self.positions[0]
        batch = self.records[at : at + max(1, max_records)]
        if not batch:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        self.positions[0] = at + len(batch)
        return {KafkaTP(TOPIC, 0): batch}


async def test_the_fetch_loop_stops_at_the_budget_and_resumes_as_handlers_complete() -> None:
    """Handlers that hold every record: the fetcher stops once the budget is used up (by
    at most one record past it), and goes on as they are let go; every record is
    processed once, each key in offset order."""
    size, budget_bytes = 1_000, 64 * 1024
    records = [rec(o, size - 2, key=f"k{o % 40}".encode()) for o in range(400)]
    release = asyncio.Event()
    done: list[tuple[bytes, int]] = []

    async def handler(record: Any) -> None:
        await release.wait()
        done.append((record.key, record.offset))

    log = FiniteLog(records)
    consumer = parts.build(
        handler, log, max_buffer_bytes=budget_bytes, max_concurrency=400, max_pending=10_000
    )
    budget = consumer.fetcher.budget
    full = RangeSet.full()
    consumer.hooks.start_fetcher(full, {(TOPIC, 0): [(SlotRange(0, 65535), Position(0))]})
    consumer.fetcher.start()
    try:
        await _until(lambda: budget.paused, "the fetcher to pause for the budget")
        assert budget.pauses == 1
        assert budget_bytes <= budget.used() <= budget_bytes + size
        assert log.positions[0] == budget.used() // size < len(records)  # the rest: not taken
        release.set()
        await _until(lambda: len(done) == len(records), "every record to be processed")
        assert sorted(done) == sorted((r.key, r.offset) for r in records)  # each once
        by_key: dict[bytes, list[int]] = {}
        for key, offset in done:
            by_key.setdefault(key, []).append(offset)
        assert all(offsets == sorted(offsets) for offsets in by_key.values())
        await _until(lambda: budget.used() == 0, "the budget to be free again")
        assert consumer.fetcher.failed is not None and not consumer.fetcher.failed.done()
    finally:
        await parts.stop_fetching(consumer, release)


async def _until(condition: Any, what: str) -> None:
    await wait_for(condition, 5, what, interval=0.001)


# ---- replays under the budget ----------------------------------------------------------


def test_replays_of_several_partitions_each_get_every_record_they_need() -> None:
    """One StartFetcher can replay several partitions. The replays count as waiting, so
    the windows give way to them, but only once every replay took its records: a window
    emptied for an earlier replay must not shorten a later one (records skipped = lost)."""
    log = Log()
    consumer = parts.build(kafka=log, max_buffer_bytes=MIN_BUFFER_BYTES)
    lower, upper = SlotRange(0, 32767), SlotRange(32768, 65535)
    tps = [(TOPIC, p) for p in range(3)]
    consumer.hooks.start_fetcher(RangeSet([lower]), {tp: [(lower, Position(0))] for tp in tps})
    held = {0: 2, 1: 2, 2: 3}  # records of 6 KB: windows of 12, 12 and 18 KB in a 64 KiB budget
    keys = [k for k in (f"k{i}".encode() for i in range(100)) if slot_for_key(k) in upper]
    for p, n in held.items():  # records of the upper half: skipped, and held for a handover
        records = [rec(o, 6000, partition=p, key=keys[o]) for o in range(n)]
        generations = {tp: g.generation for tp, g in consumer.progress.partitions.items()}
        consumer.fetcher.queue_fetched({KafkaTP(TOPIC, p): records}, generations, parts.SESSION)
        assert consumer.fetcher.dispatch(consumer.fetcher.backlog) is None
    assert all(consumer.fetcher.windows[tp].start == 0 for tp in tps)
    consumer.hooks.start_fetcher(RangeSet([upper]), {tp: [(upper, Position(0))] for tp in tps})
    replayed = {c.tp: [r.offset for r in c.records] for c in consumer.fetcher.backlog}
    assert replayed == {(TOPIC, p): list(range(n)) for p, n in held.items()}
