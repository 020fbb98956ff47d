"""Replica beats, written and read on a thread of their own with its own event loop and
Kafka clients: whether a replica is alive must not depend on how busy it is.

A join storm of thousands of Registers holds a coordinator's event loop for seconds. Beats
written from that loop would stop meanwhile, and the other replicas would take a replica
that is merely busy for dead and its partitions over mid-storm; beats read on it would
leave its own view of everyone (itself included) as stale as the loop is late. Kafka's own
consumers heartbeat from a thread apart from their polling for the same reason. Here the
replica's liveness thread (`coordinator.storage.loop_thread`) holds the beat producer and
the beat reader; what they read is published as one immutable `BeatView`, which the main
loop reads whenever it decides (`view`), and the placement version the next beats carry
comes from the main loop as one int (`placement_version`).

What still stops the beats is what should: a process killed, frozen (SIGSTOP stops every
thread), or cut off from Kafka.

Times are `time.monotonic()`, the clock asyncio's loops read: the main loop compares them
with its own `loop.time()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import TopicAuthorizationFailedError

from keyshard.coordinator.storage.kafka_cluster import (
    FETCH_WAIT_MS,
    RETRY_S,
    TAIL_POLL_MS,
    denied,
)
from keyshard.coordinator.storage.log_format import ReplicaBeat, encode
from keyshard.coordinator.storage.loop_thread import LoopThread
from keyshard.coordinator.storage.record_reader import RecordReader
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.kafka.connect import start_client
from keyshard.core.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)
BEAT_PARTITION = 0  # of the state topic
HISTORY = -(10**9)  # what a beat from before we started counts as: long gone


@dataclass(frozen=True, slots=True)
class SeenBeat:
    beat: ReplicaBeat
    # How many of our own beats we had read when this one came: liveness is measured in
    # our own beats written since (log order), never by a clock. A clock would declare
    # everyone dead to a replica waking from a freeze before it read what they wrote
    # meanwhile, and would compare two machines' clocks.
    own_beats_before: int


@dataclass(frozen=True, slots=True)
class BeatView:
    """What the beat thread has read and written so far (times: `time.monotonic()`)."""

    beats: Mapping[str, SeenBeat] = field(default_factory=dict)
    own_beats: int = 0  # our own beats read back from the log
    # When the last of them was read back: a replica whose beats stop coming back is cut
    # off from Kafka, and the others will soon take over.
    own_beat_seen_at: float = 0.0
    # When the last beat Kafka acknowledged was sent: it is in the log, so the others read
    # it before counting us gone, however far our own reading lags.
    own_beat_acked_at: float = 0.0
    other_beat_seen_at: float | None = None  # a live beat of another replica

    def alive(self, within_own_beats: int) -> dict[str, ReplicaBeat]:
        """Replicas whose latest beat came after our own last `within_own_beats` beats
        and did not say they are leaving (this one is alive as long as it can beat)."""
        return {
            rid: s.beat
            for rid, s in self.beats.items()
            if self.own_beats - s.own_beats_before < within_own_beats and not s.beat.leaving
        }

    def read(
        self, beats: Iterable[tuple[int, ReplicaBeat]], me: str, live_from: int, now: float
    ) -> BeatView:
        """The view after reading `beats` (offset, beat) of the beat partition, in log
        order, at `now`."""
        seen = dict(self.beats)
        own, own_at, other_at = self.own_beats, self.own_beat_seen_at, self.other_beat_seen_at
        for offset, beat in beats:
            if offset < live_from:  # from before we started: history, not proof of life
                seen[beat.replica_id] = SeenBeat(beat, HISTORY)
                continue
            if beat.replica_id == me:
                own, own_at = own + 1, now
            else:
                other_at = now
            seen[beat.replica_id] = SeenBeat(beat, own)
        return replace(
            self, beats=seen, own_beats=own, own_beat_seen_at=own_at, other_beat_seen_at=other_at
        )


class ReplicaBeats:
    """Beats of one replica on the state topic's partition 0, written and read on the
    replica's liveness thread (see the module docstring). Beats go outside transactions
    and are read uncommitted: an open transaction on partition 0 must not make live
    replicas look dead."""

    def __init__(
        self,
        thread: LoopThread,
        bootstrap: str,
        topic: str,
        *,
        settings: KafkaSettings,
        replica_id: str,
        address: str,
        admin_url: str,
        secret: ReplicaSecret | None,
        timeout: float,
    ) -> None:
        self.thread = thread
        self.bootstrap = bootstrap
        self.topic = topic
        self.settings = settings
        self.replica_id = replica_id
        self.address = address
        self.admin_url = admin_url
        self.secret = secret
        self.timeout = timeout
        # The placement the next beats say this replica acts on (written by the main loop).
        self.placement_version = 0
        # Its own: a reader's throttled log lines are not shared between threads.
        self._records = RecordReader(topic, secret)
        self._lock = threading.Lock()
        self._view = BeatView()
        self._live_from = 0  # partition-0 offset from which beats are not history
        self._producer: AIOKafkaProducer | None = None
        self._reader: AIOKafkaConsumer | None = None
        self._reading_task: asyncio.Task[None] | None = None
        self._beating_task: asyncio.Task[Any] | None = None

    @property
    def view(self) -> BeatView:
        with self._lock:
            return self._view

    # ---- called from the main loop ------------------------------------------------------

    async def start(self) -> None:
        """Start the producer and the reader on the thread, and write a first beat (a
        principal that may not write is told now, not later)."""
        try:
            await self.thread.run(self._open())
        except BaseException:
            await self.stop()
            raise

    def beat_every(self, interval_s: float) -> None:
        """From now on, beat every `interval_s` on the thread, whatever the main loop does."""
        self.thread.spawn(self._beating(interval_s))

    async def beat(self, *, leaving: bool = False) -> None:
        """Write one beat now and wait until Kafka has it. A leaving beat is the last: the
        periodic beats stop first (one after it would say this replica is back)."""
        await self.thread.run(self._leave() if leaving else self._write(leaving=False))

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.thread.run(self._close()), 3 * self.timeout)
        self._records.flush()

    # ---- on the thread ------------------------------------------------------------------

    async def _open(self) -> None:
        options = self.settings.client_options()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=0, **options
        )
        await start_client(
            self._producer, self.bootstrap, self.settings, "beat producer", self.timeout
        )
        await self._write(leaving=False)
        reading = {**self.settings.consumer_options(), "isolation_level": "read_uncommitted"}
        self._reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False,
            fetch_max_wait_ms=FETCH_WAIT_MS, **reading,
        )  # fmt: skip
        await start_client(self._reader, self.bootstrap, self.settings, "beat reader", self.timeout)
        zero = KafkaTP(self.topic, BEAT_PARTITION)
        self._reader.assign([zero])
        await self._reader.seek_to_beginning(zero)
        end = await asyncio.wait_for(self._reader.end_offsets([zero]), self.timeout)
        self._live_from = int(end[zero])
        self._reading_task = asyncio.create_task(self._reading(), name="beat-reader")

    async def _leave(self) -> None:
        await _cancelled(self._beating_task)
        await self._write(leaving=True)

    async def _close(self) -> None:
        for task in (self._reading_task, self._beating_task):
            await _cancelled(task)
        for client in (self._producer, self._reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), self.timeout)
        self._producer = self._reader = None

    async def _beating(self, interval_s: float) -> None:
        self._beating_task = asyncio.current_task()
        while True:
            try:
                await self._write(leaving=False)
            except Exception as err:  # a dead beat task would get us taken for dead
                log.warning("replica beat failed: %s", err)
            await asyncio.sleep(interval_s)

    async def _write(self, leaving: bool) -> None:
        beat = ReplicaBeat(
            self.replica_id, self.address, self.admin_url, int(time.time() * 1000), leaving,
            self.placement_version,
        )  # fmt: skip
        assert self._producer is not None
        sent = time.monotonic()
        value = encode(beat)
        headers = None
        if self.secret is not None:
            headers = self.secret.headers(self.topic, BEAT_PARTITION, beat.key, value)
        sending = self._producer.send_and_wait(
            self.topic, value, beat.key, partition=BEAT_PARTITION, headers=headers
        )
        try:
            await asyncio.wait_for(sending, self.timeout)
        except TopicAuthorizationFailedError as err:
            raise denied(self.settings, self.topic, "Write", err) from None
        with self._lock:
            acked = max(self._view.own_beat_acked_at, sent)
            self._view = replace(self._view, own_beat_acked_at=acked)

    async def _reading(self) -> None:
        assert self._reader is not None
        reader = self._reader
        while True:
            try:
                batches = await reader.getmany(timeout_ms=TAIL_POLL_MS)
            except Exception as err:  # a dead reader would take every replica for dead
                why: BaseException = err
                if isinstance(err, TopicAuthorizationFailedError):
                    why = denied(self.settings, self.topic, "Read", err)
                log.warning("reading replica beats failed (retrying): %s", why)
                await asyncio.sleep(RETRY_S)
                continue
            beats = [
                (record.offset, beat)
                for records in batches.values()
                for record in records
                if (beat := self._records.beat(record)) is not None
            ]
            if beats:
                with self._lock:
                    self._view = self._view.read(
                        beats, self.replica_id, self._live_from, time.monotonic()
                    )


async def _cancelled(task: asyncio.Task[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
