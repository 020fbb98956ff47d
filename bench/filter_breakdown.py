"""What keyshard adds per record with a no-op handler, step by step (no broker, no decode).

Part 3 of `throughput.py` compares a whole consumer against a bare getmany loop; this script
splits keyshard's extra per-record work into its steps, on synthetic aiokafka records
(10,000 keys, no headers), timed in-process: best of several passes.

The last rows are the whole path (the consumer's `Fetcher.dispatch`) through its Python loop
and through the C fast path (consumer_client/_fastpath.c), when that is built.

Run: bash scripts/bench.sh filter-breakdown [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import ConsumerRecord

from keyshard.consumer_client._datapath.assembly import DataPath, DataPathSettings
from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.consumer_client._datapath.lanes import KeyLanes
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.stats import ConsumerStats
from keyshard.core.model.hashing import slot_for_key
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange

TP = ("t", 0)


async def noop(_: Any) -> None:
    return None


def records(n: int) -> list[Any]:
    value = b"v" * 64
    return [
        ConsumerRecord("t", 0, i, 0, 0, f"key-{i % 10_000}".encode(), value, None, 8, 64, [])
        for i in range(n)
    ]


def owning_everything() -> ConsumerProgress:
    progress = ConsumerProgress()
    progress.add_grant(RangeSet.full(), {TP: [(SlotRange(0, 65535), Position(0))]})
    return progress


def best_us(fn: Callable[[], Any], n: int, passes: int) -> float:
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) / n * 1e6


async def main(n: int, passes: int) -> None:
    recs = records(n)

    async def bare() -> None:
        for r in recs:
            await noop(r)

    loop_times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        await bare()
        loop_times.append(time.perf_counter() - t0)
    bare_us = min(loop_times) / n * 1e6

    def empty() -> None:
        for _ in recs:
            pass

    def keys() -> None:
        for r in recs:
            _ = r.key

    def slots() -> None:
        for r in recs:
            slot_for_key(r.key)

    def accept() -> None:
        check = owning_everything().partitions[TP].accept
        for r in recs:
            check(r.offset, 7)

    lanes = KeyLanes(noop, max_concurrency=64, on_done=lambda _: None)

    def dispatch() -> None:
        run = lanes.dispatch
        for r in recs:
            run(TP, r.offset, 7, r.key, r, 1)

    # The consumer's own data path, as `CoordinatedConsumer.run` builds it; dispatching
    # makes no Kafka call.
    progress = ConsumerProgress()
    path = DataPath.build(
        noop, object(), progress, ConsumerStats(), DataPathSettings(), session=lambda: 0
    )
    dispatcher, fetcher = path.dispatcher, path.fetcher

    native = dispatcher.native

    def whole() -> None:
        progress.partitions.clear()
        progress.partitions.update(owning_everything().partitions)
        fetcher.dispatch([Chunk(TP, 0, 0, recs)])

    def whole_python() -> None:
        dispatcher.native = None
        try:
            whole()
        finally:
            dispatcher.native = native

    def us(fn: Callable[[], Any]) -> float:
        return best_us(fn, n, passes)

    base = us(empty)
    rows = [
        ("bare loop: `await handler(record)`", bare_us),
        ("slot: murmur3 of the key (slot_for_key)", us(slots) - us(keys)),
        ("fetch filter (PartitionProgress.accept)", us(accept) - base),
        ("inline dispatch incl. the handler (KeyLanes.dispatch)", us(dispatch) - base),
        ("keyshard's whole per-record path, Python loop", us(whole_python)),
    ]
    if native is not None:
        rows.append(("keyshard's whole per-record path, C fast path (_fastpath.run)", us(whole)))
    else:
        print("(no C fast path: consumer_client._fastpath is not built or is disabled)\n")
    print(f"{n:,} synthetic records, best of {passes} passes, microseconds per record:\n")
    print("| step | us/record |\n|---|---|")
    for name, per_record in rows:
        print(f"| {name} | {per_record:.3f} |")
    for name, cost in rows[-2 if native is not None else -1 :]:
        which = name.rsplit(", ", 1)[1]
        print(f"\nkeyshard's path ({which}) minus the bare loop's: {cost - bare_us:.3f} us/record")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="50,000 records, 3 passes")
    args = parser.parse_args()
    asyncio.run(main(50_000 if args.quick else 200_000, 3 if args.quick else 7))
