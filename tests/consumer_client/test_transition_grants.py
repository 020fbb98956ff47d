"""A grant in a topic in transition that reaches back behind what the fetcher examined.

The member runs the lower half of the slots of a topic that grew from 2 to 4 partitions;
a key of the upper half has a record written by the old count in partition 0 and a later
one in partition 2. The fetcher examined the old one (not its slot then) and the gate let
the new one out, which waits in the backlog, when the upper half is granted from before
the old record. Partition 0 is read again from there; the new record must not run before
it. No broker: a stand-in client serves a fixed log from where it is sought.
"""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition as KafkaTP
from aiokafka.structs import ConsumerRecord

from keyshard.consumer_client._datapath.merge import TopicTransition
from keyshard.core.model.hashing import slot_for_key
from keyshard.core.model.positions import Position, PositionUpdate
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.consumer_client import parts

TOPIC = "t"
LOWER, UPPER = SlotRange(0, 32767), SlotRange(32768, 65535)
GREW = TopicTransition(TOPIC, (2, 4), until_ms=2**62)  # in transition all along


def key_in(slots: SlotRange) -> bytes:
    return next(k for i in range(1000) if slot_for_key(k := f"k{i}".encode()) in slots)


def record(partition: int, offset: int, key: bytes, timestamp: int) -> Any:
    return ConsumerRecord(TOPIC, partition, offset, timestamp, 0, key, b"v", None, 2, 1, [])


def from_offsets(slots: SlotRange, offsets: dict[int, int]) -> PositionUpdate:
    return {(TOPIC, p): [(slots, Position(o))] for p, o in offsets.items()}


class SoughtLog:
    """The aiokafka calls of granting and dispatching, over a fixed log per partition:
    `fetch` hands the fetcher what lies between each partition's fetch position and
    `upto`, as a fetch would."""

    def __init__(self, log: dict[int, list[Any]]) -> None:
        self.log = log
        self.position = dict.fromkeys(log, 0)

    def assignment(self) -> set[KafkaTP]:
        return set()

    def assign(self, tps: Any) -> None: ...

    def resume(self, *tps: Any) -> None: ...

    def pause(self, *tps: Any) -> None: ...

    def seek(self, tp: KafkaTP, offset: int) -> None:
        self.position[tp.partition] = offset

    def fetch(self, consumer: parts.Parts, upto: dict[int, int]) -> None:
        batches = {}
        for partition, end in upto.items():
            batch = self.log[partition][self.position[partition] : end]
            if batch:
                batches[KafkaTP(TOPIC, partition)] = batch
                self.position[partition] = batch[-1].offset + 1
        generations = {tp: p.generation for tp, p in consumer.progress.partitions.items()}
        consumer.fetcher.queue_fetched(batches, generations, parts.SESSION)


async def test_records_let_out_against_a_rewound_partition_are_read_again_in_order() -> None:
    mine, theirs = key_in(LOWER), key_in(UPPER)
    log = SoughtLog(
        {
            0: [record(0, 0, theirs, 10), record(0, 1, mine, 30)],  # old count
            1: [record(1, 0, mine, 1000)],
            2: [record(2, 0, theirs, 20)],  # the new count: later than partition 0's
            3: [],
        }
    )
    ran: list[tuple[int, int]] = []

    async def handler(r: Any) -> None:
        ran.append((r.partition, r.offset))

    consumer = parts.build(handler, log)
    fetcher = consumer.fetcher

    def dispatch() -> None:
        assert fetcher.dispatch(fetcher.backlog) is None  # every handler finishes inline

    fetcher.begin_transitions([GREW])
    consumer.hooks.start_fetcher(RangeSet([LOWER]), from_offsets(LOWER, dict.fromkeys(range(4), 0)))
    log.fetch(consumer, {0: 1, 1: 1})
    dispatch()  # partition 0's old record examined: not this member's slot yet
    log.fetch(consumer, {2: 1, 0: 2})  # partition 0 past 20 lets partition 2's record out
    assert [c.tp[1] for c in fetcher.backlog] == [2, 0]
    consumer.hooks.start_fetcher(RangeSet([UPPER]), from_offsets(UPPER, {0: 0, 1: 1, 2: 0, 3: 0}))
    dispatch()
    log.fetch(consumer, {0: 2, 2: 1})
    dispatch()

    assert sorted(ran) == [(0, 0), (0, 1), (1, 0), (2, 0)]  # each once
    assert ran.index((0, 0)) < ran.index((2, 0)), ran  # the key's records in their order
