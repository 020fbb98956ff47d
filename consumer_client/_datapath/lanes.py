"""Per-key lanes: many keys at once, each key strictly one record at a time.

As in Confluent's Parallel Consumer (KEY mode): a lane is a FIFO of one ordering key's
records; at most `max_concurrency` lanes run a handler at any moment. A failing record
blocks only its own lane (retried with backoff, then dead-lettered when configured), so
other keys keep flowing. Lanes can be dropped by slot, which is how StopFetcher hands a
range back: queued records are dropped (the next owner processes them), in-flight ones
finish and are waited for.

A record whose key has no lane and for which a permit is free is started inline, in the
fetcher's turn (`dispatch`): its handler's first step runs at once, and when it finishes
without suspending (a cheap or cached handler) nothing else is created - no lane, no
queue entry, no task. Only when it suspends (or raises) does it become a lane with that
record running, continued by a worker task exactly where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from time import monotonic
from types import CoroutineType
from typing import Any, Literal

from keyshard.consumer_client._datapath.budget import BufferBudget, record_size
from keyshard.core.model.durations import renamed_seconds
from keyshard.core.model.positions import TopicPartition
from keyshard.core.model.ranges import RangeSet

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[None]]
DeadLetter = Callable[[Any, BaseException], Awaitable[None]]

#: A key in a log line: at most this many characters of it.
KEY_LOG_CHARS = 64


def key_for_log(key: object) -> str:
    """A record's key as a log line names it: printable (escaped), truncated. Never the
    value: a key identifies a record, a value is the user's data."""
    if key is None:
        return "no key"
    text = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)
    shown = repr(text[:KEY_LOG_CHARS])
    return f"key {shown}..." if len(text) > KEY_LOG_CHARS else f"key {shown}"


@dataclass(slots=True)
class WorkItem:
    tp: TopicPartition
    offset: int
    slot: int
    lane_key: object
    record: Any
    session: int
    size: int = 0  # its bytes in the memory budget, while it is in a lane


@dataclass(frozen=True, slots=True, init=False)
class RetryPolicy:
    """How a record whose handler raised is retried, in its own lane (other keys go on).

    Args:
        initial_backoff_ms: the wait before the second attempt, doubled after each
            further failure. Default: 50.
        max_backoff_ms: the longest wait between two attempts. Default: 5000.
        max_attempts: attempts before the record is sent to the consumer's
            `dead_letter_topic`; without one a record is retried until it succeeds or its
            range moves away (its key stays blocked meanwhile). Default: 5.

    `initial_backoff_s` and `max_backoff_s` (seconds) are deprecated names of the first two.
    """

    initial_backoff_ms: int
    max_backoff_ms: int
    max_attempts: int

    @renamed_seconds(initial_backoff_s="initial_backoff_ms", max_backoff_s="max_backoff_ms")
    def __init__(
        self, *, initial_backoff_ms: int = 50, max_backoff_ms: int = 5000, max_attempts: int = 5
    ) -> None:
        object.__setattr__(self, "initial_backoff_ms", initial_backoff_ms)
        object.__setattr__(self, "max_backoff_ms", max_backoff_ms)
        object.__setattr__(self, "max_attempts", max_attempts)


DEFAULT_RETRY = RetryPolicy()


class _Permits:
    """A counting semaphore with a synchronous `try_take`: the inline path must take a
    permit without awaiting. Released permits go to waiters first, in order.

    It also integrates the permits held over time (`held_s`, permit-seconds): what the
    handlers ran for, which with the completions measures how fast this member works
    (docs/protocol.md §8.7). Updated on each change of `free`, one clock read each."""

    __slots__ = ("_since", "count", "free", "held_s", "waiters")

    def __init__(self, count: int) -> None:
        self.count = count
        self.free = count
        self.held_s = 0.0
        self._since = monotonic()
        self.waiters: deque[asyncio.Future[None]] = deque()

    def account(self) -> None:
        now = monotonic()
        self.held_s += (self.count - self.free) * (now - self._since)
        self._since = now

    def take_now(self) -> None:
        """Take a permit known to be free (nothing ran since it was checked)."""
        self.account()
        self.free -= 1

    def try_take(self) -> bool:
        if self.free > 0 and not self.waiters:
            self.take_now()
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed to us just before the cancellation: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise

    def give(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.account()
        self.free += 1


class Resume:
    """The rest of a coroutine whose first step already ran and yielded `yielded`.

    Awaited inside a task, it hands the yielded future (or None) to that task as if the
    coroutine had been run by the task from the start, then forwards every resumption,
    thrown exception (cancellation) and close into it.
    """

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Any, yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._yielded
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as err:  # thrown in by the task: pass it on
                try:
                    value = coro.throw(err)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def replay_failure(error: BaseException) -> None:
    """The failed first attempt of an inline record, replayed inside its lane's worker."""
    raise error


@dataclass(slots=True)
class _Lane:
    queue: deque[WorkItem] = field(default_factory=deque)
    running: WorkItem | None = None
    scheduled: bool = False  # waiting in the ready queue or being run by a worker
    abandoned: bool = False
    # Created only when a record of this lane backs off: most lanes never need it, and an
    # Event per lane costs a tenth of a dispatch.
    wake: asyncio.Event | None = None

    def abandon(self) -> None:
        self.abandoned = True
        if self.wake is not None:
            self.wake.set()


@dataclass(slots=True)
class Suspended:
    """An inline record whose handler is waiting at its first await (see `dispatch`)."""

    key: object
    lane: _Lane
    item: WorkItem
    rest: Awaitable[None]


class KeyLanes:
    def __init__(
        self,
        handler: Handler,
        *,
        max_concurrency: int,
        on_done: Callable[[WorkItem], None],
        retry: RetryPolicy = DEFAULT_RETRY,
        dead_letter: DeadLetter | None = None,
        budget: BufferBudget | None = None,
        released: Callable[[], None] | None = None,
    ) -> None:
        """`budget`: the records in lanes (queued or running) count in its `in_flight`,
        each by `record_size`; `released` is called when records leave without
        completing (dropped, abandoned), `on_done` when they complete."""
        self._handler = handler
        self._budget = budget
        self._released = released
        self._limit = _Permits(max_concurrency)
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
        self._completed = 0  # records completed in lanes since the last take_busy()

    def lane_key(self, ordering_key: bytes | None) -> object:
        """Records without an ordering key have no order constraint: a lane each."""
        return ordering_key if ordering_key is not None else ("unkeyed", next(self._unkeyed))

    def dispatch(
        self, tp: TopicPartition, offset: int, slot: int, key: object, record: Any, session: int
    ) -> bool | Suspended:
        """Start a record inline when its key is idle and a permit is free, else queue it.

        True: the handler already completed (the caller acknowledges it; nothing was
        queued). False: it is queued or running in a worker, and `on_done` reports it.
        A `Suspended`: the handler stopped at an await; the calling task must `adopt` it,
        because that task is the one the handler saw as current (`asyncio.timeout`,
        `TaskGroup` and `current_task()` captured it), so it must be the one to finish it.
        """
        if key in self._lanes or not self.can_start_inline():
            self.submit(self._item(tp, offset, slot, key, record, session))
            return False
        # The permit is taken only if the handler outlives this call: nothing else runs
        # meanwhile, so it is still free then.
        try:
            started = self._handler(record)
        except BaseException as err:  # replayed as attempt 1
            return self.begin(tp, offset, slot, key, record, session, replay_failure(err))
        if type(started) is not CoroutineType:  # an awaitable: awaited by a worker
            return self.begin(tp, offset, slot, key, record, session, started)
        try:
            yielded = started.send(None)
        except StopIteration:
            return True
        except BaseException as err:  # replayed as attempt 1
            return self.begin(tp, offset, slot, key, record, session, replay_failure(err))
        return self.begin(tp, offset, slot, key, record, session, Resume(started, yielded))

    @property
    def handler(self) -> Handler:
        return self._handler

    def take_busy(self) -> tuple[int, float]:
        """Records completed in lanes since the last call, and the time they took in
        seconds of the whole concurrency (two lanes busy for one second of
        `max_concurrency` 4 are half a second): the member's speed, from handlers that
        held a permit. Handlers that complete inline, in the fetcher's turn, are not in
        it: their time cannot be told from the fetch filter's, and a member owning fewer
        slots filters more records per completion, so counting it would make that member
        look slower and give it fewer still."""
        limit = self._limit
        limit.account()
        busy, limit.held_s = limit.held_s, 0.0
        done, self._completed = self._completed, 0
        return done, busy / limit.count

    @property
    def busy_keys(self) -> Mapping[object, object]:
        """The keys that have a lane (running, queued or backing off): a record of one
        of them must queue behind it. The C fast path asks membership only."""
        return self._lanes

    def can_start_inline(self) -> bool:
        """Could a record of an idle key start inline now? Only queueing (`submit`) and
        lane tasks change the answer, and a dispatching fetcher can only make it False."""
        limit = self._limit
        return not (
            self._ready
            or self._busy_workers >= self._max_workers
            or limit.free <= 0
            or limit.waiters
        )

    def begin(
        self,
        tp: TopicPartition,
        offset: int,
        slot: int,
        key: object,
        record: Any,
        session: int,
        rest: Awaitable[None],
    ) -> Literal[False] | Suspended:
        """An inline record whose handler was called and did not complete in its first
        step becomes its lane's running record, holding a permit. `rest`: a `Resume` (it
        suspended: the calling task adopts the returned `Suspended`), else its failure as
        `replay_failure` or the non-coroutine awaitable it returned (a worker of its own, which
        replays a failure as attempt 1 and goes on with the retry policy; rare, so a task
        is fine). Shared by `dispatch` and the C fast path (consumer_client/fastpath.py).
        """
        item = self._item(tp, offset, slot, key, record, session)
        lane = self._lanes[key] = _Lane(running=item, scheduled=True)
        self._limit.take_now()
        self._busy_workers += 1
        if type(rest) is Resume:
            return Suspended(key, lane, item, rest)
        task = asyncio.create_task(self._continue(key, lane, item, rest))
        self._workers.add(task)
        task.add_done_callback(self._workers.discard)
        return False

    async def adopt(self, suspended: Suspended) -> None:
        """Finish a suspended inline record in the current task, then serve ready lanes:
        the task is a lane worker from now on (cancelled by `abort` like the others)."""
        task = asyncio.current_task()
        assert task is not None
        self._workers.add(task)
        try:
            await self._continue(suspended.key, suspended.lane, suspended.item, suspended.rest)
        finally:
            self._workers.discard(task)

    def _item(
        self, tp: TopicPartition, offset: int, slot: int, key: object, record: Any, session: int
    ) -> WorkItem:
        """A record entering a lane, counted in flight from now until it leaves."""
        item = WorkItem(tp, offset, slot, key, record, session)
        if self._budget is not None:
            item.size = record_size(record)
            self._budget.in_flight += item.size
        return item

    def _leave(self, items: Iterable[WorkItem]) -> None:
        if self._budget is not None:
            self._budget.in_flight -= sum(item.size for item in items)

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
            self._leave(lane.queue)
            lane.queue.clear()
            lane.abandon()
        if dropped and self._released is not None:
            self._released()
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
        if self._budget is not None:  # a worker cancelled before its first step held some
            self._budget.in_flight = 0
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

    async def _continue(
        self, key: object, lane: _Lane, item: WorkItem, first: Awaitable[None]
    ) -> None:
        """A worker that starts with an inline record which suspended (holding its permit),
        then serves the ready lanes like any other."""
        try:
            await self._run(key, lane, item, first)
            await self._work_ready()
        finally:
            self._busy_workers -= 1

    async def _work_ready(self) -> None:
        while self._ready:
            key, lane = self._ready.popleft()
            if not lane.queue:  # dropped while it waited
                self._retire(key, lane)
                continue
            await self._limit.take()
            if not lane.queue:  # dropped while waiting for a permit
                self._limit.give()
                self._retire(key, lane)
                continue
            item = lane.queue.popleft()
            lane.running = item
            await self._run(key, lane, item)

    async def _run(
        self, key: object, lane: _Lane, item: WorkItem, first: Awaitable[None] | None = None
    ) -> None:
        """Finish `item` (already `lane.running`, permit held), then requeue or retire."""
        completed = False
        try:
            completed = await self._process(item, lane, first)
        finally:
            lane.running = None
            if self._budget is not None:
                self._budget.in_flight -= item.size
            if not completed and self._released is not None:
                self._released()
        if completed:
            self._completed += 1
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

    async def _process(
        self, item: WorkItem, lane: _Lane, first: Awaitable[None] | None = None
    ) -> bool:
        """Run the handler until success (True) or until the lane is abandoned (False).

        Called holding a concurrency permit; the permit is given back during backoff so a
        failing key does not take a lane away from the others. `first`, when given, is the
        first attempt already started inline.
        """
        backoff = self._retry.initial_backoff_ms / 1000
        attempt = 0
        holding = True
        try:
            while True:
                attempt += 1
                if not holding:
                    await self._limit.take()
                    holding = True
                try:
                    if first is not None:
                        attempt_now, first = first, None
                        await attempt_now
                    else:
                        await self._handler(item.record)
                    return True
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    error: BaseException = err
                self._limit.give()
                holding = False
                if self._dead_letter is not None and attempt >= self._retry.max_attempts:
                    log.error(
                        "record %s@%d (%s) failed %d times, dead-lettering: %r",
                        item.tp, item.offset, key_for_log(getattr(item.record, "key", None)),
                        attempt, error,
                    )  # fmt: skip
                    await self._dead_letter(item.record, error)
                    return True
                log.warning(
                    "record %s@%d (%s) failed (attempt %d): %r", item.tp, item.offset,
                    key_for_log(getattr(item.record, "key", None)), attempt, error,
                )  # fmt: skip
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
                backoff = min(backoff * 2, self._retry.max_backoff_ms / 1000)
        finally:
            if holding:
                self._limit.give()
