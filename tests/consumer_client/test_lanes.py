"""KeyLanes: per-key ordering, bounded concurrency, retries, dead letters, drop and abort.

Handlers are held with asyncio.Event so the tests decide when work finishes; conditions are
awaited with a deadline (`eventually`), never with a fixed sleep.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord

from keyshard.consumer_client._datapath.lanes import (
    KEY_LOG_CHARS,
    KeyLanes,
    RetryPolicy,
    WorkItem,
)
from keyshard.core.model.ranges import RangeSet

TP = ("t", 0)
FAST = RetryPolicy(initial_backoff_ms=1, max_backoff_ms=2, max_attempts=3)
TIMEOUT = 5.0


async def eventually(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


async def settle(turns: int = 50) -> None:
    """Let every runnable task make progress (used only to check that nothing *else* runs)."""
    for _ in range(turns):
        await asyncio.sleep(0)


class Harness:
    """A handler whose records are (key, offset); it can be held per key or failed."""

    def __init__(self, **kwargs: object) -> None:
        self.gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.fail_until: dict[str, asyncio.Event] = {}
        self.running: Counter[str] = Counter()
        self.max_running = 0
        self.max_per_key = 0
        self.started: list[tuple[str, int]] = []
        self.attempts: Counter[tuple[str, int]] = Counter()
        self.cancelled: list[tuple[str, int]] = []
        self.done: list[WorkItem] = []
        self.lanes = KeyLanes(self.handle, on_done=self.done.append, **kwargs)  # type: ignore[arg-type]

    def open(self, *keys: str) -> None:
        for key in keys:
            self.gates[key].set()

    async def handle(self, record: tuple[str, int]) -> None:
        key, _ = record
        self.attempts[record] += 1
        self.started.append(record)
        self.running[key] += 1
        self.max_per_key = max(self.max_per_key, self.running[key])
        self.max_running = max(self.max_running, sum(self.running.values()))
        try:
            await self.gates[key].wait()
            await asyncio.sleep(0)  # give a would-be second handler of the key a chance
            failing = self.fail_until.get(key)
            if failing is not None and not failing.is_set():
                raise RuntimeError(f"{key} failed")
        except asyncio.CancelledError:
            self.cancelled.append(record)
            raise
        finally:
            self.running[key] -= 1

    def submit(self, key: str, offset: int, slot: int = 0) -> None:
        item = WorkItem(TP, offset, slot, key.encode(), (key, offset), session=1)
        self.lanes.submit(item)

    def done_records(self) -> list[tuple[str, int]]:
        return [item.record for item in self.done]


async def test_one_key_runs_in_order_one_at_a_time() -> None:
    h = Harness(max_concurrency=8)
    h.open("a")
    for offset in range(10):
        h.submit("a", offset)
    await eventually(lambda: len(h.done) == 10)
    assert h.done_records() == [("a", o) for o in range(10)]
    assert h.started == h.done_records()
    assert h.max_per_key == 1
    assert h.lanes.in_flight() == []


async def test_held_key_blocks_only_itself_in_order() -> None:
    h = Harness(max_concurrency=4)
    h.open("b")
    for offset in range(6):
        h.submit("a" if offset % 2 else "b", offset)
    await eventually(lambda: len(h.done) == 3)
    assert h.done_records() == [("b", 0), ("b", 2), ("b", 4)]
    assert [r for r in h.started if r[0] == "a"] == [("a", 1)]  # a's later records wait
    h.open("a")
    await eventually(lambda: len(h.done) == 6)
    assert [r for r in h.done_records() if r[0] == "a"] == [("a", 1), ("a", 3), ("a", 5)]
    assert h.max_per_key == 1


async def test_different_keys_run_concurrently_up_to_the_limit() -> None:
    h = Harness(max_concurrency=3)
    keys = [f"k{i}" for i in range(7)]
    for offset, key in enumerate(keys):
        h.submit(key, offset)
    await eventually(lambda: sum(h.running.values()) == 3)
    await settle()
    assert sum(h.running.values()) == 3 and h.max_running == 3
    h.open(*keys[:3])
    await eventually(lambda: len(h.done) >= 3 and sum(h.running.values()) == 3)
    await settle()
    assert h.max_running == 3
    h.open(*keys)
    await eventually(lambda: len(h.done) == 7)
    assert h.max_running == 3
    assert sorted(h.done_records()) == sorted((k, i) for i, k in enumerate(keys))


async def test_failing_key_is_retried_and_blocks_only_itself() -> None:
    h = Harness(max_concurrency=4, retry=FAST)  # no dead letter: retried until it succeeds
    h.fail_until["bad"] = asyncio.Event()
    h.open("bad", "x", "y")
    h.submit("bad", 0)
    h.submit("bad", 1)
    for offset in range(2, 8):
        h.submit("x" if offset % 2 else "y", offset)
    await eventually(lambda: len(h.done) == 6 and h.attempts[("bad", 0)] > FAST.max_attempts)
    assert ("bad", 1) not in h.started, "a later record of a failing key must wait"
    assert h.lanes.in_flight()[0].record == ("bad", 0)
    h.fail_until["bad"].set()
    await eventually(lambda: len(h.done) == 8)
    assert h.done_records()[-2:] == [("bad", 0), ("bad", 1)]
    assert h.attempts[("bad", 1)] == 1


async def test_a_key_in_backoff_leaves_its_permit_to_the_others() -> None:
    h = Harness(max_concurrency=1, retry=FAST)  # the only permit: the failing key must lend it
    h.fail_until["bad"] = asyncio.Event()
    h.open("bad", "x")
    h.submit("bad", 0)
    h.submit("x", 1)
    h.submit("x", 2)
    await eventually(lambda: len(h.done) == 2)
    assert h.done_records() == [("x", 1), ("x", 2)] and h.max_running == 1
    h.fail_until["bad"].set()
    await eventually(lambda: len(h.done) == 3)


async def test_a_burst_of_new_keys_starts_no_more_tasks_than_the_limit() -> None:
    """Dispatch cost: one task per record (or per key) would make the fetch loop the
    bottleneck."""
    h = Harness(max_concurrency=4)
    before = len(asyncio.all_tasks())
    for offset in range(500):
        h.submit(f"k{offset}", offset)
    assert len(asyncio.all_tasks()) - before <= 4
    h.open(*(f"k{offset}" for offset in range(500)))
    await eventually(lambda: len(h.done) == 500)
    assert h.max_running == 4


async def test_dead_letter_after_max_attempts() -> None:
    dead: list[tuple[object, BaseException]] = []

    async def dead_letter(record: object, error: BaseException) -> None:
        dead.append((record, error))

    h = Harness(max_concurrency=2, retry=FAST, dead_letter=dead_letter)
    h.fail_until["bad"] = asyncio.Event()
    h.open("bad")
    h.submit("bad", 0)
    h.submit("bad", 1)
    await eventually(lambda: len(dead) == 2)
    assert [record for record, _ in dead] == [("bad", 0), ("bad", 1)]
    assert all(isinstance(err, RuntimeError) for _, err in dead)
    assert h.attempts == {("bad", 0): FAST.max_attempts, ("bad", 1): FAST.max_attempts}
    # a dead-lettered record counts as done: its key moves on
    assert h.done_records() == [("bad", 0), ("bad", 1)]


@pytest.mark.parametrize(
    ("key", "named"),
    [
        (b"order-17", "key 'order-17'"),
        (b"\x00\xffid\n", "key '\\x00\\\\xffid\\n'"),  # escaped, never raw bytes
        (b"k" * 100, f"key '{'k' * KEY_LOG_CHARS}'..."),  # truncated
        (None, "no key"),
    ],
)
async def test_the_dead_letter_line_names_the_key_and_never_the_value(
    key: bytes | None, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def failing(record: Any) -> None:
        raise ValueError("bad record")

    async def dead_letter(record: object, error: BaseException) -> None:
        pass

    lanes = KeyLanes(
        failing, max_concurrency=1, on_done=lambda _: None, retry=FAST, dead_letter=dead_letter
    )
    record = ConsumerRecord("t", 0, 17, 0, 0, key, b"secret-value", None, 8, 12, [])
    with caplog.at_level(logging.WARNING, logger="keyshard.consumer_client._datapath.lanes"):
        lanes.submit(WorkItem(TP, 17, 5, key or ("unkeyed", 0), record, session=1))
        await eventually(lambda: any(r.levelno == logging.ERROR for r in caplog.records))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line == (
        f"record ('t', 0)@17 ({named}) failed 3 times, dead-lettering: ValueError('bad record')"
    )
    assert all("secret-value" not in r.getMessage() for r in caplog.records)


async def test_drop_gives_up_retries_and_queued_records() -> None:
    h = Harness(max_concurrency=4, retry=FAST)
    h.fail_until["bad"] = asyncio.Event()
    h.open("bad")
    for offset in range(3):
        h.submit("bad", offset, slot=1)
        h.submit("held", 10 + offset, slot=2)
        h.submit("other", 20 + offset, slot=3)
    await eventually(lambda: h.attempts[("bad", 0)] >= 2 and ("held", 10) in h.started)
    assert h.lanes.drop(RangeSet.from_pairs([(1, 2)])) == 4  # 2 queued behind each head
    assert await h.lanes.wait_idle(RangeSet.from_pairs([(1, 1)]), timeout=TIMEOUT)
    assert ("bad", 0) not in h.done_records()  # gave up, not acknowledged
    assert [r for r in h.started if r[0] == "bad"] == [("bad", 0)] * h.attempts[("bad", 0)]
    # the held in-flight record of slot 2 still finishes; its queued records were dropped
    assert not await h.lanes.wait_idle(RangeSet.from_pairs([(2, 2)]), timeout=0.01)
    h.open("held", "other")
    assert await h.lanes.wait_idle(timeout=TIMEOUT)
    done = h.done_records()
    assert [r for r in done if r[0] == "held"] == [("held", 10)]
    assert [r for r in done if r[0] == "other"] == [("other", 20), ("other", 21), ("other", 22)]
    assert h.lanes.in_flight() == []


async def test_drop_all() -> None:
    h = Harness(max_concurrency=1)
    for offset in range(4):
        h.submit(f"k{offset}", offset)
    await eventually(lambda: len(h.started) == 1)
    # One record runs; the three others still wait for a permit, so they are droppable:
    # nothing reaches user code after its range was stopped.
    assert h.lanes.drop() == 3
    h.open(*(f"k{i}" for i in range(4)))
    assert await h.lanes.wait_idle(timeout=TIMEOUT)
    assert len(h.done) == 1


async def test_wait_idle() -> None:
    h = Harness(max_concurrency=2)
    assert await h.lanes.wait_idle(timeout=0.01)  # nothing running
    h.submit("a", 0, slot=5)
    h.submit("b", 1, slot=6)
    await eventually(lambda: sum(h.running.values()) == 2)
    assert not await h.lanes.wait_idle(timeout=0.01)
    assert await h.lanes.wait_idle(RangeSet.from_pairs([(7, 9)]), timeout=0.01)
    waiter = asyncio.create_task(h.lanes.wait_idle(RangeSet.from_pairs([(5, 5)])))
    await settle()
    assert not waiter.done()
    h.open("a")
    assert await asyncio.wait_for(waiter, TIMEOUT)
    assert [i.slot for i in h.lanes.in_flight()] == [6]
    h.open("b")
    assert await h.lanes.wait_idle(timeout=TIMEOUT)


async def test_abort_cancels_everything() -> None:
    h = Harness(max_concurrency=4)
    for offset in range(6):
        h.submit(f"k{offset % 3}", offset)
    await eventually(lambda: sum(h.running.values()) == 3)
    await h.lanes.abort()
    assert sorted(h.cancelled) == [("k0", 0), ("k1", 1), ("k2", 2)]
    assert h.done == [] and h.lanes.in_flight() == []
    assert await h.lanes.wait_idle(timeout=0.01)
    h.open("k0")  # the lanes are usable again afterwards
    h.submit("k0", 9)
    await eventually(lambda: len(h.done) == 1)
    assert h.done_records() == [("k0", 9)]


def test_unkeyed_records_get_a_lane_each() -> None:
    lanes = KeyLanes(pytest.fail, max_concurrency=1, on_done=lambda _: None)
    assert lanes.lane_key(b"k") == lanes.lane_key(b"k")
    assert lanes.lane_key(None) != lanes.lane_key(None)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_busy_time_is_lane_time_over_the_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two of four lanes busy for two seconds are one second of the member's concurrency:
    a member using part of its lanes (a hot key) is not measured as a slow one."""
    clock = _Clock()
    monkeypatch.setattr("keyshard.consumer_client._datapath.lanes.monotonic", clock)
    h = Harness(max_concurrency=4)
    h.submit("a", 0)
    h.submit("b", 1)
    await eventually(lambda: sum(h.running.values()) == 2)
    clock.now += 2.0
    h.open("a", "b")
    await eventually(lambda: len(h.done) == 2)
    clock.now += 5.0  # idle: adds nothing
    assert h.lanes.take_busy() == (2, 2 * 2.0 / 4)
    assert h.lanes.take_busy() == (0, 0.0)  # taken
