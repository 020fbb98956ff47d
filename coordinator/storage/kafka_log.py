"""The state log on Kafka: a compacted topic of P partitions, tailed by every replica.

Every replica reads every partition from the start and keeps its `PartitionImage` current
(a hot standby), reading committed data only. Claiming a partition fences whoever wrote
it before: on a broker with transactions, the claimant initializes the partition's
transactional producer (`keyshard.<topic>.<p>`), which makes the broker abort the old
writer's open transaction and refuse its later commits; on any broker, it then reads the
partition to its end, writes an epoch marker one above the highest it saw, and reads up
to its marker, so every record of the older epoch that landed before the marker is in its
image, and every one after it is ignored by replay.

Replicas say they are alive with `ReplicaBeat`s on partition 0, written and read by a
thread of their own (`coordinator.storage.beats`): a busy replica is not a dead one.

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
from keyshard.coordinator.storage.beats import BeatView, ReplicaBeats, SeenBeat
from keyshard.coordinator.storage.group_commit import GroupCommit, Record
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.kafka_cluster import (
    FETCH_WAIT_MS,
    RETRY_S,
    TAIL_POLL_MS,
    denied,
    ensure_state_topic,
)
from keyshard.coordinator.storage.log_format import EpochMarker, ReplicaBeat, encode
from keyshard.coordinator.storage.loop_thread import LoopThread
from keyshard.coordinator.storage.record_reader import RecordReader
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
PROBE_ATTEMPTS = 3  # of a transactional producer at start, on passing failures
# Brokers that have no transactions by design, by the cluster id they give themselves:
# Tansu (the embedded broker, `keyshard broker`) under its default id.
CLUSTERS_WITHOUT_TRANSACTIONS = {"tansu_cluster": "Tansu"}


def quiet_transactions_probe() -> contextlib.AbstractContextManager[None]:
    """aiokafka logs a broker's refusal of InitProducerId as an ERROR; here it only means
    the broker has no transactions, which `_broker_has_transactions` says in one line."""
    return quiet_aiokafka("aiokafka.producer.sender", "InitProducerId")


@dataclass(frozen=True, slots=True)
class ReplicaIdentity:
    replica_id: str
    address: str  # the consumer channel, as consumers reach it
    admin_url: str


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
        self._producer: AIOKafkaProducer | None = None
        # Beats have clients of their own, on a thread of their own (`ReplicaBeats`), as
        # Kafka's consumers heartbeat apart from their fetches: neither queued behind a
        # join storm's state records nor held up by a busy event loop. The replicas' Kafka
        # group runs on that thread too (`coordinator.replication.manager`).
        self.liveness = LoopThread("replica-liveness")
        self._beats = ReplicaBeats(
            self.liveness, bootstrap, topic, settings=settings, replica_id=identity.replica_id,
            address=identity.address, admin_url=identity.admin_url, secret=secret,
            timeout=timeout,
        )  # fmt: skip
        self._txn: dict[int, AIOKafkaProducer] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        # The groups' state writes: many groups' records per transaction (group_commit).
        self.commits = GroupCommit(self._write_batch)
        self._tail: AIOKafkaConsumer | None = None
        self._ends_at_start: dict[int, int] = {}
        self._tailed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    # ---- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.partitions = await ensure_state_topic(
                self.bootstrap, self.settings, self.topic, self.partitions, self.timeout
            )
            self.images = {p: PartitionImage(p) for p in range(self.partitions)}
            self._producer = self._plain_producer()
            await start_client(
                self._producer, self.bootstrap, self.settings, "state producer", self.timeout
            )
            self.liveness.start()
            await self._beats.start()  # a principal that may not write is told now
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
        await self._beats.stop()
        clients: list[Any] = [self._producer, *self._txn.values(), self._tail]
        for client in clients:
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), self.timeout)
        self._txn.clear()
        self._producer = self._tail = None
        self.reader.flush()
        await self.liveness.stop()

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
        self._tail = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False,
            fetch_max_wait_ms=FETCH_WAIT_MS, **self.settings.consumer_options(),
        )  # fmt: skip
        await start_client(self._tail, self.bootstrap, self.settings, "state reader", self.timeout)
        self._tail.assign(every)
        await self._tail.seek_to_beginning(*every)
        ends = await asyncio.wait_for(self._tail.end_offsets(every), self.timeout)
        self._ends_at_start = {tp.partition: int(end) for tp, end in ends.items()}
        self._tasks = [asyncio.create_task(self._tail_loop(), name="state-tail")]

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

    def _why(self, err: BaseException, operation: str) -> str:
        if isinstance(err, TopicAuthorizationFailedError):
            return str(denied(self.settings, self.topic, operation, err))
        return f"{type(err).__name__}: {err}"

    # ---- beats (`ReplicaBeats`) ----------------------------------------------------------

    @property
    def beat_view(self) -> BeatView:
        """What the beat thread has read and written so far (read it once per decision:
        each read may be newer)."""
        return self._beats.view

    @property
    def beats(self) -> dict[str, SeenBeat]:
        return dict(self._beats.view.beats)

    def alive(self, within_own_beats: int) -> dict[str, ReplicaBeat]:
        """Replicas whose latest beat came after our own last `within_own_beats` beats
        and did not say they are leaving (`BeatView.alive`)."""
        return self._beats.view.alive(within_own_beats)

    def beat_every(self, interval_s: float, placement_version: int = 0) -> None:
        """Beat every `interval_s` from now on, from the beat thread."""
        self._beats.placement_version = placement_version
        self._beats.beat_every(interval_s)

    def act_on(self, placement_version: int) -> None:
        """The placement the next beats say this replica acts on."""
        self._beats.placement_version = placement_version

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

    async def beat(self, *, leaving: bool = False) -> None:
        """Write one beat now, and wait until Kafka has it."""
        await self._beats.beat(leaving=leaving)

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
        """The signature header of a marker, with a secret; else none (beats are signed
        by `BeatThread`)."""
        if self.secret is None or not key.startswith(MARKER_KIND):
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
