"""`CoordinatedConsumer`: the lightweight consumer of seeds/004, over aiokafka.

Three activities run under one supervisor (`run`): the *connector* (find the coordinator,
register, answer Ping/StopFetcher/StartFetcher, notice a silent or lost coordinator), the
*fetcher* (one aiokafka consumer with manual assignment, filtered by owned slots), and the
*lanes* (the user's handler, per key). The lost-connection procedure is the seeds/004 one:
stop every fetcher, drop every queue, find the coordinator again, register again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumer_client import fastpath
from consumer_client.lanes import DEFAULT_RETRY, KeyLanes, RetryPolicy, Suspended, WorkItem
from consumer_client.membership import ConsumerError, Membership, parse_addresses
from consumer_client.progress import ConsumerProgress, Grant, PartitionProgress
from consumer_client.replay import ReplayWindow
from coordinator.model.hashing import (
    LOAD_BUCKET_SHIFT,
    ORDERING_KEY_HEADER,
    SLOT_COUNT,
    ordering_key,
    slot_for_key,
)
from coordinator.model.positions import PositionUpdate
from coordinator.model.ranges import RangeSet
from coordinator.protocol.messages import HighWatermark

log = logging.getLogger(__name__)

AsyncHandler = Callable[[Any], Awaitable[None]]


__all__ = ["ConsumerError", "CoordinatedConsumer"]


@dataclass(slots=True)
class ConsumerStats:
    """Counters since start, for read-amplification and throughput measurements.

    `fetched` counts every record aiokafka decoded for us (including the ones another
    consumer owns and the ones refetched after a rewind); `admitted` the ones handed to a
    lane; `processed` the handler completions acknowledged. A grant below the fetch
    position either replays held records (`replayed` counts them) or seeks the partition
    back (`rewinds`).
    """

    fetched: int = 0
    admitted: int = 0
    processed: int = 0
    replayed: int = 0
    rewinds: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "fetched": self.fetched,
            "admitted": self.admitted,
            "processed": self.processed,
            "replayed": self.replayed,
            "rewinds": self.rewinds,
        }


@dataclass(slots=True)
class _Chunk:
    """One partition's records of one fetch, dispatched from `next` on."""

    ktp: TopicPartition
    tp: tuple[str, int]
    generation: int | None  # the partition's generation when the fetch was sent
    session: int
    records: list[Any]
    next: int = 0
    # Held records replayed for this grant (not fetched: no generation to check).
    replay: Grant | None = None


_MAX_TURN_S = 0.02  # the fetch loop gives other tasks a turn at least this often
_MAX_BATCH = 2000  # records per getmany
_MIN_BATCH = 8


def _wake(waker: asyncio.Future[None], _: object) -> None:
    if not waker.done():
        waker.set_result(None)


@dataclass(slots=True)
class _Fetch:
    """A getmany in flight, with what it was sent under: it outlives a fetcher task that
    stays with a suspended handler, and a replay may be dispatched while it is out."""

    task: asyncio.Task[dict[TopicPartition, list[Any]]]
    generations: dict[tuple[str, int], int]
    session: int


class CoordinatedConsumer:
    def __init__(
        self,
        *,
        group: str,
        topics: list[str],
        coordinator: str,
        bootstrap_servers: str,
        name: str = "consumer",
        max_concurrency: int = 64,
        session_timeout_ms: int = 10_000,
        capacity: int = 1,
        auth_token: str | None = None,
        dead_letter_topic: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        ordering_header: str = ORDERING_KEY_HEADER,
        max_pending: int | None = None,
        drain_timeout_s: float = 30.0,
        fetch_max_wait_ms: int = 100,
        replay_window: int = 10_000,
    ) -> None:
        if not topics:
            raise ValueError("topics must name at least one topic")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if not 1000 <= session_timeout_ms <= 300_000:
            raise ValueError(f"session_timeout_ms={session_timeout_ms} is outside 1000..300000")
        if not 1 <= capacity <= 100_000:
            raise ValueError(f"capacity={capacity} is outside 1..100000")
        if replay_window < 0:
            raise ValueError(f"replay_window={replay_window} must be >= 0 (0 turns it off)")
        self.group = group
        self.topics = list(topics)
        self.coordinators = parse_addresses(coordinator)
        self.bootstrap_servers = bootstrap_servers
        self.name = name
        self.max_concurrency = max_concurrency
        self.session_timeout_ms = session_timeout_ms
        self.capacity = capacity
        self.auth_token = auth_token
        self.dead_letter_topic = dead_letter_topic
        self.retry = retry
        self.ordering_header = ordering_header
        self.max_pending = max_pending or max(1000, 16 * max_concurrency)
        self.drain_timeout_s = drain_timeout_s
        # Some brokers (Tansu) hold a fetch for about half of this even when records are
        # waiting, so it bounds delivery latency; on Kafka it only matters when idle.
        self.fetch_max_wait_ms = fetch_max_wait_ms
        # Fetched records held per partition so a grant a little behind the fetch position
        # replays them instead of rewinding the partition (consumer_client.replay).
        self.replay_window = replay_window
        self._windows: dict[tuple[str, int], ReplayWindow] = {}
        self.progress = ConsumerProgress()
        # Handler completions per load bucket since the last Ping; an int64 array, not a
        # Counter (`counter[b] += 1` cost more than the fetch filter), which the C fast
        # path increments in place.
        self.load = fastpath.new_load()
        # The C fast path of `_dispatch_records`, or None for the Python loop only.
        self._fast = fastpath.NATIVE
        self._membership = Membership(
            self,
            group=group,
            topics=self.topics,
            coordinators=self.coordinators,
            name=name,
            session_timeout_ms=session_timeout_ms,
            capacity=capacity,
            auth_token=auth_token,
        )
        self.stats = ConsumerStats()
        self._kafka: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._lanes: KeyLanes | None = None
        self._closing = False
        self._stopped = asyncio.Event()
        # Set whenever a fetcher held back by `max_pending` should look again: an ack, a
        # lost session, a replay queued (its records are owed, not new work).
        self._unblocked = asyncio.Event()
        # Resolved by the fetch in flight completing or by a replay being queued.
        self._fetch_waker: asyncio.Future[None] | None = None
        # Fetched (or replayed) records not dispatched yet, shared by successive fetcher
        # tasks; a replay is put at its front (all of it lies below what is queued).
        self._backlog: list[_Chunk] = []
        self._inflight: _Fetch | None = None
        self._batch = _MIN_BATCH  # records per getmany: grows while batches are quick
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fetcher: asyncio.Task[None] | None = None
        # Fails when the fetch loop fails, whichever task runs it (closing ends via `_stopped`).
        self._fetch_failed: asyncio.Future[None] | None = None

    # ---- public API -----------------------------------------------------------------

    async def __aenter__(self) -> CoordinatedConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, handler: AsyncHandler) -> None:
        """Consume until `close()` (or `request_stop()`); a normal return acknowledges."""
        self._loop = asyncio.get_running_loop()
        self._lanes = KeyLanes(
            handler,
            max_concurrency=self.max_concurrency,
            on_done=self._on_done,
            retry=self.retry,
            dead_letter=self._dead_letter if self.dead_letter_topic else None,
        )
        self._kafka = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.fetch_max_wait_ms,
        )
        await self._kafka.start()
        if self.dead_letter_topic:
            self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers)
            await self._producer.start()
        connector = asyncio.create_task(self._membership.run(), name=f"{self.name}-connector")
        fetch_failed: asyncio.Future[None] = self._loop.create_future()
        self._fetch_failed = fetch_failed
        self._start_fetcher()
        stopped: asyncio.Future[Any] = asyncio.create_task(self._stopped.wait())
        try:
            done, _ = await asyncio.wait(
                {connector, fetch_failed, stopped}, return_when=asyncio.FIRST_COMPLETED
            )
            for finished in done:
                if finished is not stopped and finished.exception() is not None:
                    raise finished.exception()  # type: ignore[misc]
        finally:
            fetch_failed.cancel()
            # The current fetcher only: earlier ones became lane workers (`abort` ends them).
            inflight = self._inflight.task if self._inflight is not None else None
            tasks = [t for t in (connector, self._fetcher, stopped, inflight) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._shutdown_clients()

    def run_sync(self, fn: Callable[[Any], None]) -> None:
        """Blocking variant for plain functions, run in a pool of `max_concurrency` threads."""
        pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=self.name)

        async def call(record: Any) -> None:
            await asyncio.get_running_loop().run_in_executor(pool, fn, record)

        try:
            asyncio.run(self.run(call))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def request_stop(self) -> None:
        """Thread-safe: ask a running consumer to close gracefully."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.close()))

    async def close(self) -> None:
        """Graceful: stop dispatching, let in-flight records finish, report exact positions
        in a Leave so the next owners start where this one stopped (no duplicates)."""
        if self._closing:
            await self._stopped.wait()
            return
        self._closing = True
        self._membership.closing = True
        try:
            if self._lanes is not None:
                self.progress.begin_stop(self.progress.owned)
                self._lanes.drop()
                await self._lanes.wait_idle(timeout=self.drain_timeout_s)
            await self._membership.leave(self.progress.positions())
        finally:
            self._stopped.set()

    @property
    def owned_slots(self) -> list[tuple[int, int]]:
        return self.progress.owned.to_pairs()

    async def wait_registered(self, timeout: float) -> None:
        await asyncio.wait_for(self._membership.registered.wait(), timeout)

    @property
    def member_id(self) -> str | None:
        return self._membership.member_id

    @property
    def epoch(self) -> int:
        return self._membership.epoch

    @property
    def _session(self) -> int:
        return self._membership.session

    # ---- membership hooks (the connector itself is `Membership`) ------------------

    async def session_lost(self) -> None:
        """Consumer.onLostConnection: stop fetchers, drop queues, forget ownership."""
        self.progress.clear()
        self._windows.clear()
        if self._kafka is not None:
            self._kafka.pause(*self._kafka.assignment())
        if self._lanes is not None:
            await self._lanes.abort()
        self._unblocked.set()

    def ping_reply(self) -> tuple[PositionUpdate, dict[int, int], list[HighWatermark]]:
        load, self.load = self.load, fastpath.new_load()
        by_bucket = {bucket: n for bucket, n in enumerate(load) if n}
        return self.progress.positions(), by_bucket, self._high_watermarks()

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None:
        self._start(slots, positions)

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]:
        self.progress.begin_stop(slots)
        if self._lanes is not None:
            self._lanes.drop(slots)
        return self._finish_stop(slots)

    def _high_watermarks(self) -> list[HighWatermark]:
        if self._kafka is None:
            return []
        marks = []
        for tp in self._kafka.assignment():
            offset = self._kafka.highwater(tp)
            if offset is not None:
                marks.append(HighWatermark(topic=tp.topic, partition=tp.partition, offset=offset))
        return marks

    def _start(self, slots: Any, positions: Any) -> None:
        held = {tp: window.start for tp, window in self._windows.items()}
        running = {tp for tp, progress in self.progress.partitions.items() if progress.grants}
        seeks = self.progress.add_grant(slots, positions, held)
        self.stats.rewinds += len(running & seeks.keys())
        for tp, grant in self.progress.take_replays():
            records = self._windows[tp].between(grant.fetch_from, grant.replay_upto)
            self.stats.replayed += len(records)
            ktp = TopicPartition(*tp)
            self._backlog.insert(0, _Chunk(ktp, tp, None, self._session, records, replay=grant))
            self._unblocked.set()
            if self._fetch_waker is not None:
                _wake(self._fetch_waker, None)
        if self._kafka is None:
            return
        wanted = {TopicPartition(*tp) for tp in self.progress.partitions}
        current = set(self._kafka.assignment())
        if not wanted <= current:
            self._kafka.assign(sorted(current | wanted))
        for tp, offset in seeks.items():
            self._seek(tp, offset)
        self._kafka.resume(
            *[TopicPartition(*tp) for tp, p in self.progress.partitions.items() if p.grants]
        )

    async def _finish_stop(self, slots: Any) -> PositionUpdate:
        if self._lanes is not None:
            await self._lanes.wait_idle(slots)
        final = self.progress.finish_stop(slots)
        if self._kafka is not None:
            idle = [
                TopicPartition(*tp) for tp, p in self.progress.partitions.items() if not p.grants
            ]
            if idle:
                self._kafka.pause(*idle)
        return final

    # ---- fetcher --------------------------------------------------------------------

    def _start_fetcher(self) -> None:
        task = asyncio.create_task(self._fetch_loop(), name=f"{self.name}-fetcher")
        self._fetcher = task

    async def _fetch_loop(self) -> None:
        """The fetcher task. When a handler started inline suspends, this task stays with
        that handler (see `KeyLanes.dispatch`) and a new fetcher task takes over the rest
        of the backlog and the loop."""
        assert self._fetch_failed is not None and self._lanes is not None
        try:
            suspended = await self._fetch()
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            if not self._fetch_failed.done():
                self._fetch_failed.set_exception(err)
            return
        if suspended is None:
            # Closing: `close()` drains the lanes and sends the Leave, then sets `_stopped`,
            # which is what ends `run()`. Ending it here would cancel the connector and
            # abort in-flight handlers under the drain.
            return
        await self._lanes.adopt(suspended)

    async def _fetch(self) -> Suspended | None:
        """Fetch and dispatch until closing (None) or until a handler suspends inline (the
        `Suspended`, after starting the next fetcher task on what is left)."""
        assert self._kafka is not None
        kafka, backlog = self._kafka, self._backlog
        clock = asyncio.get_running_loop().time
        turn = clock()  # when the other tasks last had a turn
        while not self._closing:
            if backlog:
                began = clock()
                suspended = self._dispatch(backlog)
                self._fit_batch(clock() - began)  # the synchronous part of this turn
                if suspended is not None:
                    self._start_fetcher()
                    return suspended
                # While records are buffered getmany does not suspend, and handlers that
                # finish inline do not either: without this nothing else would ever run
                # (the connector left Pings unanswered). At most a batch past 20 ms.
                if clock() - turn >= _MAX_TURN_S:
                    await asyncio.sleep(0)
                    turn = clock()
                continue
            if not self.progress.partitions or not kafka.assignment():
                await asyncio.sleep(0.05)
                turn = clock()
                continue
            if self.progress.pending_count() >= self.max_pending:
                self._unblocked.clear()
                await self._unblocked.wait()
                turn = clock()
                continue
            fetch = self._inflight
            if fetch is None:
                # What aiokafka already holds, without waiting (and without a task: when
                # records stream in, they nearly always are there).
                generations = {tp: p.generation for tp, p in self.progress.partitions.items()}
                buffered = await kafka.getmany(timeout_ms=0, max_records=self._batch)
                if buffered:
                    self._queue_fetched(buffered, generations, self._session)
                    continue
                fetch = self._inflight = _Fetch(
                    asyncio.create_task(kafka.getmany(timeout_ms=200, max_records=self._batch)),
                    {tp: p.generation for tp, p in self.progress.partitions.items()},
                    self._session,
                )
            if not fetch.task.done():
                # A replay queued meanwhile is dispatched at once; the fetch stays out.
                # (One future and a callback per fetch: cheaper than asyncio.wait.)
                waker = self._fetch_waker = asyncio.get_running_loop().create_future()
                fetch.task.add_done_callback(partial(_wake, waker))
                try:
                    await waker
                finally:
                    self._fetch_waker = None
                turn = clock()
            if fetch.task.done():
                self._inflight = None
                self._queue_fetched(fetch.task.result(), fetch.generations, fetch.session)
        return None

    def _fit_batch(self, took: float) -> None:
        """Handlers that finish inline run synchronously, a whole batch in one turn of the
        event loop: with 1 ms of CPU each, 2,000 records blocked it for 2 s (Pings and
        StopFetchers waited). Halve the batch while one takes longer than a turn should,
        grow it back while they are quick."""
        if took > _MAX_TURN_S:
            self._batch = max(_MIN_BATCH, self._batch // 2)
        elif took < _MAX_TURN_S / 4:
            self._batch = min(_MAX_BATCH, self._batch * 2)

    def _queue_fetched(
        self,
        batches: dict[TopicPartition, list[Any]],
        generations: dict[tuple[str, int], int],
        session: int,
    ) -> None:
        """Append fetched records to the backlog, and to the replay windows of the
        partitions they still join up with (fetched at their current generation)."""
        for ktp, records in batches.items():
            self.stats.fetched += len(records)
            tp = (ktp.topic, ktp.partition)
            generation = generations.get(tp)
            progress = self.progress.partitions.get(tp)
            window = self._windows.get(tp)
            if window is not None and progress is not None and progress.generation == generation:
                if not progress.owns_everything:
                    window.append(records)
                elif records:  # held records keep the GC busy: ~10% of a no-op consumer
                    window.reset(records[-1].offset + 1)
            self._backlog.append(_Chunk(ktp, tp, generation, session, records))

    def _seek(self, tp: tuple[str, int], offset: int) -> None:
        assert self._kafka is not None
        self._kafka.seek(TopicPartition(*tp), offset)
        if self.replay_window:
            window = self._windows.get(tp)
            if window is None:
                self._windows[tp] = ReplayWindow(offset, self.replay_window)
            else:
                window.reset(offset)

    def _dispatch(self, backlog: list[_Chunk]) -> Suspended | None:
        """Filter and dispatch the records of `backlog` in order, consuming it; stops at
        the first handler that suspends inline. Synchronous: nothing else runs meanwhile."""
        assert self._kafka is not None and self._lanes is not None
        while backlog:
            chunk = backlog[0]
            progress = self.progress.partitions.get(chunk.tp)
            if progress is None or chunk.session != self._session:
                backlog.pop(0)
                continue
            replay = chunk.replay
            if replay is None and progress.generation != chunk.generation:
                self._seek(chunk.tp, progress.cursor)  # fetched before a rewind: refetch
                backlog.pop(0)
                continue
            if self._fast is not None and replay is None:
                suspended = self._dispatch_fast(chunk, progress)
            else:
                suspended = self._dispatch_records(chunk, progress, len(chunk.records))
            if suspended is not None:
                return suspended
            if replay is not None:
                replay.finish_replay()
            backlog.pop(0)
        return None

    def _dispatch_fast(self, chunk: _Chunk, progress: PartitionProgress) -> Suspended | None:
        """`_dispatch_records` for the whole chunk, mostly in C (consumer_client/fastpath.py)."""
        assert self._fast is not None and self._lanes is not None
        return fastpath.dispatch_chunk(
            self._fast, chunk, progress, self._lanes, self.ordering_header, self.load,
            self.stats, self._dispatch_records,
        )  # fmt: skip

    def _dispatch_records(
        self, chunk: _Chunk, progress: PartitionProgress, end: int
    ) -> Suspended | None:
        """Filter and dispatch `chunk.records[chunk.next:end]`; the reference implementation
        of the per-record path (the C fast path hands it every record it does not handle)."""
        assert self._lanes is not None
        dispatch, header = self._lanes.dispatch, self.ordering_header
        unkeyed = self._lanes.lane_key
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

    def _on_done(self, item: WorkItem) -> None:
        if item.session != self._session:
            return
        self.progress.ack(item.tp, item.offset)
        self.stats.processed += 1
        self.load[item.slot >> LOAD_BUCKET_SHIFT] += 1
        self._unblocked.set()

    async def _dead_letter(self, record: Any, error: BaseException) -> None:
        assert self._producer is not None and self.dead_letter_topic is not None
        headers = [
            *(record.headers or ()),
            ("keyshard-error", repr(error)[:1000].encode()),
            ("keyshard-source", f"{record.topic}/{record.partition}@{record.offset}".encode()),
        ]
        await self._producer.send_and_wait(
            self.dead_letter_topic, key=record.key, value=record.value, headers=headers
        )

    async def _shutdown_clients(self) -> None:
        for task in list(self._membership.tasks):
            task.cancel()
        if self._lanes is not None:
            await self._lanes.abort()
        for client in (self._kafka, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), 10)
        if self._membership.channel is not None:
            await self._membership.channel.aclose()
