"""Per-key lanes: many keys at once, each key strictly one record at a time.

As in Confluent's Parallel Consumer (KEY mode): a lane is a FIFO of one ordering key's
records; at most `max_concurrency` lanes run a handler at any moment. A failing record
blocks only its own lane (retried with backoff, then dead-lettered when configured), so
other keys keep flowing. Lanes can be dropped by slot, which is how StopFetcher hands a
range back: queued records are dropped (the next owner processes them), in-flight ones
finish and are waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.group import TopicPartition
from coordinator.ranges import RangeSet

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[None]]
DeadLetter = Callable[[Any, BaseException], Awaitable[None]]


@dataclass(slots=True)
class WorkItem:
    tp: TopicPartition
    offset: int
    slot: int
    lane_key: object
    record: Any
    session: int


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 5.0
    # Attempts before dead-lettering; without a dead-letter topic a record is retried
    # until it succeeds or its range moves away (its key stays blocked meanwhile).
    max_attempts: int = 5


DEFAULT_RETRY = RetryPolicy()


@dataclass(slots=True)
class _Lane:
    queue: deque[WorkItem] = field(default_factory=deque)
    running: WorkItem | None = None
    task: asyncio.Task[None] | None = None
    abandoned: asyncio.Event = field(default_factory=asyncio.Event)


class KeyLanes:
    def __init__(
        self,
        handler: Handler,
        *,
        max_concurrency: int,
        on_done: Callable[[WorkItem], None],
        retry: RetryPolicy = DEFAULT_RETRY,
        dead_letter: DeadLetter | None = None,
    ) -> None:
        self._handler = handler
        self._limit = asyncio.Semaphore(max_concurrency)
        self._on_done = on_done
        self._retry = retry
        self._dead_letter = dead_letter
        self._lanes: dict[object, _Lane] = {}
        self._changed = asyncio.Condition()
        self._unkeyed = itertools.count()

    def lane_key(self, ordering_key: bytes | None) -> object:
        """Records without an ordering key have no order constraint: a lane each."""
        return ordering_key if ordering_key is not None else ("unkeyed", next(self._unkeyed))

    def submit(self, item: WorkItem) -> None:
        lane = self._lanes.get(item.lane_key)
        if lane is None:
            lane = self._lanes[item.lane_key] = _Lane()
        lane.queue.append(item)
        if lane.task is None:
            lane.task = asyncio.create_task(self._run_lane(item.lane_key, lane))

    def in_flight(self, slots: RangeSet | None = None) -> list[WorkItem]:
        return [
            lane.running
            for lane in self._lanes.values()
            if lane.running is not None and (slots is None or lane.running.slot in slots)
        ]

    def drop(self, slots: RangeSet | None = None) -> int:
        """Drop queued records of `slots` (all when None); in-flight ones stop retrying."""
        dropped = 0
        for lane in self._lanes.values():
            head = lane.running or (lane.queue[0] if lane.queue else None)
            if head is None or (slots is not None and head.slot not in slots):
                continue
            dropped += len(lane.queue)
            lane.queue.clear()
            lane.abandoned.set()
        return dropped

    async def wait_idle(self, slots: RangeSet | None = None, timeout: float | None = None) -> bool:
        """Wait until no handler of `slots` runs; False on timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: not self.in_flight(slots)), timeout
                )
            except TimeoutError:
                return False
        return True

    async def abort(self) -> None:
        """Lost session: cancel everything now; nothing of it will be acknowledged."""
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        self._lanes.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with self._changed:
            self._changed.notify_all()

    async def _run_lane(self, key: object, lane: _Lane) -> None:
        try:
            while lane.queue:
                await self._limit.acquire()
                if not lane.queue:  # dropped while waiting for a permit
                    self._limit.release()
                    break
                item = lane.queue.popleft()
                lane.running = item
                completed = await self._process(item, lane)
                lane.running = None
                if completed:
                    self._on_done(item)
                async with self._changed:
                    self._changed.notify_all()
        finally:
            lane.running = None
            if self._lanes.get(key) is lane:
                del self._lanes[key]
            async with self._changed:
                self._changed.notify_all()

    async def _process(self, item: WorkItem, lane: _Lane) -> bool:
        """Run the handler until success (True) or until the lane is abandoned (False).

        Called holding a concurrency permit; the permit is given back during backoff so a
        failing key does not take a lane away from the others.
        """
        backoff = self._retry.initial_backoff_s
        attempt = 0
        holding = True
        try:
            while True:
                attempt += 1
                if not holding:
                    await self._limit.acquire()
                    holding = True
                try:
                    await self._handler(item.record)
                    return True
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    error: BaseException = err
                self._limit.release()
                holding = False
                if self._dead_letter is not None and attempt >= self._retry.max_attempts:
                    log.error(
                        "record %s@%d failed %d times, dead-lettering: %r",
                        item.tp, item.offset, attempt, error,
                    )  # fmt: skip
                    await self._dead_letter(item.record, error)
                    return True
                log.warning(
                    "record %s@%d failed (attempt %d): %r", item.tp, item.offset, attempt, error
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lane.abandoned.wait(), backoff)
                if lane.abandoned.is_set():
                    return False
                backoff = min(backoff * 2, self._retry.max_backoff_s)
        finally:
            if holding:
                self._limit.release()
