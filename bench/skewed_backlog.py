"""Skewed backlog (issue 19, item 3): how fast a backlog of one partition drains when its keys
are skewed, keyshard against a Kafka share group and a KIP-848 consumer group.

One partition, filled before any consumer starts: 8,000 records (64-byte values) over 1,000
keys, each record's key drawn (seeded, so every run reads the same topic) uniformly, or by
Zipf weights 1 / (k + 1) ** s with s = 0.8 and 1.1; written in small producer batches
(~20 records each) and with Kafka's default batching (5 ms linger, 16 KiB). The handler is
5 ms of awaited I/O; 4 processes of each system, released at once (bench/_common.py):

- keyshard, with 1 and 8 lanes per process (`max_concurrency`: records of one key never
  run at once, nor out of order);
- KIP-932 share group (`confluent_kafka.ShareConsumer`, implicit acknowledgement,
  `max.poll.records` 20), each poll's records with 1 and 8 handlers at once per process;
- KIP-848 consumer group (confluent-kafka), one record at a time: with one partition one
  member gets it all, and in order it cannot handle more than one record at a time.

A run lasts until each of the 8,000 records was handled at least once, or 90 s after the
go (a timeout, reported as such). Measured from every handler call's log row: go -> first
record completed, first -> last record (the drain: the last record's first completed
handling), go -> last (end to end), per-key inversions and same-key overlaps
(`harness.order_stats`), duplicates (handler calls for a record already handled), and handler
calls per member (max / mean). Every configuration runs `--runs` times round-robin.

It measures the keyshard of this checkout (coordinator/ and consumer_client/ as they are).

Run: bash scripts/bench.sh skewed-backlog [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from bench._common import (
    Cluster,
    RunResult,
    RunSpec,
    cleanup,
    draw_keys,
    load_topic,
    machine,
    peer_missing,
    publish,
    run,
    workdir,
)
from harness import markdown_table, median
from harness.brokers import BROKER_KINDS

RECORDS = 8_000
KEYS = 1_000
PROCESSES = 4
TIMEOUT_S = 90.0
MAX_POLL_RECORDS = 20  # the share consumer's max.poll.records
DISTRIBUTIONS = {"uniform": 0.0, "Zipf 0.8": 0.8, "Zipf 1.1": 1.1}
BATCHINGS = {"small20": "small batches (~20)", "default": "Kafka default"}
SYSTEMS = ("keyshard", "share", "kip848")


def topic(batching: str, zipf: float) -> str:
    return f"skew-{batching}-z{zipf:g}"


def make_specs(
    batchings: list[str],
    distributions: list[str],
    concurrencies: list[int],
    systems: list[str],
    slow_first: float = 1.0,
) -> list[RunSpec]:
    specs = []
    for batching in batchings:
        for dist in distributions:
            for concurrency in concurrencies:
                for system in systems:
                    if system == "kip848" and concurrency != concurrencies[0]:
                        continue  # one record at a time whatever the concurrency
                    specs.append(
                        RunSpec(
                            system,
                            topic(batching, DISTRIBUTIONS[dist]),
                            RECORDS,
                            processes=PROCESSES,
                            handler="io",
                            concurrency=0 if system == "kip848" else concurrency,
                            order_log=True,
                            note=batching,
                            max_poll_records=MAX_POLL_RECORDS if system == "share" else 0,
                            until_all_s=TIMEOUT_S,
                            slow_first=slow_first,
                        )
                    )
    return specs


def rounds(specs: list[RunSpec], runs: int, cluster: Cluster) -> dict[int, list[RunResult]]:
    """Every spec `runs` times, round-robin (machine noise hits all alike)."""
    out: dict[int, list[RunResult]] = {i: [] for i in range(len(specs))}
    for r in range(runs):
        for i, spec in enumerate(specs):
            try:
                result = run(cluster, spec, timeout_s=TIMEOUT_S)
            except RuntimeError as err:  # a worker died: the row says so, the rest goes on
                result = RunResult(spec, 0, 0, 0, 0, 0, error=str(err).splitlines()[0][:200])
            out[i].append(result)
            print(f"  run {r + 1}/{runs} {row_name(spec):60} {summary(result)}", flush=True)
    return out


def row_name(spec: RunSpec) -> str:
    dist = next(d for d, z in DISTRIBUTIONS.items() if topic(spec.note, z) == spec.topic)
    return f"{BATCHINGS[spec.note]}, {dist}, {concurrency(spec)}, {system_name(spec)}"


def system_name(spec: RunSpec) -> str:
    return {"keyshard": "keyshard", "share": "share group", "kip848": "KIP-848 group"}[spec.system]


def concurrency(spec: RunSpec) -> str:
    return "1 (only)" if spec.system == "kip848" else str(spec.concurrency)


def drain(r: RunResult) -> float:
    return r.last_s - r.start_s


def complete(r: RunResult) -> bool:
    return not r.error and not r.timed_out and r.distinct >= r.spec.records


def summary(r: RunResult) -> str:
    if r.error:
        return f"error: {r.error}"
    o = r.order
    end = f"TIMEOUT ({r.distinct:,} of {r.spec.records:,})" if not complete(r) else "done"
    return (
        f"{end}: first {r.start_s:.1f} s, drain {drain(r):.1f} s, end to end {r.last_s:.1f} s, "
        f"inversions {o.inversions if o else '-'}, overlaps {o.overlaps if o else '-'}, "
        f"duplicates {o.redelivered if o else '-'}, per member {r.per_member}"
    )


def skew_table(specs: list[RunSpec], results: dict[int, list[RunResult]]) -> str:
    def seconds(values: list[float]) -> str:
        return f"{median(values):.1f}" if values else "-"

    done = {i: [r for r in rs if complete(r)] for i, rs in results.items()}
    share = {
        (s.topic, s.concurrency): median([drain(r) for r in done[i]])
        for i, s in enumerate(specs)
        if s.system == "share" and done[i]
    }
    rows = []
    for i, spec in enumerate(specs):
        rs, ok = results[i], done[i]
        orders = [r.order for r in rs if r.order is not None]
        base = share.get((spec.topic, spec.concurrency), 0.0)
        ratio = median([drain(r) for r in ok]) / base if ok and base else 0.0
        failed = [
            "error" if r.error else f"timeout ({r.distinct:,} of {r.spec.records:,})"
            for r in rs
            if not complete(r)
        ]
        members = [
            f"{max(r.per_member):,} / {sum(r.per_member) / len(r.per_member):,.0f}"
            for r in rs
            if r.per_member
        ]
        rows.append(
            [
                BATCHINGS[spec.note], row_name(spec).split(", ")[1], concurrency(spec),
                system_name(spec),
                seconds([r.start_s for r in ok]),
                " / ".join(f"{drain(r):.1f}" for r in ok) or "-",
                f"{ratio:.2f}x" if ratio and spec.system == "keyshard" else "-",
                seconds([r.last_s for r in ok]),
                " / ".join(f"{o.inversions:,}" for o in orders) or "-",
                " / ".join(f"{o.overlaps:,}" for o in orders) or "-",
                " / ".join(f"{o.redelivered:,}" for o in orders) or "-",
                "; ".join(members) or "-",
                " / ".join(moves(r) for r in ok) if spec.system == "keyshard" else "-",
                "; ".join(failed) or f"{len(rs)} of {len(rs)}",
            ]
        )  # fmt: skip
    header = [
        "producer batches", "keys", "concurrency per process", "system",
        "go -> first record, s", "first -> last record (drain), s, runs",
        "keyshard drain / share group's", "end to end, s", "inversions, runs",
        "same-key overlaps, runs", "duplicates, runs", "handler calls per member, max / mean",
        "keyshard: handoffs after the go; rebalances (s after the go: why), runs",
        "runs complete",
    ]  # fmt: skip
    return markdown_table(header, rows)


def moves(r: RunResult) -> str:
    """The ranges keyshard moved in a run: handoffs, and each rebalance's time and cause."""
    why = [
        f"{at:.1f} s: {reason.split(' imbalance')[0]} {reason.rsplit(' ', 3)[-3]}"
        for at, reason in r.rebalances
    ]
    return f"{len(r.moves)} ({', '.join(why) or 'no rebalance'})"


def skew_note(distributions: list[str]) -> str:
    """How skewed each topic is: the hottest key's records, and the floor that puts on the
    drain of any system that keeps per-key order (its records one after another, 5 ms each)."""
    lines = []
    for dist in distributions:
        counts = Counter(draw_keys(RECORDS, KEYS, True, DISTRIBUTIONS[dist]))
        top = counts.most_common(10)
        lines.append(
            f"- {dist}: hottest key {top[0][1]:,} records ({top[0][1] / RECORDS:.1%}; "
            f"ordered floor {top[0][1] * 0.005:.1f} s), 10 hottest "
            f"{sum(n for _, n in top) / RECORDS:.1%}, {len(counts):,} keys present"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="concurrency 1, uniform and Zipf 0.8, small batches, one run",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, help="runs per configuration (default 1)")
    parser.add_argument("--broker", choices=BROKER_KINDS, default="kafka")
    parser.add_argument(
        "--slow-first", type=float, default=1.0, metavar="FACTOR",
        help="the first process's handler takes FACTOR x 5 ms (a slower pod); default 1",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        batchings, dists, concurrencies = ["small20"], ["uniform", "Zipf 0.8"], [1]
    else:
        batchings, dists, concurrencies = list(BATCHINGS), list(DISTRIBUTIONS), [1, 8]
    runs = args.runs or 1
    systems = []
    for system in SYSTEMS:
        if why := peer_missing(system):
            print(f"{system} skipped: {why}")
        else:
            systems.append(system)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["bash scripts/bench.sh skewed-backlog", *given])
    header = (
        f"Machine: {machine()}.\nBroker: {args.broker}.\nCommand: `{command}`; {runs} run(s) "
        f"each, round-robin; {RECORDS:,} records over {KEYS:,} keys, one partition, "
        f"{PROCESSES} processes, 5 ms I/O handler"
        + (f" ({args.slow_first:g}x that in the first)" if args.slow_first != 1 else "")
        + f", timeout {TIMEOUT_S:.0f} s.\n"
        "Measures the keyshard of this checkout.\n"
    )
    print(header)
    work = workdir()
    try:
        with Cluster(work, args.broker) as cluster:
            t0 = time.monotonic()
            for batching in batchings:
                for dist in dists:
                    name = topic(batching, DISTRIBUTIONS[dist])
                    took = load_topic(
                        cluster.bootstrap, name, 1, RECORDS, KEYS, batching=batching,
                        random_keys=True, zipf=DISTRIBUTIONS[dist],
                    )  # fmt: skip
                    print(f"loaded {name}: {RECORDS:,} records in {took:.1f} s")
            specs = make_specs(batchings, dists, concurrencies, systems, args.slow_first)
            results = rounds(specs, runs, cluster)
            load = Path("/proc/loadavg").read_text().split()[:3]
            md = (
                f"{header}\n{skew_note(dists)}\n\n{skew_table(specs, results)}\n\n"
                f"Load average at the end: {' '.join(load)}.\n"
            )
            stem = "skewed_backlog" + ("-quick" if args.quick else "")
            if args.slow_first != 1:
                stem += f"-slow{args.slow_first:g}"
            publish(stem, md, results)
            print(f"total {time.monotonic() - t0:.0f} s")
    finally:
        cleanup(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
