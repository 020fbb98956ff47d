"""The transaction log of exactly-once members: who may write output for which slots, and
which positions their committed transactions cover (docs/protocol.md §13).

keyshard's positions live in the coordinator's state topic, which no consumer transaction
can touch. So every transaction of an exactly-once member also writes one *writer record*
to this compacted topic (`__keyshard_transactions` by default), keyed by the member's
transactional id: the slots it owns (may write output for) and every position its
committed transactions ever covered. Kafka commits that record with the outputs or not at
all, so a read_committed reader of this topic knows exactly which input records have
their output committed.

A member taking slots over reads the group's records here twice: read_uncommitted, to find
every transactional id whose newest record claims one of them (a previous owner, dead or
partitioned away, whose transaction may still be open), which it fences by initializing
a producer with that id (Kafka aborts its open transaction and refuses it from then on);
then read_committed, to the end, for what every writer committed. All of a group's records
are in one partition (by the group's hash), so each read is one partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import mmh3
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.positions import Position, PositionUpdate, RangePositionMap
from keyshard.core.model.positions import TopicPartition as Tp
from keyshard.core.model.ranges import EMPTY, RangeSet

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "__keyshard_transactions"
DEFAULT_PARTITIONS = 6
RECORD_VERSION = 1
#: A read of the log to its end waits at most this at open transactions. A live writer's
#: is committed within its commit interval; a dead writer's is aborted when its slots'
#: new owner fences it (after the dead member's session) or, at the latest, by Kafka after
#: the transaction timeout (60 s, `transactions.TRANSACTION_TIMEOUT_MS`) plus the broker's
#: check interval (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s).
READ_TIMEOUT_S = 90.0


class TxnLogError(RuntimeError):
    """The transaction log cannot be used (missing topic, refused access, unreadable)."""


@dataclass(slots=True)
class WriterRecord:
    """The newest record of one transactional id in a group."""

    group: str
    txid: str
    owned: RangeSet = EMPTY
    positions: dict[Tp, RangePositionMap] = field(default_factory=dict)
    retired: bool = False  # fenced by a later owner, which wrote this record for it

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": RECORD_VERSION,
                "group": self.group,
                "txid": self.txid,
                "owned": self.owned.to_pairs(),
                "retired": self.retired,
                "positions": [
                    [tp[0], tp[1], pmap.to_json()] for tp, pmap in sorted(self.positions.items())
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> WriterRecord:
        data = json.loads(raw)
        if data.get("v") != RECORD_VERSION:
            raise ValueError(f"writer record version {data.get('v')!r} is not {RECORD_VERSION}")
        return cls(
            group=str(data["group"]),
            txid=str(data["txid"]),
            owned=RangeSet.from_pairs(data["owned"]),
            positions={
                (str(t), int(p)): RangePositionMap.from_json(m) for t, p, m in data["positions"]
            },
            retired=bool(data["retired"]),
        )


def merge_positions(into: dict[Tp, RangePositionMap], update: PositionUpdate) -> None:
    """Unite `update` into `into` slot by slot (done in either is done: positions only
    ever describe work whose output is committed, so the union is too)."""
    for tp, segments in update.items():
        pmap = into.setdefault(tp, RangePositionMap())
        for slots, position in segments:
            for part, old in pmap.segments(RangeSet([slots])):
                pmap.assign(part, old.union(position))


def positions_within(
    maps: dict[Tp, RangePositionMap], slots: RangeSet, partitions: Iterable[Tp]
) -> PositionUpdate:
    return {tp: maps.get(tp, RangePositionMap()).segments(slots) for tp in partitions}


class TxnLog:
    """Reading, fencing and topic set-up for one group's part of the transaction log."""

    def __init__(
        self, *, bootstrap: str, kafka: KafkaSettings, topic: str, group: str, prefix: str
    ) -> None:
        self.bootstrap = bootstrap
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self.prefix = prefix
        self.partition = 0  # set by `start` from the topic's partition count

    async def start(self, timeout: float = 30.0) -> None:
        """Create the topic when missing (compacted: one record per writer survives) and
        find this group's partition."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.kafka.admin_options())
        try:  # a start that fails is tried again: nothing it opened may stay open
            await asyncio.wait_for(admin.start(), timeout)
            new = NewTopic(
                self.topic, DEFAULT_PARTITIONS, -1, {}, topic_configs={"cleanup.policy": "compact"}
            )
            response = await asyncio.wait_for(admin.create_topics([new]), timeout)
            for _, code, *_ in response.topic_errors:
                error = for_code(code)
                if code and error is not TopicAlreadyExistsError:
                    if error.retriable:  # no controller yet, say: tried again
                        raise error(f"creating the transaction log topic {self.topic!r}")
                    raise TxnLogError(
                        f"cannot create the transaction log topic {self.topic!r} "
                        f"({error.__name__}): create it yourself ({DEFAULT_PARTITIONS} "
                        "partitions, cleanup.policy=compact) or grant Create on it"
                    )
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
        probe = self._consumer("read_committed")
        try:
            await asyncio.wait_for(probe.start(), timeout)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not (parts := probe.partitions_for_topic(self.topic)):
                if loop.time() > deadline:
                    raise TxnLogError(f"transaction log topic {self.topic!r} has no partitions")
                await probe._client.force_metadata_update()
                await asyncio.sleep(0.1)
        finally:
            await probe.stop()
        self.partition = mmh3.hash(self.group.encode(), 0, signed=False) % len(parts)

    def key(self, txid: str) -> bytes:
        return txid.encode()

    def _consumer(self, isolation: str) -> AIOKafkaConsumer:
        options = {**self.kafka.consumer_options(), "isolation_level": isolation}
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            **options,
        )

    async def read(self, isolation: str, end: int | None = None) -> dict[str, WriterRecord]:
        """The newest record of every writer of the group, reading from the start up to
        `end` (default: the high watermark now). read_committed waits there for open
        transactions to end."""
        if end is None:
            end = await self.high_watermark()
        consumer = self._consumer(isolation)
        tp = TopicPartition(self.topic, self.partition)
        await asyncio.wait_for(consumer.start(), READ_TIMEOUT_S)
        newest: dict[str, WriterRecord] = {}
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + READ_TIMEOUT_S
            while await consumer.position(tp) < end:
                if loop.time() > deadline:
                    raise TxnLogError(
                        f"transaction log {self.topic}[{self.partition}] not readable to "
                        f"offset {end} within {READ_TIMEOUT_S:g} s ({isolation})"
                    )
                batch = await consumer.getmany(tp, timeout_ms=200)
                for message in batch.get(tp, []):
                    record = _decode(message.value, message.offset)
                    if record is not None and record.group == self.group:
                        newest[record.txid] = record
        finally:
            await consumer.stop()
        return newest

    async def high_watermark(self) -> int:
        """The partition's end, open transactions included (read_uncommitted)."""
        consumer = self._consumer("read_uncommitted")
        tp = TopicPartition(self.topic, self.partition)
        await asyncio.wait_for(consumer.start(), READ_TIMEOUT_S)
        try:
            return int((await consumer.end_offsets([tp]))[tp])
        finally:
            await consumer.stop()

    async def fence(self, txids: Iterable[str]) -> None:
        """Initialize a producer with each id: Kafka bumps its epoch, aborts its open
        transaction and refuses every later write or commit of the old producer."""

        async def one(txid: str) -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                transactional_id=txid,
                **self.kafka.client_options(),
            )
            try:
                await asyncio.wait_for(producer.start(), READ_TIMEOUT_S)
            except (KafkaError, TimeoutError) as err:
                raise TxnLogError(f"cannot fence transactional id {txid!r}: {err!r}") from err
            finally:
                with contextlib.suppress(Exception):
                    await producer.stop()
            log.info("fenced transactional id %s", txid)

        await asyncio.gather(*(one(t) for t in txids))


def _decode(raw: bytes | None, offset: int) -> WriterRecord | None:
    if raw is None:
        return None
    try:
        return WriterRecord.decode(raw)
    except (ValueError, KeyError, TypeError) as err:
        log.warning("skipping an unreadable writer record at offset %d: %s", offset, err)
        return None


def start_positions(
    records: Iterable[WriterRecord], coordinator: PositionUpdate, slots: RangeSet
) -> PositionUpdate:
    """Where an owner of `slots` starts: the coordinator's positions united with every
    writer's committed positions (each only ever covers committed output)."""
    maps: dict[Tp, RangePositionMap] = {}
    merge_positions(maps, coordinator)
    for record in records:
        merge_positions(
            maps, {tp: pmap.segments(slots) for tp, pmap in record.positions.items() if tp in maps}
        )
    return positions_within(maps, slots, coordinator.keys())


__all__ = [
    "DEFAULT_TOPIC",
    "Position",
    "TxnLog",
    "TxnLogError",
    "WriterRecord",
    "merge_positions",
    "start_positions",
]
