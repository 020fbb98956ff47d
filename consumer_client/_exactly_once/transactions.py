"""Exactly-once read-process-write: a handler's outputs and the positions of the records it
consumed commit in one Kafka transaction (docs/protocol.md §13).

How a record's output and its position stay together: a handler gets an `Outputs` to send
through, and what it sends is only buffered. When the handler returns, its outputs join
the *batch* of the current commit interval in the same event-loop step in which the lanes
acknowledge the record (no await in between), so at any moment "the record is done" and
"its outputs are in a batch" are one fact. A commit takes, in one synchronous step, the
batch and the consumer's positions (`ConsumerProgress.positions()`: everything examined
minus what is pending); then, in one transaction, it sends the batch and a writer record
(`_exactly_once.txn_log`) holding those positions and the slots this member owns, and
commits. Records done after the cut wait for the next commit. The batch waits at most an
interval, and less once its outputs reach a quarter of the consumer's memory budget
(`max_batch_bytes`): it is committed at once then, so outputs held never grow with the
throughput.

The coordinator only ever hears committed positions: Ping replies, StopFetcher replies
(a commit is forced after the range drained), Leave and claims report the positions of
the last commit. So the coordinator is never ahead of what is committed (nothing
skipped); it may be behind, so an owner starting a range unites the coordinator's
positions with what every writer committed (nothing done twice), after fencing every
earlier writer that still claims those slots (a zombie cannot commit afterwards).

A commit that fails is retried with the same batch and positions (the records are done as
far as the lanes know, so the batch must not be lost); a fenced producer or a commit that
keeps failing stops the consumer with a `ConsumerError` (its positions die with it: the
coordinator only has committed ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, ProducerFenced

from keyshard.consumer_client._datapath.dispatch import Dispatcher
from keyshard.consumer_client._datapath.fetcher import Fetcher
from keyshard.consumer_client._datapath.hooks import ConsumerHooks
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._errors import ConsumerError
from keyshard.consumer_client._exactly_once.txn_log import (
    TxnLog,
    TxnLogError,
    WriterRecord,
    merge_positions,
    start_positions,
)
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.positions import PositionUpdate, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import EMPTY, RangeSet

log = logging.getLogger(__name__)

#: Attempts of one commit (same batch, same positions) before the consumer gives up.
COMMIT_ATTEMPTS = 5
COMMIT_BACKOFF_S = 0.2
#: Kafka aborts a transaction left open this long (a member killed mid-commit); a new
#: owner fences it sooner. Far above any commit interval plus one commit.
TRANSACTION_TIMEOUT_MS = 60_000


class WriterState(enum.Enum):
    STARTING = "starting"
    OPEN = "open"  # committing every interval
    FAILED = "failed"  # fenced, or a commit kept failing: the consumer stops
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Output:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partition: int | None

    def size(self) -> int:
        """Its bytes, as the memory budget counts a record's (`_datapath.budget`)."""
        size = len(self.key or b"") + len(self.value or b"")
        return size + sum(len(name) + len(value or b"") for name, value in self.headers)


class Outputs:
    """Where an exactly-once handler sends its records: they are written in the
    transaction that also commits the position of the record being handled, or never.
    Records of a failed attempt are dropped with it."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        self.records: list[Output] = []

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        partition: int | None = None,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"output topic must be a non-empty string, not {topic!r}")
        for name, data in (("value", value), ("key", key)):
            if data is not None and not isinstance(data, bytes):
                raise TypeError(f"output {name} must be bytes or None, not {type(data).__name__}")
        self.records.append(Output(topic, value, key, tuple(headers or ()), partition))


ExactlyOnceHandler = Callable[[Any, Outputs], Awaitable[None]]


@dataclass(slots=True)
class _Preparing:
    """A StartFetcher being taken over (fence, read, claim) before it is dispatched;
    a StopFetcher meanwhile takes its slots out of `slots`."""

    slots: RangeSet
    task: asyncio.Task[None] | None = None


class TransactionalWriter:
    """One member's transactional producer, its batch and its commit loop."""

    def __init__(
        self,
        *,
        progress: ConsumerProgress,
        txn_log: TxnLog,
        bootstrap: str,
        kafka: KafkaSettings,
        name: str,
        interval_ms: int,
        max_batch_bytes: int,
    ) -> None:
        self.progress = progress
        self.txn_log = txn_log
        self.bootstrap = bootstrap
        self.kafka = kafka
        self.name = name
        self.interval_s = interval_ms / 1000
        self.state = WriterState.STARTING
        self.txid = self._new_txid()
        self.producer: AIOKafkaProducer | None = None
        self.batch: list[Output] = []
        self.batch_bytes = 0  # of the batch's keys, values and headers
        self.max_batch_bytes = max_batch_bytes  # a commit is due at once at this many
        self._commit_due = asyncio.Event()
        # Bumped when the session is lost: outputs of handlers started before are dropped.
        self.generation = 0
        self.committed: PositionUpdate = {}  # positions of the last commit: what we report
        self.preparing: list[_Preparing] = []
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._history: dict[TopicPartition, RangePositionMap] = {}
        self._written: tuple[RangeSet, PositionUpdate] | None = None
        self._retire: list[WriterRecord] = []
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None

    def _new_txid(self) -> str:
        return f"{self.txn_log.prefix}.{self.txn_log.group}.{self.name}.{uuid.uuid4().hex[:12]}"

    # ---- life cycle -----------------------------------------------------------------

    async def start(self) -> None:
        """The transaction log and our producer; a broker without transactions (Tansu)
        fails here, with a ConsumerError saying so."""
        try:
            await self.txn_log.start()
            await self._open_producer()
        except (KafkaError, TxnLogError, TimeoutError, OSError) as err:
            raise ConsumerError(
                f"{self.name}: exactly-once needs Kafka transactions (a transactional "
                f"producer and the topic {self.txn_log.topic!r}), which failed: {err!r}; "
                "is this a broker with transactions (Apache Kafka; Tansu has none)?"
            ) from None
        self.state = WriterState.OPEN
        self._loop_task = asyncio.create_task(self._commit_loop(), name=f"{self.name}-commits")

    async def _open_producer(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            transactional_id=self.txid,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            linger_ms=5,
            **self.kafka.client_options(),
        )
        try:
            await asyncio.wait_for(producer.start(), 30.0)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 10.0)
            raise
        self.producer = producer

    async def stop(self) -> None:
        self.state = WriterState.CLOSED
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(BaseException):
                await self._loop_task
        for entry in self.preparing:
            if entry.task is not None:
                entry.task.cancel()
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.producer.stop(), 10.0)

    def wrap(self, handler: ExactlyOnceHandler) -> Callable[[Any], Awaitable[None]]:
        """The lanes' handler: outputs join the batch when the user's handler returns, in
        the same step as the acknowledgement (see the module docstring)."""

        async def run(record: Any) -> None:
            generation = self.generation
            outputs = Outputs()
            await handler(record, outputs)
            if generation == self.generation:
                self.batch.extend(outputs.records)
                self.batch_bytes += sum(output.size() for output in outputs.records)
                if self.batch_bytes >= self.max_batch_bytes:
                    self._commit_due.set()

        return run

    async def _commit_loop(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._commit_due.wait(), self.interval_s)
                self._commit_due.clear()
                await self.commit()
        except ConsumerError as err:
            if not self.failed.done():
                self.failed.set_exception(err)

    def _fail(self, message: str) -> ConsumerError:
        self.state = WriterState.FAILED
        err = ConsumerError(f"{self.name}: exactly-once: {message}")
        if not self.failed.done():
            self.failed.set_exception(err)
        return err

    # ---- commits --------------------------------------------------------------------

    def owned(self) -> RangeSet:
        """Slots this member may write output for: owned, stopping or being taken over."""
        owned = self.progress.owned
        for entry in self.preparing:
            owned = owned | entry.slots
        return owned

    async def commit(
        self,
        *,
        releasing: RangeSet = EMPTY,
        claim: PositionUpdate | None = None,
        force: bool = False,
    ) -> None:
        """Cut (batch + positions, synchronously) and commit them in one transaction.
        `releasing`: slots given up after this commit (not claimed in the record);
        `claim`: start positions of slots being taken over, kept in the record."""
        async with self._lock:
            if self.state is WriterState.FAILED:
                raise ConsumerError(f"{self.name}: exactly-once: the writer has failed")
            generation = self.generation
            batch, self.batch = self.batch, []
            self.batch_bytes = 0
            snapshot = self.progress.positions()
            owned = self.owned() - releasing
            retire, self._retire = self._retire, []
            if not (force or batch or retire) and self._written == (owned, snapshot):
                return
            history = {tp: pmap.copy() for tp, pmap in self._history.items()}
            merge_positions(history, snapshot)
            if claim:
                merge_positions(history, claim)
            record = WriterRecord(self.txn_log.group, self.txid, owned, history)
            try:
                await self._transact(batch, [*retire, record])
            except asyncio.CancelledError:
                # The batch's records are done as far as the lanes know: committing later
                # positions without these outputs would lose them. Unless the session is
                # gone (the batch with it) or we are closing, stop the consumer.
                if generation == self.generation and self.state is WriterState.OPEN:
                    self._fail("a commit was interrupted")
                raise
            self._history = history
            self._written = (owned, snapshot)
            if generation == self.generation:
                self.committed = snapshot

    async def _transact(self, batch: list[Output], records: list[WriterRecord]) -> None:
        producer = self.producer
        assert producer is not None
        topic, partition = self.txn_log.topic, self.txn_log.partition
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                await producer.begin_transaction()
                sent = [
                    await producer.send(
                        o.topic, o.value, key=o.key, headers=list(o.headers) or None,
                        partition=o.partition,
                    )
                    for o in batch
                ]  # fmt: skip
                for record in records:
                    sent.append(
                        await producer.send(
                            topic, record.encode(), key=record.txid.encode(), partition=partition
                        )
                    )
                await asyncio.gather(*sent)
                await producer.commit_transaction()
                return
            except ProducerFenced:
                raise self._fail(
                    f"transactional id {self.txid} was fenced: another member owns slots this "
                    "one claimed; stopping (records are processed again from committed "
                    "positions)"
                ) from None
            except KafkaError as err:
                log.warning("%s: commit attempt %d failed: %r", self.name, attempt, err)
                try:
                    await producer.abort_transaction()
                except Exception as abort_err:
                    raise self._fail(f"could not abort a failed commit: {abort_err!r}") from None
                await asyncio.sleep(COMMIT_BACKOFF_S * attempt)
        raise self._fail(f"a commit failed {COMMIT_ATTEMPTS} times")

    # ---- taking slots over ----------------------------------------------------------

    async def take_over(self, slots: RangeSet, positions: PositionUpdate) -> PositionUpdate:
        """Before `slots` are dispatched: fence every other writer whose newest record
        claims one of them, read what every writer committed, start after all of it,
        and claim the slots in our own record (so a later owner fences us in turn)."""
        try:
            written = await self.txn_log.read("read_uncommitted")
            suspects = {
                txid
                for txid, record in written.items()
                if txid != self.txid and not record.retired and record.owned.overlaps(slots)
            }
            await self.txn_log.fence(suspects)
            committed = await self.txn_log.read("read_committed")
        except (KafkaError, TxnLogError, TimeoutError) as err:
            raise self._fail(f"cannot read the transaction log: {err!r}") from None
        start = start_positions(committed.values(), positions, slots)
        for txid in suspects:
            old = committed.get(txid) or WriterRecord(self.txn_log.group, txid)
            self._retire.append(WriterRecord(old.group, txid, EMPTY, old.positions, retired=True))
        await self.commit(claim=start, force=True)
        return start

    # ---- session loss ---------------------------------------------------------------

    async def session_lost(self) -> None:
        """The batch belongs to ranges that may be someone else's now: drop it, and go on
        with a new transactional id (new owners of our slots fence the old one)."""
        self.generation += 1
        self.batch.clear()
        self.batch_bytes = 0
        self.committed = {}
        for entry in self.preparing:
            if entry.task is not None:
                entry.task.cancel()
        self.preparing.clear()
        async with self._lock:
            old, self.producer = self.producer, None
            if old is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(old.stop(), 10.0)
            self.txid = self._new_txid()
            self._history = {}
            self._written = None
            try:
                await self._open_producer()
            except (KafkaError, TimeoutError) as err:
                raise self._fail(f"cannot open a new transactional producer: {err!r}") from None


class TransactionalHooks(ConsumerHooks):
    """`MemberHooks` of an exactly-once consumer: the plain consumer's, with
    committed positions reported and slots taken over before they are dispatched."""

    def __init__(
        self,
        writer: TransactionalWriter,
        progress: ConsumerProgress,
        fetcher: Fetcher,
        dispatcher: Dispatcher,
    ) -> None:
        super().__init__(progress, fetcher, dispatcher)
        self.writer = writer

    def _reported_positions(self) -> PositionUpdate:
        """Committed positions only: the coordinator is never ahead of a commit."""
        return dict(self.writer.committed)

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None:
        entry = _Preparing(slots)
        self.writer.preparing.append(entry)
        entry.task = asyncio.create_task(self._take_over(entry, positions))

    async def _take_over(self, entry: _Preparing, positions: PositionUpdate) -> None:
        try:
            start = await self.writer.take_over(entry.slots, positions)
        except ConsumerError:
            return  # the writer failed: the consumer stops
        finally:
            if entry in self.writer.preparing:
                self.writer.preparing.remove(entry)
        if entry.slots:
            self._fetcher.grant(entry.slots, start)

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        """Our claim: running and preparing slots, with committed positions only."""
        running, committed = super().held()
        for entry in self.writer.preparing:
            running = running | entry.slots
        return running, committed

    def _settle_before_stop(self, slots: RangeSet) -> list[asyncio.Task[None]]:
        """A take-over of these slots still under way finishes first (it may have
        fenced a writer); what it had not granted yet is no longer granted."""
        waiting = []
        for entry in self.writer.preparing:
            if entry.slots.overlaps(slots) and entry.task is not None:
                waiting.append(entry.task)
            entry.slots = entry.slots - slots
        return waiting

    async def _after_drain(self, slots: RangeSet) -> None:
        """Committed (releasing the slots in our record): the final positions are
        committed ones."""
        await self.writer.commit(releasing=slots, force=True)

    async def _forget_session(self) -> None:
        await self.writer.session_lost()
