"""KeyLanes.dispatch: records started inline in the fetcher's turn.

A handler that finishes without suspending is done on the spot (no lane, no task); one
that suspends is adopted by the task that started it while a new "fetcher" task goes on
with the rest, as `CoordinatedConsumer` does. The `Fetcher` below is that driver, in
miniature. Conditions are awaited with a deadline, never with a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import Counter, defaultdict, deque
from typing import Any

import pytest

from keyshard.consumer_client._datapath.lanes import KeyLanes, RetryPolicy, WorkItem
from keyshard.core.model.ranges import RangeSet
from tests.consumer_client.test_lanes import TIMEOUT, eventually, settle

TP = ("t", 0)
FAST = RetryPolicy(initial_backoff_ms=1, max_backoff_ms=2, max_attempts=3)
Record = tuple[str, int]  # (key, offset)


class Fetcher:
    """Dispatches records in order; on a suspended handler a new task takes the rest and
    this task adopts the record (`Fetcher._run` in miniature)."""

    def __init__(self, lanes: KeyLanes) -> None:
        self.lanes = lanes
        self.inline: list[Record] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.backlog: deque[tuple[str, int, int]] = deque()
        self.current: asyncio.Task[None] | None = None

    def feed(self, records: list[tuple[str, int, int]]) -> None:
        """(key, offset, slot) records, dispatched by the current or a new fetcher task."""
        self.backlog.extend(records)
        if self.current is None or self.current.done():
            self._start()

    def _start(self) -> None:
        self.current = asyncio.create_task(self._run())
        self.tasks.append(self.current)

    async def _run(self) -> None:
        while self.backlog:
            key, offset, slot = self.backlog.popleft()
            done = self.lanes.dispatch(TP, offset, slot, key.encode(), (key, offset), 1)
            if done is True:
                self.inline.append((key, offset))
            elif done is not False:
                self._start()  # the rest goes on in a new task
                await self.lanes.adopt(done)
                return


class Mixed:
    """A handler whose records finish inline, yield once, or sleep a little, by plan."""

    def __init__(self, plan: dict[Record, str], **kwargs: Any) -> None:
        self.plan = plan
        self.running: Counter[str] = Counter()
        self.max_running = 0
        self.max_per_key = 0
        self.started: dict[str, list[int]] = defaultdict(list)
        self.finished: dict[str, list[int]] = defaultdict(list)
        self.done: list[WorkItem] = []
        self.lanes = KeyLanes(self.handle, on_done=self.done.append, **kwargs)
        self.fetcher = Fetcher(self.lanes)

    async def handle(self, record: Record) -> None:
        key, offset = record
        self.started[key].append(offset)
        self.running[key] += 1
        self.max_per_key = max(self.max_per_key, self.running[key])
        self.max_running = max(self.max_running, sum(self.running.values()))
        mode = self.plan[record]
        if mode == "yield":
            await asyncio.sleep(0)
        elif mode == "sleep":
            await asyncio.sleep(0.001)
        self.running[key] -= 1
        self.finished[key].append(offset)

    def all_done(self) -> list[Record]:
        return self.fetcher.inline + [item.record for item in self.done]


async def test_a_handler_that_does_not_suspend_is_done_inline_with_no_lane_or_task() -> None:
    seen: list[object] = []

    async def handler(record: object) -> None:
        seen.append(record)

    done: list[WorkItem] = []
    lanes = KeyLanes(handler, max_concurrency=2, on_done=done.append)
    before = len(asyncio.all_tasks())
    assert lanes.dispatch(TP, 0, 7, b"k", "r0", 1) is True
    assert lanes.dispatch(TP, 1, 7, b"k", "r1", 1) is True
    assert seen == ["r0", "r1"]
    assert len(asyncio.all_tasks()) == before and lanes.in_flight() == [] and done == []
    assert lanes._lanes == {} and lanes._limit.free == 2


@pytest.mark.parametrize("seed", range(6))
async def test_order_within_a_key_holds_when_handlers_sometimes_suspend(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(rng.choice([1, 3, 12]))]
    records = [(rng.choice(keys), offset, 0) for offset in range(600)]
    modes = ["inline"] * 4 + ["yield", "sleep"]
    plan = {(k, o): rng.choice(modes) for k, o, _ in records}
    h = Mixed(plan, max_concurrency=rng.choice([1, 2, 4]))
    for start in range(0, len(records), 50):  # in fetch batches, some while earlier ones run
        h.fetcher.feed(records[start : start + 50])
        if start % 100:
            await eventually(lambda n=start + 50: len(h.all_done()) == n)  # type: ignore[misc]
        else:
            await asyncio.sleep(0)
    await eventually(lambda: len(h.all_done()) == len(records))
    assert sorted(h.all_done()) == sorted((k, o) for k, o, _ in records)  # each exactly once
    for key in keys:
        in_order = [o for k, o, _ in records if k == key]
        assert h.started[key] == in_order and h.finished[key] == in_order
    assert h.max_per_key == 1
    assert h.max_running <= h.lanes._max_workers
    assert h.fetcher.inline and h.done, "both paths must have been taken"
    assert await h.lanes.wait_idle(timeout=TIMEOUT)
    assert h.lanes._lanes == {} and h.lanes._limit.free == h.lanes._max_workers


async def test_the_task_that_starts_a_handler_finishes_it() -> None:
    """`asyncio.timeout`, `TaskGroup` and `current_task()` capture the task at the first
    step: it must be the one that resumes the handler, and never the fetcher going on."""
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var", default=-1)
    seen: dict[int, tuple[object, object, int, bool]] = {}

    async def handler(record: Record) -> None:
        _, offset = record
        before = asyncio.current_task()
        var.set(offset)
        timed_out = False
        try:
            async with asyncio.timeout(0.005):
                await asyncio.Event().wait()
        except TimeoutError:
            timed_out = True
        seen[offset] = (before, asyncio.current_task(), var.get(), timed_out)

    done: list[WorkItem] = []
    lanes = KeyLanes(handler, max_concurrency=4, on_done=done.append)
    fetcher = Fetcher(lanes)
    fetcher.feed([(f"k{i}", i, 0) for i in range(8)])
    await eventually(lambda: len(done) == 8)
    for offset, (before, after, value, timed_out) in seen.items():
        assert before is after and value == offset and timed_out
    # the timeouts cancelled only their own handlers: every fetcher task ended normally
    await eventually(lambda: all(t.done() for t in fetcher.tasks))
    assert not any(t.cancelled() for t in fetcher.tasks)


async def test_a_first_step_that_raises_is_attempt_one_of_the_retry_policy() -> None:
    attempts: Counter[Record] = Counter()
    dead: list[object] = []

    async def handler(record: Record) -> None:
        attempts[record] += 1
        if record[0] == "bad":
            raise RuntimeError("no")  # before any await: fails inline

    async def dead_letter(record: object, error: BaseException) -> None:
        dead.append(record)

    done: list[WorkItem] = []
    lanes = KeyLanes(
        handler, max_concurrency=2, on_done=done.append, retry=FAST, dead_letter=dead_letter
    )
    assert lanes.dispatch(TP, 0, 0, b"bad", ("bad", 0), 1) is False
    assert lanes.dispatch(TP, 1, 0, b"bad", ("bad", 1), 1) is False  # queued behind it
    assert lanes.dispatch(TP, 2, 0, b"ok", ("ok", 2), 1) is True
    await eventually(lambda: len(done) == 2)
    assert dead == [("bad", 0), ("bad", 1)]
    assert attempts == {("bad", 0): 3, ("bad", 1): 3, ("ok", 2): 1}
    assert [item.record for item in done] == [("bad", 0), ("bad", 1)]


async def test_an_awaitable_that_is_not_a_coroutine_is_awaited_by_a_worker() -> None:
    futures: list[asyncio.Future[None]] = []

    def handler(record: object) -> asyncio.Future[None]:
        futures.append(asyncio.get_running_loop().create_future())
        return futures[-1]

    done: list[WorkItem] = []
    lanes = KeyLanes(handler, max_concurrency=2, on_done=done.append)
    assert lanes.dispatch(TP, 0, 0, b"k", "r0", 1) is False
    assert lanes.dispatch(TP, 1, 0, b"k", "r1", 1) is False
    await settle()
    assert len(futures) == 1 and [i.record for i in lanes.in_flight()] == ["r0"]
    futures[0].set_result(None)
    await eventually(lambda: len(futures) == 2)
    futures[1].set_result(None)
    await eventually(lambda: len(done) == 2)
    assert [item.record for item in done] == ["r0", "r1"]


async def test_suspended_inline_records_are_in_flight_for_stop_and_abort() -> None:
    gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
    cancelled: list[Record] = []

    async def handler(record: Record) -> None:
        try:
            await gates[record[0]].wait()
        except asyncio.CancelledError:
            cancelled.append(record)
            raise

    done: list[WorkItem] = []
    lanes = KeyLanes(handler, max_concurrency=2, on_done=done.append)
    fetcher = Fetcher(lanes)
    # a (slot 1) and b (slot 2) start inline and suspend; the rest waits for a permit
    fetcher.feed([("a", 0, 1), ("b", 1, 2), ("a", 2, 1), ("c", 3, 3)])
    await eventually(lambda: len(lanes.in_flight()) == 2 and not fetcher.backlog)
    assert sorted(i.record for i in lanes.in_flight()) == [("a", 0), ("b", 1)]
    assert lanes.drop(RangeSet.from_pairs([(1, 1)])) == 1  # ("a", 2) was queued
    assert not await lanes.wait_idle(RangeSet.from_pairs([(1, 1)]), timeout=0.01)
    gates["a"].set()
    assert await lanes.wait_idle(RangeSet.from_pairs([(1, 1)]), timeout=TIMEOUT)
    await eventually(lambda: [i.record for i in done][:1] == [("a", 0)])
    await eventually(lambda: any(i.record == ("c", 3) for i in lanes.in_flight()))
    await lanes.abort()
    assert sorted(cancelled) == [("b", 1), ("c", 3)]
    assert lanes.in_flight() == [] and [i.record for i in done] == [("a", 0)]
    assert all(t.done() for t in fetcher.tasks)
    # the permits and workers of the cancelled records came back: usable again
    assert lanes._limit.free == 2 and lanes._busy_workers == 0
    gates["d"].set()
    assert lanes.dispatch(TP, 9, 0, b"d", ("d", 9), 1) is True
