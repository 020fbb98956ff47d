"""The fetch loop: one aiokafka consumer with manual assignment, shared by every grant.

The fetcher reads each partition from the lowest position any grant needs and hands the
records to the dispatcher in fetch order, chunk by chunk. It keeps a replay window of
recent records per partition (`_datapath.window`), so a grant a little behind the fetch
position replays them from memory instead of seeking back; and it applies StartFetcher
(`grant`) and StopFetcher (`pause_idle`) to the Kafka client's assignment.

What it holds is bounded by the consumer's memory budget (`_datapath.budget`): fetching
stops while the records waiting in the backlog and in flight in the lanes use it up, a
fetched batch is taken up to the record that uses it up (the rest is put back: the
partition is sought to it and fetched again later), and the replay windows give way
first. Stopping means not asking aiokafka for records: it then keeps at most one fetched
response per partition and sends no more fetches for those partitions (pausing them in
aiokafka would throw that response away). `max_pending` bounds the count of records in
flight as well: per-record bookkeeping, for records so small that bytes say little.

Records of a topic in transition (its partition count changed lately) go through the
merge gate (`_datapath.merge`) on their way to the backlog: they are admitted in
timestamp order across the topic's partitions. Records it holds count against
`max_pending` and the budget; when either is full, only the partitions the gate waits for
are fetched, a record or more each, past the budget if need be (else the gate could never
let go). Only then does any of this run: otherwise fetched chunks go to the backlog as
they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from keyshard.consumer_client._datapath import fastpath
from keyshard.consumer_client._datapath.budget import BufferBudget, record_size
from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.consumer_client._datapath.dispatch import Dispatcher
from keyshard.consumer_client._datapath.lanes import Suspended
from keyshard.consumer_client._datapath.merge import MergeGate, TopicTransition
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.reach import FetchReach
from keyshard.consumer_client._datapath.stats import ConsumerStats
from keyshard.consumer_client._datapath.window import ReplayWindows
from keyshard.core.model.positions import PositionUpdate, TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.messages import HighWatermark

log = logging.getLogger(__name__)
_MAX_TURN_S = 0.02  # the fetch loop gives other tasks a turn at least this often
_MAX_BATCH = 2000  # records per getmany
_MIN_BATCH = 8
_EVERYTHING = 2**62  # a room no list of records fills: `take` then measures them all
_OVERSIZED_LOG_EVERY_S = 60.0  # a record larger than the budget: warned about this often


def _wake(waker: asyncio.Future[None], _: object) -> None:
    if not waker.done():
        waker.set_result(None)


@dataclass(slots=True)
class _Fetch:
    """A getmany in flight, with what it was sent under: it outlives a fetcher task that
    stays with a suspended handler, and a replay may be dispatched while it is out."""

    task: asyncio.Task[dict[KafkaTP, list[Any]]]
    generations: dict[TopicPartition, int]
    session: int


class Fetcher:
    def __init__(
        self,
        progress: ConsumerProgress,
        stats: ConsumerStats,
        dispatcher: Dispatcher,
        kafka: AIOKafkaConsumer,
        *,
        name: str,
        max_pending: int,
        budget: BufferBudget,
        replay_window: int,
        read_committed: bool,
        session: Callable[[], int],
        room: asyncio.Event,
    ) -> None:
        self.progress = progress
        self.stats = stats
        self.dispatcher = dispatcher
        self.kafka = kafka  # started, with manual assignment
        self.name = name
        self.max_pending = max_pending
        self.budget = budget
        # Fetched records held per partition so a grant a little behind the fetch position
        # replays them instead of rewinding the partition (`_datapath.window`).
        self.replay_window = replay_window
        # Reading committed data only: the partition end that bounds what can be read is
        # the last stable offset (see `high_watermarks`).
        self.read_committed = read_committed
        self._session = session  # the current registration: older work is stale
        self.closing = False
        self.windows = ReplayWindows(budget, replay_window)
        # The offset after the last record fetched per partition: the fetch lag metric.
        self.fetched_upto: dict[TopicPartition, int] = {}
        # Set whenever a fetcher held back by `max_pending` should look again: an ack (the
        # dispatcher's), a lost session, a replay queued (its records are owed, not new
        # work).
        self.room = room
        # Fetched (or replayed) records not dispatched yet, shared by successive fetcher
        # tasks; a replay is put at its front (all of it lies below what is queued).
        self.backlog: list[Chunk] = []
        self._backlog_bytes = 0  # its records' bytes: with the gate's, the budget's waiting
        self._take = fastpath.take  # the budget's `take`, in C when it is built
        self._oversized_logged = -_OVERSIZED_LOG_EVERY_S
        # Fails when the fetch loop fails, whichever task runs it (created by `start`).
        self.failed: asyncio.Future[None] | None = None
        # Resolved by the fetch in flight completing or by a replay being queued.
        self._waker: asyncio.Future[None] | None = None
        self._inflight: _Fetch | None = None
        self._batch = _MIN_BATCH  # records per getmany: grows while batches are quick
        self._task: asyncio.Task[None] | None = None
        # Topics in transition: records admitted in timestamp order (`_datapath.merge`).
        self.merge = MergeGate()
        self._merge_paused: set[KafkaTP] = set()  # paused while the gate is full
        # Since when each partition asked of Kafka has gone unfetched (`observe_reach`).
        self.reach = FetchReach()
        self._held_back = False  # waited for room since the last `observe_reach`
        self._waiting_room = False
        # Only the partitions the merge gate waits for are fetched: a record each is
        # taken past the budget.
        self._gate_bound = False

    # ---- the fetcher task -----------------------------------------------------------

    def start(self) -> None:
        """Start a fetcher task. When a handler started inline suspends, that task stays
        with the handler (see `KeyLanes.dispatch`) and calls this for a new one."""
        if self.failed is None:
            self.failed = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-fetcher")

    def tasks(self) -> list[asyncio.Task[Any]]:
        """The current fetcher task and the fetch in flight: earlier fetcher tasks became
        lane workers (the lanes' `abort` ends them)."""
        inflight = self._inflight.task if self._inflight is not None else None
        return [t for t in (self._task, inflight) if t is not None]

    async def _run(self) -> None:
        assert self.failed is not None
        try:
            suspended = await self.fetch()
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            if not self.failed.done():
                self.failed.set_exception(err)
            return
        if suspended is None:
            # Closing: `close()` drains the lanes and sends the Leave, then ends `run()`.
            # Ending it here would cancel the connector and abort in-flight handlers
            # under the drain.
            return
        await self.dispatcher.lanes.adopt(suspended)

    async def fetch(self) -> Suspended | None:
        """Fetch and dispatch until closing (None) or until a handler suspends inline (the
        `Suspended`, after starting the next fetcher task on what is left)."""
        kafka, backlog = self.kafka, self.backlog
        clock = asyncio.get_running_loop().time
        turn = clock()  # when the other tasks last had a turn
        while not self.closing:
            if backlog:
                began = clock()
                suspended = self.dispatch(backlog)
                self._fit_batch(clock() - began)  # the synchronous part of this turn
                if suspended is not None:
                    self.start()
                    return suspended
                # While records are buffered getmany does not suspend, and handlers that
                # finish inline do not either: without this nothing else would run (the
                # connector would leave Pings unanswered). At most a batch past 20 ms.
                if clock() - turn >= _MAX_TURN_S:
                    await asyncio.sleep(0)
                    turn = clock()
                continue
            if not self.progress.partitions or not kafka.assignment():
                await asyncio.sleep(0.05)
                turn = clock()
                continue
            fits = self.budget.may_fetch()
            if not fits or self.progress.pending_count() + self.merge.held >= self.max_pending:
                if self._fetch_only_waited():
                    self._gate_bound = True
                else:
                    self.room.clear()
                    self._held_back = self._waiting_room = True
                    try:
                        await self.room.wait()
                    finally:
                        self._waiting_room = False
                    turn = clock()
                    continue
            else:
                self._gate_bound = False
                if self._merge_paused:
                    self._resume_merge_paused()
            fetch = self._inflight
            if fetch is None:
                # What aiokafka already holds, without waiting (and without a task: when
                # records stream in, they nearly always are there).
                generations = {tp: p.generation for tp, p in self.progress.partitions.items()}
                batch = self.budget.batch(self._batch)
                buffered = await kafka.getmany(timeout_ms=0, max_records=batch)
                if buffered:
                    self.queue_fetched(buffered, generations, self._session())
                    if self.merge.topics:
                        self._merge_caught_up()
                    continue
                fetch = self._inflight = _Fetch(
                    asyncio.create_task(kafka.getmany(timeout_ms=200, max_records=batch)),
                    {tp: p.generation for tp, p in self.progress.partitions.items()},
                    self._session(),
                )
            if not fetch.task.done():
                # A replay queued meanwhile is dispatched at once; the fetch stays out.
                # (One future and a callback per fetch: cheaper than asyncio.wait.)
                waker = self._waker = asyncio.get_running_loop().create_future()
                fetch.task.add_done_callback(partial(_wake, waker))
                try:
                    await waker
                finally:
                    self._waker = None
                turn = clock()
            if fetch.task.done():
                self._inflight = None
                fetched = fetch.task.result()
                self.queue_fetched(fetched, fetch.generations, fetch.session)
                if not any(fetched.values()):
                    await self._step_over_gaps()
                if self.merge.topics:
                    self._merge_caught_up()
        return None

    async def _step_over_gaps(self) -> None:
        """After a fetch that brought nothing: move each caught-up partition's cursor to
        the client's fetch position. Offsets a fetch steps over without a record for us
        (transaction markers; aborted records when reading committed data) are otherwise
        only passed once a later record arrives, so a partition ending in a commit
        marker would keep its positions one short of the end: lag that never clears,
        and a position that is not the partition's end in the tools."""
        queued = {chunk.tp for chunk in self.backlog}
        for tp, progress in list(self.progress.partitions.items()):
            if not progress.grants or tp in queued or self.merge.holding(tp):
                continue
            generation = progress.generation
            position = await self.kafka.position(KafkaTP(*tp))
            if progress.generation == generation and position > progress.cursor:
                progress.cursor = position

    def _fit_batch(self, took: float) -> None:
        """Handlers that finish inline run synchronously, a whole batch in one turn of the
        event loop: with 1 ms of CPU each, 2,000 records would block it for 2 s (Pings
        and StopFetchers waiting). Halve the batch while one takes longer than a turn
        should, grow it back while they are quick."""
        if took > _MAX_TURN_S:
            self._batch = max(_MIN_BATCH, self._batch // 2)
        elif took < _MAX_TURN_S / 4:
            self._batch = min(_MAX_BATCH, self._batch * 2)

    def queue_fetched(
        self,
        batches: dict[KafkaTP, list[Any]],
        generations: dict[TopicPartition, int],
        session: int,
    ) -> None:
        """Append fetched records to the backlog, as far as the budget takes them (the
        rest is put back), and to the replay windows of the partitions they still join up
        with (fetched at their current generation)."""
        budget = self.budget
        room, largest = budget.room(), 0
        current = session == self._session()
        for ktp, records in batches.items():
            tp = (ktp.topic, ktp.partition)
            generation = generations.get(tp)
            progress = self.progress.partitions.get(tp)
            joins_up = progress is not None and progress.generation == generation
            if not (current and joins_up):
                # Stale: queued whole, as fetched, for the dispatcher to drop (and to seek
                # the partition back to its cursor, when it was rewound meanwhile).
                size = self._take(records, _EVERYTHING)[1]
                self.stats.fetched += len(records)
                self.backlog.append(Chunk(tp, generation, session, records, size=size))
                self._backlog_bytes += size
                continue
            if self._gate_bound:
                room = max(room, 1)  # the gate waits for this partition: a record at least
            count, size, biggest = self._take(records, room)
            if count < len(records):
                self.kafka.seek(ktp, records[count].offset)  # put back: fetched later
                records = records[:count]
            room -= size
            largest = max(largest, biggest)
            self.stats.fetched += len(records)
            if not records:
                continue
            self.fetched_upto[tp] = records[-1].offset + 1
            window = self.windows.get(tp)
            if window is not None:
                assert progress is not None
                if not progress.owns_everything:
                    self.windows.append(window, records, size)
                else:  # held records keep the GC busy: ~10% of a no-op consumer
                    self.windows.reset(window, records[-1].offset + 1)
            chunk = Chunk(tp, generation, session, records, size=size)
            if self.merge.topics and self.merge.merging(tp[0]):
                self._enqueue(self.merge.feed(chunk))
            else:
                self.backlog.append(chunk)
                self._backlog_bytes += size
        if largest:
            budget.largest = largest
            if largest > budget.limit:
                self._warn_oversized(batches, largest)
        self._count_waiting()

    def _warn_oversized(self, batches: dict[KafkaTP, list[Any]], largest: int) -> None:
        now = time.monotonic()
        if now - self._oversized_logged < _OVERSIZED_LOG_EVERY_S:
            return
        self._oversized_logged = now
        where = next(
            f"{ktp.topic}[{ktp.partition}]@{record.offset}"
            for ktp, records in batches.items()
            for record in records
            if record_size(record) == largest
        )
        log.warning(
            "%s: record %s is %d bytes, more than the whole memory budget "
            "(max_buffer_bytes=%d): taken anyway (a record is taken whenever the budget "
            "is not used up), so memory goes past the budget; raise max_buffer_bytes "
            "above the largest record",
            self.name, where, largest, self.budget.limit,
        )  # fmt: skip

    def _enqueue(self, chunks: list[Chunk]) -> None:
        self.backlog += chunks
        self._backlog_bytes += sum(chunk.size for chunk in chunks)

    def _count_waiting(self) -> None:
        """The budget's waiting: the backlog and the merge gate. Less of it than before
        leaves the windows more room; more of it makes them give way."""
        self.budget.waiting = self._backlog_bytes + self.merge.held_bytes
        self.windows.fit()

    def dispatch(self, backlog: list[Chunk]) -> Suspended | None:
        """Dispatch the chunks of `backlog` in order, consuming it; stops at the first
        handler that suspends inline. Chunks fetched for an older session are dropped,
        and those fetched before a rewind are fetched again. A chunk's records count as
        waiting until they go to a lane (in flight) or the chunk leaves the backlog (done,
        or only in the replay window)."""
        session = self._session()
        try:
            while backlog:
                chunk = backlog[0]
                progress = self.progress.partitions.get(chunk.tp)
                if progress is None or chunk.session != session:
                    self._pop(backlog)
                    continue
                replay = chunk.replay
                if replay is None and progress.generation != chunk.generation:
                    self.seek(chunk.tp, progress.cursor)  # fetched before a rewind: refetch
                    self._pop(backlog)
                    continue
                entered = self.budget.in_flight
                suspended = self.dispatcher.dispatch_chunk(chunk, progress)
                # Records that went to a lane count in flight from now on, not as waiting
                # (nothing completes in a lane during this synchronous call).
                moved = self.budget.in_flight - entered
                if moved:
                    chunk.size -= moved
                    if backlog is self.backlog:
                        self._backlog_bytes -= moved
                if suspended is not None:
                    return suspended
                if replay is not None:
                    replay.finish_replay()
                self._pop(backlog)
            return None
        finally:
            # Records leave the backlog done or into flight: the windows' room does not
            # shrink, so they need no fitting (`_count_waiting`), only the count.
            self.budget.waiting = self._backlog_bytes + self.merge.held_bytes

    def _pop(self, backlog: list[Chunk]) -> None:
        chunk = backlog.pop(0)
        if backlog is self.backlog:
            self._backlog_bytes -= chunk.size

    # ---- ownership, applied to the Kafka client -------------------------------------

    def grant(self, slots: RangeSet, positions: PositionUpdate) -> None:
        """StartFetcher: own `slots` from `positions`; replay held records where the grant
        is behind the fetch position, else seek the partition back."""
        # In transition, a partition is read again rather than replayed from memory: a
        # replay would not go through the merge gate.
        held = {
            tp: window.start for tp, window in self.windows.items() if not self.merge.merging(tp[0])
        }
        running = {tp for tp, progress in self.progress.partitions.items() if progress.grants}
        seeks = self.progress.add_grant(slots, positions, held)
        seeks |= self._refetch_let_out(seeks)
        self.stats.rewinds += len(running & seeks.keys())
        for tp in seeks:
            self.merge.rewound(tp)
        replays = [
            (tp, grant, self.windows[tp].between(grant.fetch_from, grant.replay_upto))
            for tp, grant in self.progress.take_replays()
        ]  # all taken before the windows give way to them (`_count_waiting`)
        for tp, grant, records in replays:
            self.stats.replayed += len(records)
            size = self._take(records, _EVERYTHING)[1]
            replay = Chunk(tp, None, self._session(), records, replay=grant, size=size)
            self.backlog.insert(0, replay)
            self._backlog_bytes += size
        if replays:
            self._count_waiting()
            self.room.set()
            if self._waker is not None:
                _wake(self._waker, None)
        wanted = {KafkaTP(*tp) for tp in self.progress.partitions}
        current = set(self.kafka.assignment())
        if not wanted <= current:
            self.kafka.assign(sorted(current | wanted))
        for tp, offset in seeks.items():
            self.seek(tp, offset)
        self.kafka.resume(*[KafkaTP(*tp) for tp, p in self.progress.partitions.items() if p.grants])
        self._merge_track()

    def _refetch_let_out(self, rewound: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """A partition of a topic in transition is read again from further back, for a
        range just granted. Records of the partitions that wait on it, let out by the
        gate and not examined yet, were let out against its old watermark: a record of
        the new range among them may be newer than one of its key the rewound partition
        is about to bring back. They are read again through the gate, from their
        cursors (nothing examined is undone)."""
        if not rewound or not self.merge.topics:
            return {}  # no topic in transition: nothing let out against a watermark
        queued = {chunk.tp for chunk in self.backlog if chunk.replay is None}
        return {
            tp: self.progress.refetch(tp)
            for tp in self.merge.waiting_on(rewound)
            if tp not in rewound and tp in queued
        }

    def pause_idle(self) -> None:
        """After a StopFetcher: partitions with no grant left are not fetched."""
        idle = [KafkaTP(*tp) for tp, p in self.progress.partitions.items() if not p.grants]
        if idle:
            self.kafka.pause(*idle)
        self._merge_track()

    def forget(self) -> None:
        """The session is lost: fetch nothing, hold nothing."""
        self.windows.clear()
        self.merge.clear()
        self._merge_paused.clear()
        self._count_waiting()
        self.kafka.pause(*self.kafka.assignment())

    # ---- topics that change ---------------------------------------------------------

    def begin_transitions(self, transitions: Iterable[TopicTransition]) -> None:
        """Topics in transition, as a StartFetcher lists them (before its grant)."""
        transitions = list(transitions)
        started = [t.topic for t in transitions if not self.merge.merging(t.topic)]
        self.merge.begin(transitions)
        if started:
            log.info("%s: topic(s) %s in transition: records admitted in timestamp order",
                     self.name, ", ".join(started))  # fmt: skip
        self._merge_track()

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions no longer in the group: fetch them no more, forget them."""
        gone = [tp for tp in tps if tp in self.progress.partitions]
        if not gone:
            return
        self.progress.drop(gone)
        for tp in gone:
            self.windows.pop(tp)
            self.fetched_upto.pop(tp, None)
            self.merge.rewound(tp)
        kept = set(self.kafka.assignment()) - {KafkaTP(*tp) for tp in gone}
        self.kafka.assign(sorted(kept))
        self._merge_paused &= kept
        self._merge_track()

    def _merge_track(self) -> None:
        if self.merge.topics:
            fetched = [tp for tp, p in self.progress.partitions.items() if p.grants]
            self._admitted(self.merge.track(fetched))

    def _admitted(self, chunks: list[Chunk]) -> None:
        if chunks:
            self._enqueue(chunks)
            if self._waker is not None:
                _wake(self._waker, None)
        self._count_waiting()  # a partition no longer fetched lets go of what it held
        for transition in self.merge.ended:
            log.info("%s: topic %s: transition over, records flow as fetched",
                     self.name, transition.topic)  # fmt: skip
        self.merge.ended.clear()

    def _merge_caught_up(self) -> None:
        """Partitions in transition fetched up to their end: past every record there."""
        now_ms = int(time.time() * 1000)
        for mark in self.high_watermarks():
            tp = (mark.topic, mark.partition)
            if self.merge.merging(mark.topic) and self.fetched_upto.get(tp, -1) >= mark.offset:
                self._admitted(self.merge.caught_up(tp, now_ms))

    def _fetch_only_waited(self) -> bool:
        """The pending limit is reached with records held by the gate: fetch only the
        partitions it waits for (False: it waits for none, so wait for room instead)."""
        waited = {KafkaTP(*tp) for tp in self.merge.waited_on() if tp in self.progress.partitions}
        if not waited or not self.merge.held:
            return False
        others = set(self.kafka.assignment()) - waited - self._merge_paused
        if others:
            self.kafka.pause(*others)
            self._merge_paused |= others
        back = waited & self._merge_paused
        if back:
            self.kafka.resume(*back)
            self._merge_paused -= back
        return True

    def _resume_merge_paused(self) -> None:
        granted = {KafkaTP(*tp) for tp, p in self.progress.partitions.items() if p.grants}
        self.kafka.resume(*(self._merge_paused & granted))
        self._merge_paused.clear()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.fetched_upto[tp] = offset
        self.kafka.seek(KafkaTP(*tp), offset)
        self.windows.seek(tp, offset)

    def observe_reach(self, now: float) -> None:
        """Feed `reach` the poll timestamps of the partitions asked of Kafka now: the
        granted ones not paused, none while fetching was held back since the last look."""
        polled: dict[TopicPartition, int | None] = {}
        if not (self._held_back or self._waiting_room or self.backlog):
            assigned, paused = self.kafka.assignment(), self.kafka.paused()
            for tp, progress in self.progress.partitions.items():
                ktp = KafkaTP(*tp)
                if progress.grants and ktp in assigned and ktp not in paused:
                    polled[tp] = self.kafka.last_poll_timestamp(ktp)
        self._held_back = False
        self.reach.observe(polled, now)

    def fetch_lag(self) -> dict[TopicPartition, int]:
        """Per assigned partition: records between what was fetched and its end."""
        return {
            (mark.topic, mark.partition): max(
                0, mark.offset - self.fetched_upto.get((mark.topic, mark.partition), mark.offset)
            )
            for mark in self.high_watermarks()
        }

    def high_watermarks(self) -> list[HighWatermark]:
        """Each assigned partition's end as the last fetch saw it (the lag reference): the
        last stable offset when reading committed data (records after an open transaction
        are not readable yet, so they are not lag this consumer could work off)."""
        stable = self.read_committed
        marks = []
        for tp in self.kafka.assignment():
            offset = self.kafka.last_stable_offset(tp) if stable else self.kafka.highwater(tp)
            if offset is not None:
                marks.append(
                    HighWatermark(
                        topic=tp.topic, partition=tp.partition, offset=offset, stable=stable
                    )
                )
        return marks
