"""Group commit: the writes waiting for a state partition share its next transaction."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyshard.coordinator.storage.base import Fenced
from keyshard.coordinator.storage.group_commit import GroupCommit, Record, next_batch


def records(name: str, n: int = 1) -> list[Record]:
    return [(f"{name}/{i}".encode(), b"v") for i in range(n)]


class GatedLog:
    """Transactions that wait for the test to let them through, one at a time."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, list[Record]]] = []
        self.started = asyncio.Queue[int]()
        self.gate = asyncio.Queue[BaseException | None]()

    async def write_batch(self, partition: int, epoch: int, batch: list[Record]) -> None:
        self.started.put_nowait(len(batch))
        outcome = await self.gate.get()
        if outcome is not None:
            raise outcome
        self.written.append((partition, epoch, batch))


async def started(log: GatedLog) -> int:
    return await asyncio.wait_for(log.started.get(), 5)


async def test_writes_arriving_during_a_transaction_share_the_next_one() -> None:
    log = GatedLog()
    commits = GroupCommit(log.write_batch)
    carried: list[int] = []
    commits.committed = carried.append
    first = asyncio.create_task(commits.write(0, 1, records("a")))
    assert await started(log) == 1
    waiting = [asyncio.create_task(commits.write(0, 1, records(g, 2))) for g in "bcd"]
    other_partition = asyncio.create_task(commits.write(1, 1, records("x")))
    assert await started(log) == 1, "another partition is not held up by this one"
    await asyncio.sleep(0)
    assert not any(t.done() for t in waiting), "nothing released before it is durable"
    log.gate.put_nowait(None)
    await asyncio.wait_for(first, 5)
    assert await started(log) == 6, "the three waiting writes in one transaction"
    assert not any(t.done() for t in waiting)
    log.gate.put_nowait(None)
    log.gate.put_nowait(None)
    await asyncio.wait_for(asyncio.gather(*waiting, other_partition), 5)
    assert [(p, len(b)) for p, _, b in log.written] == [(0, 1), (1, 1), (0, 6)]
    assert log.written[2][2] == records("b", 2) + records("c", 2) + records("d", 2), (
        "in the order they were made"
    )
    assert (len(carried), sum(carried)) == (3, 5)


async def test_a_failed_transaction_fails_its_writes_only() -> None:
    log = GatedLog()
    commits = GroupCommit(log.write_batch)
    first = asyncio.create_task(commits.write(0, 1, records("a")))
    await started(log)
    failing = [asyncio.create_task(commits.write(0, 1, records(g))) for g in "bc"]
    log.gate.put_nowait(None)
    await first
    await started(log)
    later = asyncio.create_task(commits.write(0, 1, records("d")))
    log.gate.put_nowait(Fenced("state partition 0: another replica took it over"))
    for task in failing:
        with pytest.raises(Fenced):
            await asyncio.wait_for(task, 5)
    assert await started(log) == 1
    log.gate.put_nowait(None)
    await asyncio.wait_for(later, 5)
    assert [b for _, _, b in log.written] == [records("a"), records("d")]


async def test_a_batch_never_mixes_epochs() -> None:
    log = GatedLog()
    commits = GroupCommit(log.write_batch)
    first = asyncio.create_task(commits.write(0, 1, records("a")))
    await started(log)
    rest = [
        asyncio.create_task(commits.write(0, epoch, records(name)))
        for epoch, name in ((1, "b"), (2, "c"), (2, "d"))
    ]
    for _ in range(3):
        log.gate.put_nowait(None)
    await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    assert [(epoch, len(b)) for _, epoch, b in log.written] == [(1, 1), (1, 1), (2, 2)]


async def test_a_cancelled_caller_does_not_take_its_records_out_of_a_transaction() -> None:
    log = GatedLog()
    commits = GroupCommit(log.write_batch)
    first = asyncio.create_task(commits.write(0, 1, records("a")))
    await started(log)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    log.gate.put_nowait(None)
    second = asyncio.create_task(commits.write(0, 1, records("b")))
    await started(log)
    log.gate.put_nowait(None)
    await asyncio.wait_for(second, 5)
    assert [b for _, _, b in log.written] == [records("a"), records("b")]


async def test_stopping_cancels_what_is_in_flight_and_waiting() -> None:
    log = GatedLog()
    commits = GroupCommit(log.write_batch)
    first = asyncio.create_task(commits.write(0, 1, records("a")))
    await started(log)
    waiting = asyncio.create_task(commits.write(0, 1, records("b")))
    await asyncio.sleep(0)
    await commits.stop()
    for task in (first, waiting):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
    assert log.written == []


pending_writes = st.lists(
    st.tuples(st.integers(1, 3), st.integers(1, 5)), min_size=1, max_size=30
).map(sorted)  # epochs only grow on a partition


@given(pending_writes, st.integers(1, 12))
def test_batches_keep_order_one_epoch_and_the_size_bound(
    shape: list[tuple[int, int]], max_records: int
) -> None:
    pending = [(epoch, records(f"w{i}", n)) for i, (epoch, n) in enumerate(shape)]
    written: list[Record] = []
    while pending:
        batch = next_batch(pending, max_records)
        taken, pending = pending[: batch.count], pending[batch.count :]
        assert batch.count >= 1
        assert {epoch for epoch, _ in taken} == {batch.epoch}
        assert batch.count == 1 or len(batch.records) <= max_records
        assert batch.records == [r for _, rs in taken for r in rs]
        written += batch.records
    assert written == [r for i, (_, n) in enumerate(shape) for r in records(f"w{i}", n)]
