"""Batch-read throughput of the `keyshard` Spark source versus the number of slot ranges.

A 1-partition topic on the embedded broker is pre-loaded with keyed records; then
`spark.read.format("keyshard")...option("ranges", n).load()` is written to Spark's `noop`
sink (every row materialized, nothing stored) for n = 1, 2, 4, 8, 16, three timed runs each
after one untimed warm-up (Python workers, JIT). Reported: median seconds, rows/s, and the
ratio to n = 1. Each Spark task reads the whole partition and keeps its slots, so the
bytes fetched grow with n; what n buys is key-ordered parallelism of the *processing*
downstream, not a faster read of one partition. A reference row reads the same partition
in-process with the executors' own reader (`spark_jobs.kafka_io.read_slice`, no Spark).

Writes bench/spark_source.md and bench/spark_source.png (needs matplotlib).
Run: bash scripts/bench.sh spark [--quick] [--records N] [--threads T]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Spark's Python workers import spark_jobs too: give them the checkout.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

from aiokafka import AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

from coordinator.local.broker import EmbeddedBroker  # noqa: E402
from coordinator.model.positions import Position  # noqa: E402
from coordinator.model.ranges import SlotRange  # noqa: E402
from spark_jobs.kafka_io import SparkKafka, read_slice, read_watermarks  # noqa: E402
from spark_jobs.planning import ReadSlice  # noqa: E402
from spark_jobs.session import local_session  # noqa: E402
from spark_jobs.source import register  # noqa: E402

RANGES = (1, 2, 4, 8, 16)
TOPIC = "bench.source"
OUT = Path(__file__).resolve().parent


async def preload(bootstrap: str, records: int, keys: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256_000)
    await producer.start()
    try:
        value = b"x" * 100
        futures = [
            await producer.send(TOPIC, key=f"user-{i % keys}".encode(), value=value)
            for i in range(records)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def time_spark(spark: object, bootstrap: str, ranges: int) -> float:
    reader = (
        spark.read.format("keyshard")  # type: ignore[attr-defined]
        .option("bootstrap_servers", bootstrap)
        .option("topics", TOPIC)
        .option("ranges", str(ranges))
    )
    began = time.perf_counter()
    reader.load().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def time_in_process(bootstrap: str, records: int) -> float:
    piece = ReadSlice(TOPIC, 0, ((SlotRange(0, 65535), Position(0), Position(records)),))
    began = time.perf_counter()
    count = sum(len(rows) for rows in read_slice(piece, SparkKafka(bootstrap, {})))
    elapsed = time.perf_counter() - began
    assert count == records, (count, records)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 records, 1 timed run")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="local[T] task slots")
    args = parser.parse_args()
    records, runs = (20_000, 1) if args.quick else (args.records, args.runs)

    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        asyncio.run(preload(bootstrap, records, args.keys))
        marks = asyncio.run(read_watermarks(SparkKafka(bootstrap, {}), [TOPIC]))
        assert marks[(TOPIC, 0)] == (0, records), marks
        spark = local_session("keyshard-bench", threads=args.threads)
        try:
            register(spark)
            time_spark(spark, bootstrap, 2)  # warm-up: workers, imports, JIT
            results: dict[str, list[float]] = {}
            for _ in range(runs):  # interleaved, so drift in machine load hits all alike
                results.setdefault("in-process", []).append(time_in_process(bootstrap, records))
                for n in RANGES:
                    results.setdefault(str(n), []).append(time_spark(spark, bootstrap, n))
        finally:
            spark.stop()

    medians = {name: statistics.median(times) for name, times in results.items()}
    base = records / medians["1"]
    lines = [
        "| slot ranges (Spark tasks) | median s | rows/s | vs 1 range | runs (s) |",
        "|---|---|---|---|---|",
    ]
    for name in [str(n) for n in RANGES] + ["in-process"]:
        rate = records / medians[name]
        label = name if name != "in-process" else "in-process read_slice, no Spark"
        runs_text = ", ".join(f"{t:.2f}" for t in results[name])
        lines.append(
            f"| {label} | {medians[name]:.2f} | {rate:,.0f} | {rate / base:.2f}x | {runs_text} |"
        )
    header = (
        f"{records:,} records ({args.keys:,} keys, 100-byte values) on 1 partition; "
        f"local[{args.threads}]; median of {runs}; {platform.python_version()}, "
        f"nproc={os.cpu_count()}, {time.strftime('%Y-%m-%d')}"
    )
    table = "\n".join(lines)
    print(header)
    print(table)
    (OUT / "spark_source.md").write_text(f"{header}\n\n{table}\n")
    plot(medians, records, args.threads)


def plot(medians: dict[str, float], records: int, threads: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the plot", file=sys.stderr)
        return
    xs = list(RANGES)
    ys = [records / medians[str(n)] for n in xs]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(xs, ys, marker="o", label=f"Spark batch read, local[{threads}]")
    ax.axhline(records / medians["in-process"], linestyle=":", color="grey", label="in-process")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("slot ranges on one partition (= Spark tasks)")
    ax.set_ylabel("rows/s")
    ax.set_ylim(bottom=0)
    ax.set_title("keyshard source: batch read of a 1-partition topic")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "spark_source.png", dpi=90)
    print(f"wrote {OUT / 'spark_source.png'}")


if __name__ == "__main__":
    main()
