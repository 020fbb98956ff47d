"""The instrument of `bench.lane_cost`: the consumer's data path in one process, the real
fetch loop over a stand-in for the aiokafka client that holds every record already, so
what is counted is keyshard's own per-record work and nothing of the network or the
broker.

    python -m bench._lane_workload io|noop RECORDS

`io`: 4 partitions, 64 lanes, a handler that suspends once (an I/O call that answers at
once), as the peers benchmark's workers run; `noop`: one partition, a handler that
finishes inline, as the filter benchmark's. It imports `keyshard` from the working
directory, so `bench.lane_cost` runs this same file in another build's tree.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from aiokafka.structs import ConsumerRecord
from aiokafka.structs import TopicPartition as KafkaTP

from keyshard.consumer_client._datapath.assembly import DataPath, DataPathSettings
from keyshard.consumer_client._datapath.hooks import ConsumerHooks
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.stats import ConsumerStats
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange

TOPIC = "t"
VALUE = b"v" * 100
KEYS = 10_000


class HeldRecords:
    """The aiokafka calls of the fetch loop over records already fetched: `getmany`
    hands out up to `max_records`, shared among the partitions, at once."""

    def __init__(self, log: dict[int, list[Any]]) -> None:
        self.log = log
        self.at = dict.fromkeys(log, 0)  # each partition's fetch position

    def assignment(self) -> set[KafkaTP]:
        return {KafkaTP(TOPIC, p) for p in self.log}

    def assign(self, tps: Any) -> None: ...

    def seek(self, tp: KafkaTP, offset: int) -> None:
        self.at[tp.partition] = offset

    def resume(self, *tps: Any) -> None: ...

    def pause(self, *tps: Any) -> None: ...

    def highwater(self, tp: KafkaTP) -> int:
        return len(self.log[tp.partition])

    def last_stable_offset(self, tp: KafkaTP) -> int:
        return len(self.log[tp.partition])

    async def position(self, tp: KafkaTP) -> int:
        return self.at[tp.partition]

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[KafkaTP, list[Any]]:
        out, share = {}, max(1, (max_records or 500) // len(self.log))
        for p, records in self.log.items():
            batch = records[self.at[p] : self.at[p] + share]
            if batch:
                out[KafkaTP(TOPIC, p)] = batch
                self.at[p] += len(batch)
        if not out and timeout_ms:
            await asyncio.sleep(timeout_ms / 1000)
        return out


async def run(kind: str, count: int) -> None:
    partitions = 4 if kind == "io" else 1

    def record(p: int, o: int) -> Any:
        key = f"key-{(o * partitions + p) % KEYS}".encode()
        return ConsumerRecord(TOPIC, p, o, 0, 0, key, VALUE, None, len(key), len(VALUE), [])

    log = {p: [record(p, o) for o in range(count // partitions)] for p in range(partitions)}
    total = sum(len(records) for records in log.values())
    done = 0
    finished = asyncio.Event()

    def one_done() -> None:
        nonlocal done
        done += 1
        if done == total:
            finished.set()

    async def io(record: Any) -> None:
        await asyncio.sleep(0)
        one_done()

    async def noop(record: Any) -> None:
        one_done()

    progress, stats = ConsumerProgress(), ConsumerStats()
    settings = DataPathSettings(max_concurrency=64 if kind == "io" else 1)
    kafka: Any = HeldRecords(log)
    handler = io if kind == "io" else noop
    path = DataPath.build(handler, kafka, progress, stats, settings, session=lambda: 0)
    hooks = ConsumerHooks(progress, path.fetcher, path.dispatcher)
    everything = SlotRange(0, 65535)
    hooks.start_fetcher(RangeSet.full(), {(TOPIC, p): [(everything, Position(0))] for p in log})
    path.fetcher.start()
    await asyncio.wait_for(finished.wait(), 600)
    path.fetcher.closing = True


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], int(sys.argv[2])))
