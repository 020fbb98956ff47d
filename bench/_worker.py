"""One consumer process of a throughput benchmark, for any of the compared systems.

Started by `bench/_common.py` (`Run`). It only imports the standard library at the top: the
peers (Pyrallel Consumer; confluent-kafka's KIP-848 consumer and share consumer) run in
virtualenvs of their own under the project's cache, which have neither aiokafka nor
keyshard. Protocol with the orchestrator:

1. import and build everything, then wait until the file `--go` exists (so Python start-up
   time of the N processes is not measured, only consumption);
2. consume; every completed handler call is counted in 10 ms buckets of `time.monotonic()`
   (CLOCK_MONOTONIC is system-wide on Linux, so buckets of different processes line up);
   a small live file `--status` says how many were done so far (with `--track-distinct`
   also which offsets, as a bitmap, so the orchestrator can stop once every record was
   handled somewhere, counting a record handled twice once);
3. on SIGTERM stop (gracefully where the system has a graceful stop) and write the final
   JSON (`--status`): buckets, counts, keyshard's fetch counters when it has them, and with
   `--order-log` every handler call as [partition, offset, key number, start, end].
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

BUCKET_S = 0.01
STOPPING = threading.Event()  # set on SIGTERM


class Meter:
    """Completion counter in time buckets, flushed to a status file."""

    def __init__(self, status: Path) -> None:
        self.status = status
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.first: float | None = None
        self.extra: dict[str, Any] = {}
        self.order: list[tuple[int, int, int, float, float]] | None = None
        self.seen: bytearray | None = None  # --track-distinct: bit per offset handled
        # (records done, CPU seconds of the process) at each report: CPU per record is
        # much steadier than records per second on a busy machine (bench/ab.py).
        self.cpu: list[tuple[int, float]] = []

    def done(self, record: Any = None, start: float = 0.0) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.count += 1
        self.buckets[int(now / BUCKET_S)] += 1
        if record is not None and (self.order is not None or self.seen is not None):
            partition, offset, key = where(record)
            if self.order is not None:
                self.order.append((partition, offset, key, start, now))
            if self.seen is not None:  # offsets of one partition (the topics it is used on)
                if offset // 8 >= len(self.seen):
                    self.seen.extend(bytes(offset // 8 + 1 - len(self.seen)))
                self.seen[offset // 8] |= 1 << (offset % 8)

    def sample_cpu(self) -> None:
        self.cpu.append((self.count, time.process_time()))

    def cpu_span(self) -> list[tuple[int, float]]:
        """The first sample with records done and the first with all of them: the CPU
        spent on records, without start-up and shutdown ([] when there were none)."""
        busy = [sample for sample in self.cpu if sample[0] > 0]
        if not busy:
            return []
        last = busy[-1][0]
        return [busy[0], next(sample for sample in busy if sample[0] == last)]

    def write(self, final: bool) -> None:
        data: dict[str, Any] = {"pid": os.getpid(), "count": self.count, "first": self.first}
        if self.seen is not None:
            data["seen"] = base64.b64encode(self.seen).decode()
        if final:
            data["final"] = True
            data["buckets"] = {str(k): v for k, v in self.buckets.items()}
            data.update(self.extra)
            data["cpu"] = self.cpu_span()
            if self.order is not None:
                data["order"] = self.order
        tmp = self.status.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.status)


def where(record: Any) -> tuple[int, int, int]:
    """(partition, offset, key number) of a record of any of the clients: aiokafka's and
    keyshard's (attributes), confluent-kafka's (methods), Pyrallel's WorkItem (`tp`)."""
    if hasattr(record, "tp"):
        partition, offset, key = record.tp.partition, record.offset, record.key
    elif callable(record.offset):
        partition, offset, key = record.partition(), record.offset(), record.key()
    else:
        partition, offset, key = record.partition, record.offset, record.key
    return partition, offset, int(key[4:])  # b"key-123"


def make_handler(
    kind: str, cpu_loops: int, meter: Meter, io_scale: float = 1.0
) -> Callable[[Any], Awaitable[None]]:
    """The user's work per record: 5 ms (x `io_scale`: a slower process) of awaited I/O, a
    fixed CPU burn, or nothing."""
    if kind == "io":
        io_s = 0.005 * io_scale

        async def io(record: Any) -> None:
            start = time.monotonic()
            await asyncio.sleep(io_s)
            meter.done(record, start)

        return io
    if kind == "cpu":

        async def cpu(record: Any) -> None:
            start = time.monotonic()
            burn(cpu_loops)
            meter.done(record, start)

        return cpu

    async def noop(_: Any) -> None:
        meter.done()

    return noop


def burn(loops: int) -> int:
    """A busy loop; `loops` is calibrated by the orchestrator to take ~1 ms."""
    x = 0
    for i in range(loops):
        x += i
    return x


async def wait_go(args: argparse.Namespace) -> None:
    """Say "ready" (everything imported and built), then wait for the common start."""
    args.status.with_suffix(".ready").touch()
    while not args.go.exists():  # noqa: ASYNC110 - set by another process: a file to poll
        await asyncio.sleep(0.005)


def reporter(meter: Meter, stopping: threading.Event) -> None:
    """A thread, not a task: a CPU-bound handler in a plain loop never yields to the event
    loop while aiokafka has records buffered, and the orchestrator must still see progress."""
    while not stopping.wait(0.1):
        meter.sample_cpu()
        meter.write(final=False)


# ---- the systems ----------------------------------------------------------------------


async def run_plain(args: argparse.Namespace, handler: Any, stop: asyncio.Event) -> None:
    """What a user writes: a subscribe() group, each record awaited in order."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest",
    )
    await wait_go(args)
    await consumer.start()

    async def loop() -> None:
        async for record in consumer:
            await handler(record)
            if STOPPING.is_set():
                return

    task = asyncio.create_task(loop())
    await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when="FIRST_COMPLETED")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(consumer.stop(), 10)


async def run_bare(args: argparse.Namespace, handler: Any, stop: asyncio.Event) -> None:
    """The floor for filter overhead: manual assignment, getmany, records in order."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from keyshard.core.kafka.metadata import partitions_of

    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await wait_go(args)
    await consumer.start()
    # A fresh metadata answer: a fresh consumer's cache knows no topic on Apache Kafka.
    answer = await partitions_of(args.bootstrap, [args.topic], timeout=10)
    parts = answer.require(args.bootstrap)[args.topic]
    consumer.assign([TopicPartition(args.topic, p) for p in parts])

    async def loop() -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=2000)
            for records in batches.values():
                for record in records:
                    await handler(record)
            if STOPPING.is_set():
                return

    task = asyncio.create_task(loop())
    await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when="FIRST_COMPLETED")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(consumer.stop(), 10)


async def run_keyshard(
    args: argparse.Namespace, handler: Any, stop: asyncio.Event, meter: Meter
) -> None:
    from keyshard.consumer_client import CoordinatedConsumer

    consumer = CoordinatedConsumer(
        group=args.group,
        topics=[args.topic],
        coordinator=args.coordinator,
        bootstrap_servers=args.bootstrap,
        name=args.name,
        max_concurrency=args.concurrency,
        **({"replay_window": args.replay_window} if args.replay_window >= 0 else {}),
    )
    await wait_go(args)
    task = asyncio.create_task(consumer.run(handler))
    await stop.wait()
    await consumer.close()
    await asyncio.gather(task, return_exceptions=True)
    meter.extra["stats"] = consumer.stats.as_dict()


async def run_pyrallel(args: argparse.Namespace, handler: Any, stop: asyncio.Event) -> None:
    """Pyrallel Consumer 1.0.0, key_hash ordering (per record key), async engine."""
    from pyrallel_consumer import (
        ExecutionMode,
        KafkaConfig,
        OrderingMode,
        PyrallelConsumer,
    )

    # 10 s session like aiokafka's default: Tansu holds a JoinGroup for a share of the
    # session timeout, and the library's 60 s default made every start wait ~23 s.
    config = KafkaConfig(
        BOOTSTRAP_SERVERS=args.bootstrap, CONSUMER_GROUP=args.group, SESSION_TIMEOUT_MS=10_000
    )
    config.dlq_enabled = False
    config.parallel_consumer.ordering_mode = OrderingMode.KEY_HASH
    config.parallel_consumer.execution.mode = ExecutionMode.ASYNC
    if args.concurrency:
        config.parallel_consumer.execution.max_in_flight = args.concurrency
    consumer = PyrallelConsumer(config=config, worker=handler, topic=args.topic)
    await wait_go(args)
    await consumer.start()
    await stop.wait()
    await consumer.stop()


async def run_kip848(args: argparse.Namespace, handler: Any, stop: asyncio.Event) -> None:
    """A KIP-848 consumer group (`group.protocol=consumer`: the broker assigns partitions,
    incrementally), confluent-kafka, each record awaited in order, as the plain group."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    await wait_go(args)
    consumer.subscribe([args.topic])
    loop = asyncio.get_running_loop()
    try:
        # STOPPING, not `stop`: a CPU-bound handler never suspends while records are
        # prefetched, so the loop would never run the stop callback (as in run_plain).
        while not STOPPING.is_set():
            # poll(0) serves what librdkafka has prefetched; when nothing is, wait for it
            # in a thread so the loop (and the stop signal) stays live.
            msg = consumer.poll(0)
            if msg is None:
                msg = await loop.run_in_executor(None, consumer.poll, 0.1)
            if msg is None or msg.error():
                continue
            await handler(msg)
    finally:
        await loop.run_in_executor(None, consumer.close)


def set_share_group_earliest(bootstrap: str, group: str) -> None:
    """A share group starts at the partitions' end by default; this one starts at their
    beginning, like every other system here (IncrementalAlterConfigs on the GROUP)."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the answer is in
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


async def run_share(args: argparse.Namespace, handler: Any, stop: asyncio.Event) -> None:
    """A KIP-932 share group member (confluent_kafka.ShareConsumer, implicit acknowledgement):
    each poll's records are handled with up to `--concurrency` handlers at a time (the
    same per-process concurrency as keyshard's lanes), then the next poll accepts them."""
    from confluent_kafka import ShareConsumer

    set_share_group_earliest(args.bootstrap, args.group)
    config = {"bootstrap.servers": args.bootstrap, "group.id": args.group}
    if args.max_poll_records:
        config["max.poll.records"] = str(args.max_poll_records)
    consumer = ShareConsumer(config)
    await wait_go(args)
    consumer.subscribe([args.topic])
    loop = asyncio.get_running_loop()
    limit = asyncio.Semaphore(max(1, args.concurrency))

    async def handle(msg: Any) -> None:
        async with limit:
            await handler(msg)

    try:
        while not STOPPING.is_set():
            batch = await loop.run_in_executor(None, consumer.poll, 0.1)
            records = [m for m in batch if not m.error()]
            if records:
                await asyncio.gather(*(handle(m) for m in records))
    finally:
        await loop.run_in_executor(None, consumer.close)


# Pyrallel's process engine runs the handler in forked worker processes: it must be a
# picklable (top-level) synchronous function, and it counts completions in shared memory
# created before the fork; the parent samples that count into the meter's buckets.
_SHARED_DONE: Any = None
_CPU_LOOPS = 0
PROCESS_WORKERS = os.cpu_count() or 1


def process_worker(_: Any) -> None:
    burn(_CPU_LOOPS)
    with _SHARED_DONE.get_lock():
        _SHARED_DONE.value += 1


def sample_shared(meter: Meter, shared: Any, stopping: threading.Event) -> None:
    seen = 0
    while not stopping.wait(BUCKET_S):
        done = shared.value
        if done > seen:
            now = time.monotonic()
            meter.first = meter.first if meter.first is not None else now
            meter.buckets[int(now / BUCKET_S)] += done - seen
            meter.count, seen = done, done


async def run_pyrallel_process(args: argparse.Namespace, meter: Meter, stop: asyncio.Event) -> None:
    """Pyrallel Consumer 1.0.0, key_hash ordering, process engine: what its users would pick
    for CPU-bound handlers. `PROCESS_WORKERS` (one per core) worker processes per consumer."""
    import multiprocessing

    from pyrallel_consumer import (
        ExecutionMode,
        KafkaConfig,
        OrderingMode,
        PyrallelConsumer,
    )

    global _SHARED_DONE, _CPU_LOOPS
    if args.handler != "cpu":
        raise SystemExit("the process engine is only measured with the cpu handler")
    _SHARED_DONE, _CPU_LOOPS = multiprocessing.Value("q", 0), args.cpu_loops
    config = KafkaConfig(
        BOOTSTRAP_SERVERS=args.bootstrap, CONSUMER_GROUP=args.group, SESSION_TIMEOUT_MS=10_000
    )
    config.dlq_enabled = False
    config.parallel_consumer.ordering_mode = OrderingMode.KEY_HASH
    config.parallel_consumer.execution.mode = ExecutionMode.PROCESS
    config.parallel_consumer.execution.process_config.process_count = PROCESS_WORKERS
    consumer = PyrallelConsumer(config=config, worker=process_worker, topic=args.topic)
    sampler = threading.Thread(
        target=sample_shared, args=(meter, _SHARED_DONE, STOPPING), daemon=True
    )
    sampler.start()
    await wait_go(args)
    await consumer.start()
    await stop.wait()
    await consumer.stop()


async def main(args: argparse.Namespace) -> None:
    meter = Meter(args.status)
    if args.order_log:
        meter.order = []
    if args.track_distinct:
        meter.seen = bytearray()
    handler = make_handler(args.handler, args.cpu_loops, meter, args.io_scale)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(*_: object) -> None:
        STOPPING.set()  # seen by loops that never yield
        loop.call_soon_threadsafe(stop.set)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    live = threading.Thread(target=reporter, args=(meter, STOPPING), daemon=True)
    live.start()
    try:
        if args.system == "plain":
            await run_plain(args, handler, stop)
        elif args.system == "bare":
            await run_bare(args, handler, stop)
        elif args.system == "keyshard":
            await run_keyshard(args, handler, stop, meter)
        elif args.system == "pyrallel":
            await run_pyrallel(args, handler, stop)
        elif args.system == "kip848":
            await run_kip848(args, handler, stop)
        elif args.system == "share":
            await run_share(args, handler, stop)
        elif args.system == "pyrallel-process":
            await run_pyrallel_process(args, meter, stop)
        else:
            raise SystemExit(f"unknown system {args.system!r}")
    finally:
        STOPPING.set()
        live.join()
        meter.write(final=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    systems = ["plain", "bare", "keyshard", "pyrallel", "pyrallel-process", "kip848", "share"]
    p.add_argument("--system", required=True, choices=systems)
    p.add_argument("--handler", required=True, choices=["io", "cpu", "noop"])
    p.add_argument("--cpu-loops", type=int, default=0)
    p.add_argument("--io-scale", type=float, default=1.0, help="io handler: 5 ms x this")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--coordinator", default="")
    p.add_argument("--name", default="bench")
    p.add_argument("--concurrency", type=int, default=0)
    p.add_argument("--replay-window", type=int, default=-1, help="keyshard; -1: its default")
    p.add_argument("--order-log", action="store_true", help="log every handler call")
    p.add_argument("--track-distinct", action="store_true", help="offsets handled, live")
    p.add_argument("--max-poll-records", type=int, default=0, help="share group; 0: default")
    p.add_argument("--go", type=Path, required=True)
    p.add_argument("--status", type=Path, required=True)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
