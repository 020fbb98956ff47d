"""keyshard against the peers a user would pick on Apache Kafka 4.x, side by side in one run.

Same broker, same pre-filled topics (each record's key drawn uniformly from 10,000 keys,
so records of one key are sometimes close together; 64-byte values; 1 and 4 partitions;
the Java producer's default batching: 5 ms linger, 16 KiB batches), same handlers (5 ms
of awaited I/O; ~1 ms of CPU), N processes of each system, every configuration run
`--runs` times round-robin (so machine noise hits all alike):

- plain aiokafka group (classic protocol), each record awaited in order;
- KIP-848 consumer group (`group.protocol=consumer`, confluent-kafka), each record awaited
  in order;
- KIP-932 share group (`confluent_kafka.ShareConsumer`), each poll's records with up to 64
  handlers at once (keyshard's lanes per process), on the default-batched topic and on a
  copy written in small batches (~10 records): the broker hands acquired records out by
  batch, so with large batches one consumer may take a whole batch;
- Pyrallel Consumer 1.0.0 (key_hash ordering, async engine);
- keyshard (64 lanes per process).

Every handler call is logged (partition, offset, key, start, end) and per-key order is
judged from those logs (`harness.order_stats`), over the whole run. Throughput is the fixed
window of bench/_common.py, here after an 11 s warm-up from the first completed record:
in a KIP-848 group the first member gets every partition and the others theirs on later
heartbeats (5 s apart by default: the 4th of 4 members started consuming ~10 s after the
first), so a shorter warm-up would average group formation into its rate.

Run: bash scripts/bench.sh peers [--quick] [--broker kafka|tansu]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench import RESULTS
from bench._common import (
    KEYS,
    Cluster,
    RunResult,
    RunSpec,
    calibrate_cpu_loops,
    cleanup,
    load_topic,
    machine,
    peer_missing,
    publish,
    workdir,
)
from bench.throughput import LANES, Size, _pyplot, label, repeat
from harness import markdown_table, median
from harness.brokers import BROKER_KINDS

FULL = Size(records=600_000, runs=3, warmup_s=11.0, window_s=4.0, filter_records=0)
QUICK = Size(records=250_000, runs=1, warmup_s=11.0, window_s=2.0, filter_records=0)
#: (system, producer batching of the topic it reads)
SYSTEMS = [
    ("plain", "default"),
    ("kip848", "default"),
    ("share", "default"),
    ("share", "small"),
    ("pyrallel", "default"),
    ("keyshard", "default"),
]
BATCH_NOTE = {"default": "", "small": "small producer batches"}


def topic(batching: str, partitions: int) -> str:
    middle = "" if batching == "default" else f"-{batching}"
    return f"peers{middle}-p{partitions}"  # the partition count stays the last character


def make_specs(
    records: int, processes: tuple[int, ...], cpu_loops: int, systems: list[tuple[str, str]],
    warmup_s: float, window_s: float,
) -> list[RunSpec]:  # fmt: skip
    return [
        RunSpec(
            system,
            topic(batching, partitions),
            records,
            processes=n,
            handler=handler,
            concurrency=LANES if system in ("keyshard", "share") else 0,
            cpu_loops=cpu_loops,
            warmup_s=warmup_s,
            window_s=window_s,
            order_log=True,
            note=BATCH_NOTE[batching],
        )
        for handler in ("io", "cpu")
        for partitions in (1, 4)
        for n in processes
        for system, batching in systems
    ]


def peers_table(specs: list[RunSpec], results: dict[int, list[RunResult]]) -> str:
    rates = {i: median([r.rate for r in rs]) for i, rs in results.items()}
    keyshard = {
        (s.handler, s.topic[-1], s.processes): rates[i]
        for i, s in enumerate(specs)
        if s.system == "keyshard"
    }
    rows = []
    for i, spec in enumerate(specs):
        orders = [r.order for r in results[i] if r.order is not None and r.order.handled]
        failed = [r for r in results[i] if r.error]
        ks = keyshard.get((spec.handler, spec.topic[-1], spec.processes), 0)
        violations = " / ".join(f"{o.violations:,} ({o.share():.1%})" for o in orders)
        rows.append(
            [
                "5 ms I/O" if spec.handler == "io" else "~1 ms CPU", spec.topic[-1],
                str(spec.processes), label(spec), f"{rates[i]:,.0f}",
                " / ".join(f"{r.rate:,.0f}" for r in results[i])
                + (f" ({len(failed)} failed: {failed[0].error})" if failed else ""),
                f"{rates[i] / ks:.2f}x" if ks else "-",
                violations or "-",
                " / ".join(f"{o.keys_violated:,}" for o in orders) or "-",
                " / ".join(f"{o.redelivered:,}" for o in orders) or "-",
                " / ".join(f"{o.handled:,}" for o in orders) or "-",
                f"{median([r.start_s for r in results[i]]):.1f}",
            ]
        )  # fmt: skip
    header = [
        "handler", "partitions", "processes", "system", "median rec/s", "runs rec/s",
        "vs keyshard", "order violations, runs (share of records)", "keys violated",
        "redelivered", "handler calls logged", "go -> first record, s",
    ]  # fmt: skip
    return markdown_table(header, rows)


def peers_plot(specs: list[RunSpec], results: dict[int, list[RunResult]], path: Path) -> None:
    plt = _pyplot()
    if plt is None:
        return
    panels = sorted({(s.handler, s.topic[-1]) for s in specs})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), sharey=True)
    for ax, (handler, partitions) in zip(axes, panels, strict=True):
        chosen = [
            i for i, s in enumerate(specs) if (s.handler, s.topic[-1]) == (handler, partitions)
        ]
        names = [f"{label(specs[i])}, N={specs[i].processes}" for i in chosen]
        rates = [median([r.rate for r in results[i]]) for i in chosen]
        bars = ax.barh(names, rates)
        for bar, i in zip(bars, chosen, strict=True):
            orders = [r.order for r in results[i] if r.order is not None]
            bad = median([o.violations for o in orders]) if orders else 0
            ax.annotate(f" {bad:,.0f} out of order" if bad else " in order",
                        (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                        va="center", fontsize=7)  # fmt: skip
        what = "5 ms I/O" if handler == "io" else "~1 ms CPU"
        ax.set_title(f"{what}, {partitions} partition(s)", fontsize=9)
        ax.set_xscale("log")
        ax.set_xlim(left=100)
        ax.set_xlabel("records/s (median, log)")
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer records, one run each")
    parser.add_argument("--runs", type=int, help="runs per configuration (default 3, quick 1)")
    parser.add_argument("--broker", choices=BROKER_KINDS, default="kafka")
    parser.add_argument("--processes", default="4", help="comma-separated N, default 4")
    parser.add_argument("--handlers", default="io,cpu", help="io, cpu or both")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    if args.runs:
        size = replace(size, runs=args.runs)
    systems = []
    for system, batching in SYSTEMS:
        if why := peer_missing(system):
            print(f"{system} skipped: {why}")
        else:
            systems.append((system, batching))
    command = "bash scripts/bench.sh peers " + " ".join(sys.argv[1:] if argv is None else argv)
    header = f"Machine: {machine()}.\nBroker: {args.broker}.\nCommand: `{command}`; {size}.\n"
    print(header)
    work = workdir()
    try:
        with Cluster(work, args.broker) as cluster:
            t0 = time.monotonic()
            for batching in sorted({b for _, b in systems}):
                for partitions in (1, 4):
                    name = topic(batching, partitions)
                    took = load_topic(
                        cluster.bootstrap, name, partitions, size.records, KEYS,
                        batching=batching, random_keys=True,
                    )  # fmt: skip
                    print(f"loaded {name}: {size.records:,} records in {took:.1f} s")
            loops = calibrate_cpu_loops()
            print(f"cpu handler: {loops} loop iterations ~ 1 ms here")
            processes = tuple(int(n) for n in args.processes.split(","))
            specs = make_specs(
                size.records, processes, loops, systems, size.warmup_s, size.window_s
            )
            specs = [s for s in specs if s.handler in args.handlers.split(",")]
            results = repeat(cluster, specs, size.runs, print)
            table = peers_table(specs, results)
            md = f"{header}\n{table}\n\nCPU handler: {loops} loop iterations.\n"
            stem = "peers" + ("-quick" if args.quick else "")
            stem += "" if args.handlers == "io,cpu" else "-" + args.handlers.replace(",", "-")
            publish(stem, md, results)
            peers_plot(specs, results, RESULTS / f"{stem}.png")
            print(f"total {time.monotonic() - t0:.0f} s")
    finally:
        cleanup(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
