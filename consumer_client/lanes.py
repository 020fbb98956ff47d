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
    scheduled: bool = False  # waiting in the ready queue or being run by a worker
    abandoned: bool = False
    # Created only when a record of this lane backs off: most lanes never need it, and an
    # Event per lane was a tenth of the dispatch cost.
    wake: asyncio.Event | None = None

    def abandon(self) -> None:
        self.abandoned = True
        if self.wake is not None:
            self.wake.set()


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
        self._max_workers = max_concurrency
        self._lanes: dict[object, _Lane] = {}
        # Lanes with queued records and no worker, in arrival order: a worker takes the
        # head, runs one record, and puts the lane back at the tail if it has more.
        self._ready: deque[tuple[object, _Lane]] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._busy_workers = 0  # workers not sleeping in a retry backoff
        self._changed = asyncio.Condition()
        self._idle_waiters = 0  # notify only when someone waits: the lock is per record
        self._unkeyed = itertools.count()

    def lane_key(self, ordering_key: bytes | None) -> object:
        """Records without an ordering key have no order constraint: a lane each."""
        return ordering_key if ordering_key is not None else ("unkeyed", next(self._unkeyed))

    def submit(self, item: WorkItem) -> None:
        lane = self._lanes.get(item.lane_key)
        if lane is None:
            lane = self._lanes[item.lane_key] = _Lane()
        lane.queue.append(item)
        if not lane.scheduled:
            lane.scheduled = True
            self._ready.append((item.lane_key, lane))
            self._spawn()

    def _spawn(self) -> None:
        if self._ready and self._busy_workers < self._max_workers:
            self._busy_workers += 1
            task = asyncio.create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

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
            lane.abandon()
        return dropped

    async def wait_idle(self, slots: RangeSet | None = None, timeout: float | None = None) -> bool:
        """Wait until no handler of `slots` runs; False on timeout."""
        self._idle_waiters += 1
        try:
            async with self._changed:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: not self.in_flight(slots)), timeout
                    )
                except TimeoutError:
                    return False
            return True
        finally:
            self._idle_waiters -= 1

    async def abort(self) -> None:
        """Lost session: cancel everything now; nothing of it will be acknowledged."""
        tasks = list(self._workers)
        self._lanes.clear()
        self._ready.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with self._changed:
            self._changed.notify_all()

    async def _notify(self) -> None:
        if self._idle_waiters:
            async with self._changed:
                self._changed.notify_all()

    async def _work(self) -> None:
        """A worker: runs the head record of the next ready lane, as long as any is ready.

        At most `max_concurrency` workers exist and a worker lives only while lanes are
        ready, so a burst of new keys costs a deque append each, not a task each.
        """
        try:
            await self._work_ready()
        finally:
            self._busy_workers -= 1

    async def _work_ready(self) -> None:
        while self._ready:
            key, lane = self._ready.popleft()
            if not lane.queue:  # dropped while it waited
                self._retire(key, lane)
                continue
            await self._limit.acquire()
            if not lane.queue:  # dropped while waiting for a permit
                self._limit.release()
                self._retire(key, lane)
                continue
            item = lane.queue.popleft()
            lane.running = item
            try:
                completed = await self._process(item, lane)
            finally:
                lane.running = None
            if completed:
                self._on_done(item)
            if lane.queue:
                self._ready.append((key, lane))
            else:
                self._retire(key, lane)
            await self._notify()

    def _retire(self, key: object, lane: _Lane) -> None:
        lane.scheduled = False
        if lane.running is None and not lane.queue and self._lanes.get(key) is lane:
            del self._lanes[key]

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
                if lane.wake is None:
                    lane.wake = asyncio.Event()
                if lane.abandoned:
                    return False
                # This worker sleeps: another one takes over the ready lanes meanwhile.
                self._busy_workers -= 1
                self._spawn()
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lane.wake.wait(), backoff)
                finally:
                    self._busy_workers += 1
                if lane.abandoned:
                    return False
                backoff = min(backoff * 2, self._retry.max_backoff_s)
        finally:
            if holding:
                self._limit.release()
