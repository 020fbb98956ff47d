"""The `keyshard` Spark source against Spark's own Kafka source, on a 1-partition topic.

A 1-partition topic is pre-loaded with keyed records (key i mod `--keys`, 100-byte
values), on the embedded broker or on Apache Kafka (`--broker kafka`). For N = 1, 4, 16:

- keyshard: `spark.read.format("keyshard").option("ranges", N)`: N tasks, each reads the
  whole partition and keeps the keys of its slot range (whole keys, in offset order);
- Spark: `spark.read.format("kafka").option("minPartitions", N)`: Spark splits the
  partition's offset range into N sub-ranges, one task each, so one key's records land
  in several tasks that run in parallel.

Table 1 (read): the load written to Spark's `noop` sink (every row materialized, nothing
stored), median of `--runs` interleaved rounds after one untimed warm-up of each source,
plus a reference row reading the partition in-process with the executors' own reader
(`spark_jobs.kafka_io.read_slice`, no Spark). Then, untimed, each task's (key, offset)
sequence (`mapPartitionsWithIndex`): do offsets increase per key inside every task, and
how many keys have records in more than one task.

Table 2 (a per-key stateful step, order kept): a fold over each key's records in offset
order, ~`--work-ms` of CPU per record (iterated SHA-256, calibrated here), whose per-key
result depends on the order. keyshard: `mapPartitions` straight over each range's rows
(they arrive in per-key order). Spark: `repartition(N, "key")` +
`sortWithinPartitions("key", "offset")`, then the same `mapPartitions` (a shuffle: the
source's tasks split keys). Every per-key result is checked against keyshard at 1 range.

Writes bench/results/spark_source[-kafka].md, .json and .png (matplotlib).
Run: bash scripts/bench.sh spark [--broker kafka] [--quick] [--records N] [--threads T]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench import RESULTS
from bench._common import ROOT, cleanup, machine, workdir
from bench._spark_kafka import connector_version, spark_kafka_jars
from harness import markdown_table, median
from harness.brokers import BROKER_KINDS, new_broker, stop_broker
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import SlotRange
from keyshard.spark_jobs.kafka_io import SparkKafka, read_slice, read_watermarks
from keyshard.spark_jobs.planning import ReadSlice
from keyshard.spark_jobs.session import local_session
from keyshard.spark_jobs.source import register

TASKS = (1, 4, 16)
SOURCES = ("keyshard", "spark")
LABEL = {"keyshard": "keyshard, ranges", "spark": "Spark kafka, minPartitions"}
TOPIC = "bench.source"


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


def load(spark: Any, bootstrap: str, source: str, tasks: int) -> Any:
    """The topic as a DataFrame (key, value, topic, partition, offset, ...) in `tasks` tasks."""
    if source == "keyshard":
        reader = (
            spark.read.format("keyshard")
            .option("bootstrap_servers", bootstrap)
            .option("topics", TOPIC)
            .option("ranges", str(tasks))
        )
    else:
        reader = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("minPartitions", str(tasks))
        )
    return reader.load()


def time_read(spark: Any, bootstrap: str, source: str, tasks: int) -> float:
    frame = load(spark, bootstrap, source, tasks)
    began = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def time_in_process(bootstrap: str, records: int) -> float:
    piece = ReadSlice(TOPIC, 0, ((SlotRange(0, 65535), Position(0), Position(records)),))
    began = time.perf_counter()
    count = sum(len(rows) for rows in read_slice(piece, SparkKafka(bootstrap, {})))
    elapsed = time.perf_counter() - began
    assert count == records, (count, records)
    return elapsed


# ---- runs in Spark's Python workers (this module is __main__: pickled by value) ----------


def task_order(index: int, rows: Iterable[Any]) -> Iterator[tuple[int, int, int, list[bytes]]]:
    """One task's (index, rows, per-key offset regressions, keys seen)."""
    last: dict[bytes, int] = {}
    count = regressions = 0
    for key, offset in rows:
        k = bytes(key)
        count += 1
        if last.get(k, -1) >= offset:
            regressions += 1
        last[k] = offset
    yield index, count, regressions, sorted(last)


def fold(rows: Iterable[Any], rounds: int) -> Iterator[tuple[bytes, int, int, str]]:
    """The stateful step: per key, digest = SHA-256^rounds(digest + offset + value) over its
    records in arrival order; yields (key, records, offset regressions, final digest)."""
    state: dict[bytes, tuple[bytes, int, int, int]] = {}
    for key, offset, value in rows:
        k = bytes(key)
        digest, count, last, regressions = state.get(k, (b"", 0, -1, 0))
        digest = digest + offset.to_bytes(8, "big") + bytes(value)
        for _ in range(rounds):
            digest = hashlib.sha256(digest).digest()
        state[k] = (digest, count + 1, offset, regressions + (offset <= last))
    for k, (digest, count, _, regressions) in state.items():
        yield k, count, regressions, digest.hex()


# ---- the driver ---------------------------------------------------------------------------


def calibrate(work_ms: float) -> int:
    """SHA-256 rounds per record that take `work_ms` here (best of several tries)."""
    rows = [(b"k", i, b"x" * 100) for i in range(200)]
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in fold(rows, 200):
            pass
        best = min(best, (time.perf_counter() - began) / len(rows))
    return max(1, round(200 * work_ms / 1000 / best))


def order_check(spark: Any, bootstrap: str, source: str, tasks: int) -> dict[str, int]:
    frame = load(spark, bootstrap, source, tasks).select("key", "offset")
    per_task = frame.rdd.mapPartitionsWithIndex(task_order).collect()
    owners = Counter(k for _, _, _, keys in per_task for k in keys)
    return {
        "tasks": len(per_task),
        "rows": sum(count for _, count, _, _ in per_task),
        "regressions": sum(bad for _, _, bad, _ in per_task),
        "keys": len(owners),
        "split_keys": sum(1 for n in owners.values() if n > 1),
        "max_tasks_per_key": max(owners.values(), default=0),
    }


def stateful(
    spark: Any, bootstrap: str, source: str, tasks: int, rounds: int
) -> tuple[float, dict[bytes, tuple[int, int, str]]]:
    frame = load(spark, bootstrap, source, tasks).select("key", "offset", "value")
    if source == "spark":  # the source's tasks split keys: bring each key to one task
        frame = frame.repartition(tasks, "key").sortWithinPartitions("key", "offset")
    began = time.perf_counter()
    rows = frame.rdd.mapPartitions(lambda it: fold(it, rounds)).collect()
    elapsed = time.perf_counter() - began
    return elapsed, {k: (count, bad, digest) for k, count, bad, digest in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 records, 1 round")
    parser.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3, help="rounds of the read table")
    parser.add_argument("--stateful-runs", type=int, default=3, help="rounds of table 2")
    parser.add_argument("--work-ms", type=float, default=0.2, help="CPU per record, table 2")
    parser.add_argument("--threads", type=int, default=2, help="local[T] task slots")
    args = parser.parse_args()
    records, runs = (20_000, 1) if args.quick else (args.records, args.runs)
    stateful_runs = 1 if args.quick else args.stateful_runs
    where = machine()
    began = time.monotonic()
    rounds = calibrate(args.work_ms)
    print(f"{where}; {rounds} SHA-256 rounds per record ~ {args.work_ms} ms", flush=True)

    # Spark's Python workers import spark_jobs too: give them the checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    work = workdir()
    broker = new_broker(args.broker, work / "kafka")
    read: dict[str, list[float]] = {}
    orders: dict[str, dict[str, int]] = {}
    step: dict[str, list[float]] = {}
    correct: dict[str, str] = {}
    try:
        broker.start()
        bootstrap = broker.bootstrap_servers
        asyncio.run(preload(bootstrap, records, args.keys))
        marks = asyncio.run(read_watermarks(SparkKafka(bootstrap, {}), [TOPIC]))
        assert marks[(TOPIC, 0)] == (0, records), marks
        jars = ",".join(str(p) for p in spark_kafka_jars())
        spark = local_session(
            "keyshard-bench",
            threads=args.threads,
            **{"spark.jars": jars, "spark.ui.showConsoleProgress": "false"},
        )
        try:
            register(spark)
            for source in SOURCES:  # warm-up: workers, imports, JIT, class loading
                time_read(spark, bootstrap, source, 4)
            for _ in range(runs):  # interleaved, so drift in machine load hits all alike
                read.setdefault("in-process", []).append(time_in_process(bootstrap, records))
                for n in TASKS:
                    for source in SOURCES:
                        read.setdefault(f"{source}:{n}", []).append(
                            time_read(spark, bootstrap, source, n)
                        )
                        print(f"read {source} {n}: {read[f'{source}:{n}'][-1]:.2f} s", flush=True)
            for n in TASKS:
                for source in SOURCES:
                    orders[f"{source}:{n}"] = order_check(spark, bootstrap, source, n)
            reference: dict[bytes, tuple[int, int, str]] = {}
            for _ in range(stateful_runs):
                for n in TASKS:
                    for source in SOURCES:
                        name = f"{source}:{n}"
                        elapsed, result = stateful(spark, bootstrap, source, n, rounds)
                        step.setdefault(name, []).append(elapsed)
                        reference = reference or result
                        correct[name] = _compare(result, reference, records)
                        print(f"stateful {name}: {elapsed:.1f} s, {correct[name]}", flush=True)
        finally:
            spark.stop()
    finally:
        stop_broker(broker)
        cleanup(work)
    meta = {
        "machine": where,
        "load_at_end": f"{os.getloadavg()[0]:.1f}",
        "command": "bash scripts/bench.sh spark " + " ".join(sys.argv[1:]),
        "broker": args.broker,
        "records": records,
        "keys": args.keys,
        "threads": args.threads,
        "runs": runs,
        "stateful_runs": stateful_runs,
        "work_ms": args.work_ms,
        "sha256_rounds": rounds,
        "spark_kafka": connector_version(),
        "seconds": round(time.monotonic() - began),
    }
    report(meta, read, orders, step, correct)


def _compare(
    result: dict[bytes, tuple[int, int, str]],
    reference: dict[bytes, tuple[int, int, str]],
    records: int,
) -> str:
    """How a run's per-key results compare with keyshard at 1 range (the reference)."""
    rows = sum(count for count, _, _ in result.values())
    regressions = sum(bad for _, bad, _ in result.values())
    differ = sum(1 for k, v in result.items() if reference.get(k) != v)
    if rows == records and not regressions and not differ and len(result) == len(reference):
        return "yes"
    return f"no: {rows:,} rows, {regressions} regressions, {differ} keys differ"


def report(
    meta: dict[str, Any],
    read: dict[str, list[float]],
    orders: dict[str, dict[str, int]],
    step: dict[str, list[float]],
    correct: dict[str, str],
) -> None:
    records = int(meta["records"])
    medians = {name: median(times) for name, times in read.items()}
    rows1 = []
    for n in TASKS:
        for source in SOURCES:
            name, order = f"{source}:{n}", orders[f"{source}:{n}"]
            rows1.append(
                [
                    f"{LABEL[source]} = {n}",
                    str(order["tasks"]),
                    f"{medians[name]:.2f}",
                    f"{records / medians[name]:,.0f}",
                    f"{order['rows']:,}",
                    "yes" if order["regressions"] == 0 else f"no ({order['regressions']})",
                    f"{order['split_keys']:,} of {order['keys']:,}"
                    + (f" (up to {order['max_tasks_per_key']})" if order["split_keys"] else ""),
                    ", ".join(f"{t:.2f}" for t in read[name]),
                ]
            )
    inproc = medians["in-process"]
    rows1.append(["in-process read_slice, no Spark", "-", f"{inproc:.2f}"])
    rows1[-1] += [f"{records / inproc:,.0f}", f"{records:,}", "-", "-"]
    rows1[-1].append(", ".join(f"{t:.2f}" for t in read["in-process"]))
    table1 = markdown_table(
        [
            "source, N",
            "tasks",
            "median s",
            "rows/s",
            "rows read",
            "per-key offsets increase in every task",
            "keys split across tasks",
            "runs (s)",
        ],
        rows1,
    )
    rows2 = []
    for n in TASKS:
        for source in SOURCES:
            name = f"{source}:{n}"
            secs = median(step[name])
            plan = "mapPartitions" if source == "keyshard" else "shuffle by key + sort + same"
            runs_text = ", ".join(f"{t:.1f}" for t in step[name])
            rate = f"{records / secs:,.0f}"
            rows2.append(
                [f"{LABEL[source]} = {n}", plan, f"{secs:.1f}", rate, correct[name], runs_text]
            )
    table2 = markdown_table(
        ["source, N", "plan", "median s", "rows/s", "per-key order kept", "runs (s)"], rows2
    )
    header = (
        f"{records:,} records ({meta['keys']:,} keys, 100-byte values) on 1 partition; broker "
        f"{meta['broker']}; local[{meta['threads']}]; Spark's Kafka source "
        f"spark-sql-kafka-0-10_2.13 {meta['spark_kafka']}; {meta['machine']}, at end "
        f"{meta['load_at_end']}; {meta['seconds']} s"
    )
    text = (
        f"{header}\n\nTable 1: batch read to the noop sink (median of {meta['runs']})\n\n"
        f"{table1}\n\nTable 2: per-key stateful fold, ~{meta['work_ms']} ms CPU per record "
        f"({meta['sha256_rounds']} SHA-256 rounds), median of {meta['stateful_runs']}\n\n"
        f"{table2}\n"
    )
    print(text)
    stem = "spark_source" + ("-kafka" if meta["broker"] == "kafka" else "")
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(
        json.dumps(
            {**meta, "read_s": read, "order": orders, "stateful_s": step, "order_kept": correct},
            indent=1,
        )
    )
    plot(RESULTS / f"{stem}.png", meta, medians, step)


def plot(
    path: Path, meta: dict[str, Any], medians: dict[str, float], step: dict[str, list[float]]
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the plot", file=sys.stderr)
        return
    records = int(meta["records"])
    xs = list(TASKS)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for source in SOURCES:
        label = LABEL[source].replace(", ", ": ")
        left.plot(xs, [records / medians[f"{source}:{n}"] for n in xs], marker="o", label=label)
        right.plot(
            xs,
            [records / median(step[f"{source}:{n}"]) for n in xs],
            marker="o",
            label=label,
        )
    left.axhline(records / medians["in-process"], linestyle=":", color="grey", label="in-process")
    left.set_title("batch read to noop")
    right.set_title(f"per-key stateful fold, ~{meta['work_ms']} ms/record, order kept")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("N (ranges / minPartitions)")
        ax.set_ylabel("rows/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"1-partition topic, {records:,} records, broker {meta['broker']}, local[{meta['threads']}]"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
