"""The state log on Kafka: a compacted topic of P partitions, tailed by every replica.

Every replica reads every partition from the start and keeps its `PartitionImage` current
(a hot standby), reading committed data only. Claiming a partition fences whoever wrote
it before: on a broker with transactions, the claimant initializes the partition's
transactional producer (`keyshard.<topic>.<p>`), which makes the broker abort the old
writer's open transaction and refuse its later commits; on any broker, it then reads the
partition to its end, writes an epoch marker one above the highest it saw, and reads up
to its marker, so every record of the older epoch that landed before the marker is in its
image, and every one after it is ignored by replay.

Replicas say they are alive with `ReplicaBeat`s on partition 0, outside transactions, read
by a second consumer that does not wait for committed data (an open transaction on
partition 0 must not make live replicas look dead).

With a replica secret, beats and epoch markers are signed when written and believed only
when they verify (`coordinator.storage.signing`); what is read is checked record by
record (`coordinator.storage.record_reader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import (
    KafkaError,
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, Fenced, StoreError
from keyshard.coordinator.storage.group_commit import GroupCommit, Record
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.kafka_cluster import denied, ensure_state_topic
from keyshard.coordinator.storage.log_format import EpochMarker, ReplicaBeat, encode
from keyshard.coordinator.storage.record_reader import BEAT_KIND, RecordReader
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.kafka.connect import (
    KafkaUnreachable,
    is_passing,
    quiet_aiokafka,
    start_client,
)
from keyshard.core.kafka.metadata import cluster_id, partitions_of
from keyshard.core.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)
MARKER_KIND = b"E\x00"
TAIL_POLL_MS = 100
RETRY_S = 0.5  # after a failed read of the state log
PROBE_ATTEMPTS = 3  # of a transactional producer at start, on passing failures
# Brokers that have no transactions by design, by the cluster id they give themselves:
# Tansu (the embedded broker, `keyshard broker`) under its default id.
CLUSTERS_WITHOUT_TRANSACTIONS = {"tansu_cluster": "Tansu"}
FETCH_WAIT_MS = 20
HISTORY = -(10**9)  # what a beat from before we started counts as: long gone


def quiet_transactions_probe() -> contextlib.AbstractContextManager[None]:
    """aiokafka logs a broker's refusal of InitProducerId as an ERROR; here it only means
    the broker has no transactions, which `_broker_has_transactions` says in one line."""
    return quiet_aiokafka("aiokafka.producer.sender", "InitProducerId")


@dataclass(frozen=True, slots=True)
class ReplicaIdentity:
    replica_id: str
    address: str  # the consumer channel, as consumers reach it
    admin_url: str


@dataclass(frozen=True, slots=True)
class SeenBeat:
    beat: ReplicaBeat
    # How many of our own beats we had read when this one came: liveness is measured in
    # our own beats written since (log order), never by a clock. A clock would declare
    # everyone dead to a replica waking from a freeze before it read what they wrote
    # meanwhile, and would compare two machines' clocks.
    own_beats_before: int


class KafkaStateLog:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        settings: KafkaSettings,
        identity: ReplicaIdentity,
        partitions: int = DEFAULT_STATE_PARTITIONS,
        transactions: bool | None = None,
        timeout: float = 10.0,
        secret: ReplicaSecret | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.secret = secret  # signs beats and markers, and checks everyone's
        self.reader = RecordReader(topic, secret)
        self.settings = settings
        self.identity = identity
        self.partitions = partitions  # the topic's own count once started
        self.timeout = timeout
        self.transactions = transactions  # None: find out at start
        self.images: dict[int, PartitionImage] = {}
        self.beats: dict[str, SeenBeat] = {}
        self.own_beats = 0  # our own beats read back from the log
        # When the last of them was read back (loop time): a replica whose beats stop
        # coming back is cut off from Kafka, and the others will soon take over.
        self.own_beat_seen_at = 0.0
        self.other_beat_seen_at: float | None = None  # a live beat of another replica
        # When the last beat Kafka acknowledged was sent (loop time): it is in the log, so
        # the others read it before counting us gone, however far our own reading lags
        # (a join storm writes thousands of state records ahead of the next beat).
        self.own_beat_acked_at = 0.0
        self._producer: AIOKafkaProducer | None = None
        # Beats have a producer of their own, as Kafka's consumers heartbeat apart from
        # their fetches: queued behind a join storm's state records in one producer, a beat
        # can reach Kafka more than a second late, and the replica would take itself for
        # cut off.
        self._beat_producer: AIOKafkaProducer | None = None
        self._txn: dict[int, AIOKafkaProducer] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        # The groups' state writes: many groups' records per transaction (group_commit).
        self.commits = GroupCommit(self._write_batch)
        self._tail: AIOKafkaConsumer | None = None
        self._beat_reader: AIOKafkaConsumer | None = None
        self._ends_at_start: dict[int, int] = {}
        self._beats_live_from = 0  # partition-0 offset from which beats are not history
        self._tailed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.partitions = await ensure_state_topic(
                self.bootstrap, self.settings, self.topic, self.partitions, self.timeout
            )
            self.images = {p: PartitionImage(p) for p in range(self.partitions)}
            self._producer, self._beat_producer = (self._plain_producer() for _ in range(2))
            for producer, role in ((self._producer, "state"), (self._beat_producer, "beat")):
                await start_client(
                    producer, self.bootstrap, self.settings, f"{role} producer", self.timeout
                )
            await self.beat()  # a principal that may not write is told now, not later
            if self.transactions is None:
                self.transactions = await self._broker_has_transactions()
            await self._start_tailing()
        except KafkaUnreachable as err:
            await self.stop()
            raise StoreError(str(err)) from None
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self.commits.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        clients: list[Any] = [
            self._producer, self._beat_producer, *self._txn.values(), self._tail,
            self._beat_reader,
        ]  # fmt: skip
        for client in clients:
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), self.timeout)
        self._txn.clear()
        self._producer = self._beat_producer = self._tail = self._beat_reader = None
        self.reader.flush()

    async def _broker_has_transactions(self) -> bool:
        """Whether the broker takes transactional producers (Kafka does; the embedded test
        broker does not): with them the broker itself fences a zombie writer. A passing
        failure (a transaction coordinator still loading after a broker restart) is asked
        again: giving fencing up for the replica's whole life on it would be wrong."""
        attempt = 0
        while True:
            attempt += 1
            probe = self._transactional_producer(f"keyshard.{self.topic}.probe")
            try:
                with quiet_transactions_probe():
                    await asyncio.wait_for(probe.start(), self.timeout)
                return True
            except TransactionalIdAuthorizationFailed as err:
                raise StoreError(
                    f"Kafka refused the coordinator's transactional ids ({err}): grant its "
                    "principal Write and Describe on transactional ids prefixed "
                    f"keyshard.{self.topic}"
                ) from None
            except (KafkaError, OSError, TimeoutError) as err:
                if is_passing(err) and attempt < PROBE_ATTEMPTS:
                    await asyncio.sleep(RETRY_S * attempt)
                    continue
                known = await self._known_without_transactions()
                log.log(
                    logging.INFO if known else logging.WARNING,
                    "the broker takes no transactional producer (%s%s): replicas fence each "
                    "other through epoch markers in the state log only", type(err).__name__,
                    f"; expected of {known}, which has no transactions" if known else "",
                )  # fmt: skip
                return False
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(probe.stop(), self.timeout)

    async def _known_without_transactions(self) -> str | None:
        """The broker's name when it is one known to have no transactions at all (their
        absence is then no fault to warn about), else None."""
        assert self._producer is not None
        try:
            found = await cluster_id(self._producer.client, self.timeout)
        except (KafkaError, OSError, TimeoutError):
            return None
        return CLUSTERS_WITHOUT_TRANSACTIONS.get(found or "")

    def _plain_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=0,
            **self.settings.client_options(),
        )  # fmt: skip

    def _transactional_producer(self, transactional_id: str) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, transactional_id=transactional_id, acks="all",
            enable_idempotence=True, linger_ms=0, **self.settings.client_options(),
        )  # fmt: skip

    async def _start_tailing(self) -> None:
        every = [KafkaTP(self.topic, p) for p in range(self.partitions)]
        # A short fetch wait: a takeover waits for its own marker to come back, and the
        # default of half a second is that much more for every one.
        self._tail = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False,
            fetch_max_wait_ms=FETCH_WAIT_MS, **self.settings.consumer_options(),
        )  # fmt: skip
        await start_client(self._tail, self.bootstrap, self.settings, "state reader", self.timeout)
        self._tail.assign(every)
        await self._tail.seek_to_beginning(*every)
        ends = await asyncio.wait_for(self._tail.end_offsets(every), self.timeout)
        self._ends_at_start = {tp.partition: int(end) for tp, end in ends.items()}
        options = {**self.settings.consumer_options(), "isolation_level": "read_uncommitted"}
        self._beat_reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False,
            fetch_max_wait_ms=FETCH_WAIT_MS, **options,
        )  # fmt: skip
        await start_client(
            self._beat_reader, self.bootstrap, self.settings, "beat reader", self.timeout
        )
        zero = KafkaTP(self.topic, 0)
        self._beat_reader.assign([zero])
        await self._beat_reader.seek_to_beginning(zero)
        end = await asyncio.wait_for(self._beat_reader.end_offsets([zero]), self.timeout)
        self._beats_live_from = int(end[zero])
        self._tasks = [
            asyncio.create_task(self._tail_loop(), name="state-tail"),
            asyncio.create_task(self._beat_loop(), name="beat-tail"),
        ]

    # ---- reading ------------------------------------------------------------------------

    @property
    def caught_up(self) -> bool:
        """Every partition replayed to where it ended when this replica started: the
        replica is a hot standby (readiness)."""
        return bool(self.images) and all(
            self.images[p].next_offset >= end for p, end in self._ends_at_start.items()
        )

    async def _tail_loop(self) -> None:
        assert self._tail is not None
        tail = self._tail
        while True:
            try:
                batches = await tail.getmany(timeout_ms=TAIL_POLL_MS)
                for ktp, records in batches.items():
                    self.reader.replay(self.images[ktp.partition], records)
                # Markers and aborted records take offsets no record is delivered for.
                for partition, image in self.images.items():
                    position = await tail.position(KafkaTP(self.topic, partition))
                    image.next_offset = max(image.next_offset, position)
            except Exception as err:  # a dead tail would leave every image stale for good
                log.warning("reading the state log failed (retrying): %s", self._why(err, "Read"))
                await asyncio.sleep(RETRY_S)
                continue
            async with self._tailed:
                self._tailed.notify_all()

    async def _beat_loop(self) -> None:
        assert self._beat_reader is not None
        reader = self._beat_reader
        me = self.identity.replica_id
        while True:
            try:
                batches = await reader.getmany(timeout_ms=TAIL_POLL_MS)
            except Exception as err:  # a dead reader would take every replica for dead
                log.warning("reading replica beats failed (retrying): %s", self._why(err, "Read"))
                await asyncio.sleep(RETRY_S)
                continue
            for records in batches.values():
                for record in records:
                    beat = self.reader.beat(record)
                    if beat is None:
                        continue
                    # Beats from before we started are history, not proof of life.
                    if record.offset < self._beats_live_from:
                        self.beats[beat.replica_id] = SeenBeat(beat, HISTORY)
                        continue
                    if beat.replica_id == me:
                        self.own_beats += 1
                        self.own_beat_seen_at = asyncio.get_running_loop().time()
                    else:
                        self.other_beat_seen_at = asyncio.get_running_loop().time()
                    self.beats[beat.replica_id] = SeenBeat(beat, self.own_beats)

    def _why(self, err: BaseException, operation: str) -> str:
        if isinstance(err, TopicAuthorizationFailedError):
            return str(denied(self.settings, self.topic, operation, err))
        return f"{type(err).__name__}: {err}"

    def alive(self, within_own_beats: int) -> dict[str, ReplicaBeat]:
        """Replicas whose latest beat came after our own last `within_own_beats` beats
        and did not say they are leaving (this one is alive as long as it can beat)."""
        return {
            rid: s.beat
            for rid, s in self.beats.items()
            if self.own_beats - s.own_beats_before < within_own_beats and not s.beat.leaving
        }

    async def wait_tailed(self, partition: int, offset: int, timeout: float) -> None:
        """Until this replica's image of `partition` has read everything below `offset`."""
        image = self.images[partition]
        async with self._tailed:
            await asyncio.wait_for(
                self._tailed.wait_for(lambda: image.next_offset >= offset), timeout
            )

    async def end_of(self, partition: int) -> int:
        """Where `partition` ends for a reader of committed data, right now."""
        assert self._tail is not None
        ktp = KafkaTP(self.topic, partition)
        return int((await asyncio.wait_for(self._tail.end_offsets([ktp]), self.timeout))[ktp])

    # ---- writing ------------------------------------------------------------------------

    async def beat(self, *, leaving: bool = False, placement_version: int = 0) -> None:
        beat = ReplicaBeat(
            self.identity.replica_id, self.identity.address, self.identity.admin_url,
            int(time.time() * 1000), leaving, placement_version,
        )  # fmt: skip
        assert self._beat_producer is not None
        sent = asyncio.get_running_loop().time()
        value = encode(beat)
        sending = self._beat_producer.send_and_wait(
            self.topic, value, beat.key, partition=0, headers=self._signed(0, beat.key, value)
        )
        try:
            await asyncio.wait_for(sending, self.timeout)
        except TopicAuthorizationFailedError as err:
            raise denied(self.settings, self.topic, "Write", err) from None
        self.own_beat_acked_at = max(self.own_beat_acked_at, sent)

    async def claim(self, partition: int, placement_version: int = 0) -> tuple[int, PartitionImage]:
        """Take `partition` over: fence the previous writer, read to the end, write the
        next epoch's marker (naming the placement it acts on) and read up to it. Returns
        the epoch and the image to start from."""
        lock = self._locks.setdefault(partition, asyncio.Lock())
        async with lock:
            if self.transactions and partition not in self._txn:
                producer = self._transactional_producer(f"keyshard.{self.topic}.{partition}")
                await start_client(
                    producer, self.bootstrap, self.settings, "state writer", self.timeout
                )
                self._txn[partition] = producer  # its start fenced the previous writer
            await self.wait_tailed(partition, await self.end_of(partition), self.timeout * 3)
            image = self.images[partition]
            epoch = image.next_epoch
            marker = self._marker(partition, epoch, placement_version=placement_version)
            offset = await self._write_locked(partition, epoch, [marker])
        await self.wait_tailed(partition, offset + 1, self.timeout * 3)
        owner = image.owner
        if image.epoch != epoch or owner is None or owner.replica_id != self.identity.replica_id:
            raise Fenced(f"state partition {partition} was taken over again while claiming")
        return epoch, image

    def _marker(self, partition: int, epoch: int, **fields: Any) -> tuple[bytes, bytes]:
        """This replica's epoch marker for `partition`, as the (key, value) to write."""
        marker = EpochMarker(
            partition, epoch, self.identity.replica_id, self.identity.address,
            self.identity.admin_url, **fields,
        )  # fmt: skip
        value = encode(marker)
        assert value is not None
        return marker.key, value

    async def release(self, partition: int, handed_over_at: int | None = None) -> None:
        """Stop writing `partition`: handed over (as its owner at epoch `handed_over_at`:
        say so in the log, so the next owner claims it at once), or fenced (nothing to
        say). Its producer goes."""
        if handed_over_at is not None:
            marker = self._marker(partition, handed_over_at, released=True)
            async with self._locks.setdefault(partition, asyncio.Lock()):
                with contextlib.suppress(StoreError):  # fenced meanwhile: nothing to hand
                    await self._write_locked(partition, handed_over_at, [marker])
        producer = self._txn.pop(partition, None)
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), self.timeout)

    async def write(
        self, partition: int, epoch: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> None:
        """Write `records` to `partition` as its owner at `epoch`, all or none (in one
        transaction where the broker has them, with the other writes waiting for the
        partition meanwhile: `group_commit`). Raises Fenced when another replica has
        taken the partition over."""
        await self.commits.write(partition, epoch, records)

    async def _write_batch(self, partition: int, epoch: int, records: list[Record]) -> None:
        async with self._locks.setdefault(partition, asyncio.Lock()):
            await self._write_locked(partition, epoch, records)

    async def _write_locked(
        self, partition: int, epoch: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> int:
        """The last record's offset."""
        if self.images[partition].epoch > epoch:
            raise Fenced(f"state partition {partition} is at epoch {self.images[partition].epoch}")
        producer = self._txn.get(partition)
        try:
            if producer is None:
                assert self._producer is not None
                futures = [await self._send(self._producer, partition, r) for r in records]
                done = await asyncio.wait_for(asyncio.gather(*futures), self.timeout)
                return int(done[-1].offset)
            async with producer.transaction():
                futures = [await self._send(producer, partition, r) for r in records]
            return int((await futures[-1]).offset)
        except ProducerFenced:
            self._txn.pop(partition, None)
            raise Fenced(f"state partition {partition}: another replica took it over") from None
        except TopicAuthorizationFailedError as err:
            raise denied(self.settings, self.topic, "Write", err) from None

    async def _send(
        self, producer: AIOKafkaProducer, partition: int, record: tuple[bytes, bytes | None]
    ) -> asyncio.Future[Any]:
        key, value = record
        headers = self._signed(partition, key, value)
        future: asyncio.Future[Any] = await producer.send(
            self.topic, value, key, partition=partition, headers=headers
        )
        return future

    def _signed(
        self, partition: int, key: bytes, value: bytes | None
    ) -> list[tuple[str, bytes]] | None:
        """The signature header of a beat or a marker, with a secret; else none."""
        if self.secret is None or not key.startswith((MARKER_KIND, BEAT_KIND)):
            return None
        return self.secret.headers(self.topic, partition, key, value)


async def read_state(
    bootstrap: str,
    topic: str,
    settings: KafkaSettings,
    timeout: float = 30.0,
    secret: ReplicaSecret | None = None,
) -> dict[int, PartitionImage]:
    """Every partition of the state log as a replica taking it over would see it now
    (believing the markers `secret` verifies), without joining the replicas (no beat, no
    claim): for tools and tests."""
    found = await partitions_of(bootstrap, [topic], timeout, **settings.client_options())
    every = [KafkaTP(topic, p) for p in found.require(bootstrap)[topic]]
    reader = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False,
        fetch_max_wait_ms=FETCH_WAIT_MS, **settings.consumer_options(),
    )  # fmt: skip
    await start_client(reader, bootstrap, settings, "state reader", timeout)
    reading = RecordReader(topic, secret)
    try:
        images = {tp.partition: PartitionImage(tp.partition) for tp in every}
        reader.assign(every)
        await reader.seek_to_beginning(*every)
        ends = await asyncio.wait_for(reader.end_offsets(every), timeout)
        deadline = time.monotonic() + timeout
        for tp in every:
            while await reader.position(tp) < ends[tp]:
                if time.monotonic() > deadline:
                    raise StoreError(f"reading {topic} took more than {timeout} s")
                batches = await reader.getmany(tp, timeout_ms=TAIL_POLL_MS)
                reading.replay(images[tp.partition], batches.get(tp, []))
        return images
    finally:
        await reader.stop()
