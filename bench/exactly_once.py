"""Exactly-once cost: records/s of one read-process-write app, exactly-once against
at-least-once with the same handler, and the transaction commit interval.

One Apache Kafka node (harness.brokers.kafka), one coordinator, and for every mode a
fresh input topic (2 partitions, keys `key-0..`), output topic and group, consumed by one
`harness.eos_app` process (64 keys at once; the handler waits `--handler-ms` and
burns `--cpu-ms` of CPU, then writes one output: at-least-once through a plain producer,
awaited until Kafka has it; exactly-once through `Outputs.send`). Throughput: a backlog of
`--records` inputs, counted from the 10th to the last percent of the outputs that a
read_committed reader sees (so exactly-once pays its commit latency too). Delay: then
`--paced` inputs at `--rate`/s, each output's arrival at that reader after its input was
produced. Modes run interleaved, `--rounds` times; the table shows medians.

    .venv/bin/python -m bench.exactly_once            # ~8 min; prints a Markdown table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench._common import ROOT
from harness import CoordinatorProcess, create_topic, median, percentile
from harness.brokers import running_broker
from keyshard.local.processes import stop_process

OUTPUT_PARTITIONS = 3


async def produce(
    bootstrap: str, topic: str, count: int, keys: int, start: int = 0, rate: float | None = None
) -> None:
    """Keyed inputs `key:seq`, as fast as possible or paced to `rate` per second."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        began = time.monotonic()
        futures = []
        for i in range(start, start + count):
            key = f"key-{i % keys}"
            value = f"{key}:{i // keys}".encode()
            futures.append(await producer.send(topic, value, key=key.encode()))
            if rate is not None and i % 20 == 0:
                await asyncio.sleep(max(0.0, began + (i - start) / rate - time.monotonic()))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


class OutputReader:
    """A read_committed reader of the output topic: counts, and each output's delay after
    its input was produced."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.reader = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed",
            enable_auto_commit=False, auto_offset_reset="earliest",
        )  # fmt: skip
        self.seen = 0
        self.delays_ms: list[float] = []

    async def start(self) -> None:
        await self.reader.start()
        self.reader.assign([TopicPartition(self.topic, p) for p in range(OUTPUT_PARTITIONS)])

    async def until(self, total: int, timeout: float = 600) -> tuple[float, float]:
        """Read until `total` outputs: (when a tenth of the new ones were seen, when all)."""
        first = self.seen
        t10 = 0.0
        deadline = time.monotonic() + timeout
        while self.seen < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.seen}/{total} outputs after {timeout:g} s")
            batches = await self.reader.getmany(timeout_ms=100)
            now_ms = time.time() * 1000
            for messages in batches.values():
                for m in messages:
                    self.delays_ms.append(now_ms - json.loads(m.value)["t"])
                self.seen += len(messages)
            if not t10 and self.seen - first >= (total - first) // 10:
                t10 = time.monotonic()
        return t10, time.monotonic()

    async def stop(self) -> None:
        await self.reader.stop()


def spawn(
    coordinator: CoordinatorProcess, args: argparse.Namespace, name: str, mode: list[str],
    topic_in: str, topic_out: str, log_dir: Path,
) -> subprocess.Popen[bytes]:  # fmt: skip
    with open(log_dir / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "harness.eos_app", "--group", f"bench-{name}",
                "--input", topic_in, "--output", topic_out, "--coordinator",
                coordinator.address, "--bootstrap", coordinator.bootstrap, "--name", name,
                "--handler-ms", str(args.handler_ms), "--cpu-ms", str(args.cpu_ms),
                "--prefix", f"bench-{name}", *mode,
            ],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip


async def run_mode(
    coordinator: CoordinatorProcess, args: argparse.Namespace, name: str, mode: list[str],
    log_dir: Path,
) -> dict[str, float]:  # fmt: skip
    """Throughput over a backlog of `--records`, then the output delay of `--paced`
    inputs produced at `--rate` per second (below what any mode sustains)."""
    bootstrap = coordinator.bootstrap
    topic_in, topic_out = f"bench.{name}.in", f"bench.{name}.out"
    await create_topic(bootstrap, topic_in, partitions=2)
    await create_topic(bootstrap, topic_out, partitions=OUTPUT_PARTITIONS)
    outputs = OutputReader(bootstrap, topic_out)
    await outputs.start()
    proc = spawn(coordinator, args, name, mode, topic_in, topic_out, log_dir)
    try:
        await produce(bootstrap, topic_in, args.records, args.keys)
        t10, t_end = await outputs.until(args.records)
        outputs.delays_ms.clear()
        paced = asyncio.create_task(
            produce(bootstrap, topic_in, args.paced, args.keys, args.records, args.rate)
        )
        await outputs.until(args.records + args.paced)
        await paced
    finally:
        stop_process(proc)
        await outputs.stop()
    return {
        "rate": (args.records - args.records // 10) / (t_end - t10),
        "p50_ms": percentile(outputs.delays_ms, 50),
        "p99_ms": percentile(outputs.delays_ms, 99),
    }


async def main(args: argparse.Namespace) -> None:
    modes: list[tuple[str, str, list[str]]] = [("alo", "at-least-once", ["--at-least-once"])]
    for interval in args.intervals:
        label = f"exactly-once, commit every {interval} ms"
        modes.append((f"eos{interval}", label, ["--interval-ms", str(interval)]))
    results: dict[str, list[dict[str, float]]] = {label: [] for _, label, _ in modes}
    with (
        tempfile.TemporaryDirectory(prefix="keyshard-bench-eos-") as tmp,
        running_broker("kafka") as broker,
    ):
        coordinator = CoordinatorProcess(broker.bootstrap_servers, Path(tmp))
        try:
            await coordinator.start()
            for round_ in range(args.rounds):  # modes interleaved: a noisy minute hits all
                for name, label, mode in modes:
                    result = await run_mode(coordinator, args, f"{name}r{round_}", mode, Path(tmp))
                    results[label].append(result)
                    print(f"{label}: {result}", file=sys.stderr)
        finally:
            coordinator.stop()
    medians = {
        label: {k: median([r[k] for r in runs]) for k in runs[0]} for label, runs in results.items()
    }
    base = medians[modes[0][1]]["rate"]
    print(
        f"\n{args.records} records backlog + {args.paced} at {args.rate:g}/s, {args.keys} keys, "
        f"handler {args.handler_ms:g} ms wait + {args.cpu_ms:g} ms CPU, 1 consumer process "
        f"(64 keys at once), Apache Kafka 4.3.1 (1 node), Python {platform.python_version()}, "
        f"nproc={len(os.sched_getaffinity(0))}, median of {args.rounds} rounds\n"
    )
    print("| mode | records/s | vs at-least-once | output delay p50 | p99 |")
    print("|---|---|---|---|---|")
    for label, m in medians.items():
        rate = m["rate"]
        print(
            f"| {label} | {rate:.0f} | {rate / base:.2f}x | {m['p50_ms']:.0f} ms "
            f"| {m['p99_ms']:.0f} ms |"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--paced", type=int, default=1_000)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keys", type=int, default=500)
    p.add_argument("--handler-ms", type=float, default=5.0)
    p.add_argument("--cpu-ms", type=float, default=1.0)
    p.add_argument("--intervals", type=int, nargs="+", default=[20, 100, 500])
    asyncio.run(main(p.parse_args()))
