"""Throughput of keyshard against what a user would pick instead, side by side in one run.

Subcommands (each writes bench/results/throughput-<name>.md, .json and .png and prints its table):

- `slow`   — handler = 5 ms of awaited I/O; 1- and 4-partition topics, 10,000 keys; plain
             aiokafka subscribe() group, Pyrallel Consumer 1.0.0 (key_hash, async engine)
             and keyshard, each with N = 1 and 4 processes.
- `cpu`    — the same systems with a handler burning ~1 ms of CPU; N = 1, 2, 4 processes.
- `filter` — one keyshard consumer owning every slot against a bare aiokafka getmany loop,
             no-op handler, on the same data; also the same consumer with its Python loop
             instead of the C fast path (KEYSHARD_PURE_PYTHON=1).
- `amplification` — 1, 2, 4, 8 keyshard consumers on one partition: records decoded per
             record processed (each consumer reads the whole partition).
- `churn`  — the same while 8 consumers join one after another on a full topic, with the
             replay window at its default, off and 10x (table only, no plot).
- `cpu` also runs Pyrallel's process engine (its pick for CPU-bound handlers).
- `all`    — every one of the above.

The embedded Tansu broker and a coordinator daemon are started here; topics are filled
before any consumer starts. Each configuration runs `--runs` times, interleaved with the
others (so machine noise hits all systems alike); tables show medians.

Run: bash scripts/bench.sh PART [--quick] [--broker tansu|kafka]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
    run,
    save_json,
    workdir,
)
from bench._worker import PROCESS_WORKERS
from harness import markdown_table, median
from harness.brokers import BROKER_KINDS

LANES = 64  # keyshard's default max_concurrency


@dataclass(frozen=True)
class Size:
    records: int  # per topic
    runs: int
    warmup_s: float
    window_s: float
    # Part 3 times the whole topic for both systems: the bare loop needs enough records to
    # take a measurable time (it reads ~0.5 M rec/s; buckets are 10 ms).
    filter_records: int


FULL = Size(records=200_000, runs=3, warmup_s=1.0, window_s=4.0, filter_records=1_600_000)
QUICK = Size(records=40_000, runs=1, warmup_s=0.5, window_s=2.0, filter_records=200_000)


def label(spec: RunSpec) -> str:
    if spec.system == "keyshard":
        loop = ", Python loop" if spec.pure_python else ""
        return f"keyshard ({spec.concurrency or LANES} lanes{loop})"
    if spec.system == "pyrallel-process":
        return f"Pyrallel Consumer (process engine, {PROCESS_WORKERS} workers each)"
    if spec.system == "pyrallel":
        return "Pyrallel Consumer" + (
            f" (max_in_flight {spec.concurrency})" if spec.concurrency else ""
        )
    if spec.system == "plain":
        return "plain aiokafka group" + (f" ({spec.note})" if spec.note else "")
    if spec.system == "kip848":
        return "KIP-848 consumer group (confluent-kafka)"
    if spec.system == "share":
        note = f", {spec.note}" if spec.note else ""
        return f"share group ({spec.concurrency or LANES} in flight{note})"
    return "bare getmany loop"


def repeat(
    cluster: Cluster, specs: list[RunSpec], runs: int, log: Callable[[str], None]
) -> dict[int, list[RunResult]]:
    """Every spec `runs` times, round-robin; results by spec index."""
    out: dict[int, list[RunResult]] = {i: [] for i in range(len(specs))}
    for r in range(runs):
        for i, spec in enumerate(specs):
            result = run(cluster, spec)
            out[i].append(result)
            log(
                f"  run {r + 1}/{runs} {label(spec):34} p={spec.topic[-1]} N={spec.processes}: "
                f"{result.rate:9.0f} rec/s (first record after {result.start_s:.1f} s) "
                f"{result.error}"
            )
    return out


# ---- parts 1 and 2: scale-out -------------------------------------------------------------


def scale_out(
    cluster: Cluster, size: Size, handler: str, counts: tuple[int, ...], cpu_loops: int,
    log: Callable[[str], None],
) -> tuple[list[RunSpec], dict[int, list[RunResult]]]:  # fmt: skip
    systems = ["plain", "keyshard"]
    if not (why := peer_missing("pyrallel")):
        # Its process engine runs sync handlers in worker processes: the pick for CPU work.
        systems[1:1] = ["pyrallel", "pyrallel-process"] if handler == "cpu" else ["pyrallel"]
    else:
        log(f"Pyrallel Consumer skipped: {why}")
    specs = [
        RunSpec(
            system,
            f"{handler}-p{partitions}",
            size.records,
            processes=n,
            handler=handler,
            concurrency=LANES if system == "keyshard" else 0,
            cpu_loops=cpu_loops,
            warmup_s=size.warmup_s,
            window_s=size.window_s,
        )
        for partitions in (1, 4)
        for n in counts
        for system in systems
    ]
    return specs, repeat(cluster, specs, size.runs, log)


def scale_table(specs: list[RunSpec], results: dict[int, list[RunResult]]) -> str:
    rates = {i: median([r.rate for r in rs]) for i, rs in results.items()}
    by_key = {(s.system, s.topic, s.processes): rates[i] for i, s in enumerate(specs)}
    rows = []
    for i, spec in enumerate(specs):
        plain = by_key.get(("plain", spec.topic, spec.processes), 0)
        # Against the faster of Pyrallel's engines (the process one only runs in part 2).
        pyr = max(
            by_key.get(("pyrallel", spec.topic, spec.processes), 0),
            by_key.get(("pyrallel-process", spec.topic, spec.processes), 0),
        )
        starts = [r.start_s for r in results[i]]
        rows.append(
            [
                spec.topic[-1], str(spec.processes), label(spec), f"{rates[i]:,.0f}",
                " / ".join(f"{r.rate:,.0f}" for r in results[i]),
                f"{rates[i] / plain:.1f}x" if plain else "-",
                f"{rates[i] / pyr:.2f}x" if pyr else "-",
                f"{median(starts):.1f}",
            ]
        )  # fmt: skip
    header = [
        "partitions", "processes", "system", "median rec/s", "runs rec/s", "vs plain group",
        "vs Pyrallel (faster engine)", "go -> first record, s",
    ]  # fmt: skip
    return markdown_table(header, rows)


def scale_plot(
    specs: list[RunSpec], results: dict[int, list[RunResult]], title: str, path: Path
) -> None:
    plt = _pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, partitions in zip(axes, ("1", "4"), strict=True):
        for system in ("plain", "pyrallel", "pyrallel-process", "keyshard"):
            points = [
                (s.processes, median([r.rate for r in results[i]]))
                for i, s in enumerate(specs)
                if s.system == system and s.topic[-1] == partitions
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(
                    xs, ys, marker="o", label=label(specs[[s.system for s in specs].index(system)])
                )
        ax.set_title(f"{title}, {partitions} partition(s)")
        ax.set_xlabel("consumer processes")
        ax.set_xticks(sorted({s.processes for s in specs}))
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("records/s (median, log scale)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- part 3: filter overhead --------------------------------------------------------------


def filter_overhead(
    cluster: Cluster, size: Size, log: Callable[[str], None]
) -> tuple[list[RunSpec], dict[int, list[RunResult]]]:
    # Same basis for both: every record of the topic, from the first completed record to the
    # last (no warm-up, no window). A window after a warm-up second would measure the bare
    # loop over its whole run (it finishes inside the warm-up) but keyshard only in steady
    # state, and over a different number of records.
    base = RunSpec(
        "bare", "noop-p1", size.filter_records, handler="noop", warmup_s=0.0, window_s=600.0
    )
    keyshard = replace(base, system="keyshard", concurrency=LANES)
    # The same consumer without its C fast path (consumer_client/_fastpath.c), for scale.
    specs = [base, keyshard, replace(keyshard, pure_python=True)]
    return specs, repeat(cluster, specs, max(size.runs, 3), log)


def filter_table(specs: list[RunSpec], results: dict[int, list[RunResult]]) -> str:
    rates = [median([r.rate for r in results[i]]) for i in range(len(specs))]
    rows = [
        [
            label(spec),
            f"{median([r.measured for r in results[i]]):,.0f}",
            f"{median([r.window_s for r in results[i]]):.2f}",
            f"{rates[i]:,.0f}",
            " / ".join(f"{r.rate:,.0f}" for r in results[i]),
            f"{rates[i] / rates[0]:.2f}x",
        ]
        for i, spec in enumerate(specs)
    ]
    header = [
        "system", "records timed", "first -> last record, s", "median rec/s", "runs rec/s",
        "vs bare loop",
    ]  # fmt: skip
    return markdown_table(header, rows)


def filter_plot(specs: list[RunSpec], results: dict[int, list[RunResult]], path: Path) -> None:
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    names = [label(s) for s in specs]
    rates = [median([r.rate for r in results[i]]) for i in range(len(specs))]
    ax.barh(names, rates)
    for i in range(len(specs)):
        ax.plot([r.rate for r in results[i]], [i] * len(results[i]), "k.", label=None)
    ax.set_xlabel("records/s, whole topic, no-op handler\n(bars: median; dots: runs)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- part 6: read amplification -----------------------------------------------------------


def amplification(
    cluster: Cluster, size: Size, log: Callable[[str], None]
) -> tuple[list[RunSpec], dict[int, list[RunResult]]]:
    # The whole topic is consumed (no window) so fetched/processed covers every record.
    records = size.records // 4
    specs = [
        RunSpec(
            "keyshard",
            "amp-p1",
            records,
            processes=n,
            handler="noop",
            concurrency=LANES,
            warmup_s=0.0,
            window_s=600.0,
            fill_when_settled=True,
        )
        for n in (1, 2, 4, 8)
    ]
    return specs, repeat(cluster, specs, size.runs, log)


def churn(
    cluster: Cluster, size: Size, log: Callable[[str], None]
) -> tuple[list[RunSpec], dict[int, list[RunResult]]]:
    """Part 6 while the group changes: 8 consumers join one after another (every 0.25 s)
    while a 1-partition topic is read with the 5 ms handler, with keyshard's replay window
    at its default, off (0: a grant behind the fetch position rewinds the partition), and
    ten times larger."""
    specs = [
        RunSpec(
            "keyshard",
            "churn-p1",
            size.records // 2,
            processes=8,
            handler="io",
            concurrency=LANES,
            warmup_s=0.0,
            window_s=600.0,
            stagger_s=0.25,
            replay_window=window,
        )
        for window in (-1, 0, 100_000)
    ]
    return specs, repeat(cluster, specs, size.runs, log)


def churn_table(specs: list[RunSpec], results: dict[int, list[RunResult]]) -> str:
    rows = []
    for i, spec in enumerate(specs):
        runs = [r for r in results[i] if r.stats.get("processed")]
        amps = [r.stats["fetched"] / r.stats["processed"] for r in runs]
        rows.append(
            [
                "10,000 (default)" if spec.replay_window < 0 else f"{spec.replay_window:,}",
                str(spec.processes), f"{spec.records:,}",
                " / ".join(f"{a:.2f}" for a in amps), f"{median(amps):.2f}",
                f"{median([r.stats.get('replayed', 0) for r in runs]):,.0f}",
                f"{median([r.stats.get('rewinds', 0) for r in runs]):,.0f}",
            ]
        )  # fmt: skip
    header = [
        "replay window", "consumers (joining every 0.25 s)", "records in topic",
        "decoded / processed, runs", "median", "replayed from memory", "partition rewinds",
    ]  # fmt: skip
    return markdown_table(header, rows)


def amp_table(specs: list[RunSpec], results: dict[int, list[RunResult]]) -> str:
    rows = []
    for i, spec in enumerate(specs):
        amps = [
            r.stats["fetched"] / r.stats["processed"]
            for r in results[i]
            if r.stats.get("processed")
        ]
        rows.append(
            [
                str(spec.processes), f"{spec.records:,}",
                f"{median([r.stats.get('fetched', 0) for r in results[i]]):,.0f}",
                f"{median([r.stats.get('processed', 0) for r in results[i]]):,.0f}",
                f"{median(amps):.2f}", f"{median([r.rate for r in results[i]]):,.0f}",
            ]
        )  # fmt: skip
    header = [
        "consumers", "records in topic", "decoded (sum over consumers)", "processed",
        "decoded / processed", "rec/s (whole topic)",
    ]  # fmt: skip
    return markdown_table(header, rows)


def amp_plot(specs: list[RunSpec], results: dict[int, list[RunResult]], path: Path) -> None:
    plt = _pyplot()
    if plt is None:
        return
    xs = [s.processes for s in specs]
    amps = [
        median(
            [
                r.stats["fetched"] / r.stats["processed"]
                for r in results[i]
                if r.stats.get("processed")
            ]
        )
        for i in range(len(specs))
    ]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(xs, amps, marker="o", label="measured")
    ax.plot(xs, xs, linestyle=":", label="= consumers")
    ax.set_xlabel("keyshard consumers on one partition")
    ax.set_ylabel("records decoded per record processed")
    ax.set_xticks(xs)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- driver -------------------------------------------------------------------------------


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'keyshard[bench]')")
        return None
    return plt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("part", choices=["slow", "cpu", "filter", "amplification", "churn", "all"])
    parser.add_argument("--quick", action="store_true", help="fewer records, one run each")
    parser.add_argument("--runs", type=int, help="runs per configuration (default 3, quick 1)")
    parser.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    parser.add_argument("--tag", default="", help="appended to the output files' names")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    if args.runs:
        size = replace(size, runs=args.runs)
    every = ["slow", "cpu", "filter", "amplification", "churn"]
    parts = every if args.part == "all" else [args.part]
    command = "bash scripts/bench.sh " + " ".join(sys.argv[1:] if argv is None else argv)
    header = f"Machine: {machine()}.\nBroker: {args.broker}.\nCommand: `{command}`; {size}.\n"
    print(header)
    work = workdir()
    try:
        with Cluster(work, args.broker) as cluster:
            t0 = time.monotonic()
            topics = {
                "slow": ["io"], "cpu": ["cpu"], "filter": ["noop"], "amplification": [],
                "churn": ["churn"],
            }  # fmt: skip
            for part in parts:
                for prefix in topics[part]:
                    for partitions in (1, 4) if part in ("slow", "cpu") else (1,):
                        n = {"churn": size.records // 2, "noop": size.filter_records}.get(
                            prefix, size.records
                        )
                        took = load_topic(
                            cluster.bootstrap, f"{prefix}-p{partitions}", partitions, n, KEYS
                        )
                        print(f"loaded {prefix}-p{partitions}: {n:,} records in {took:.1f} s")
            for part in parts:
                # Tansu's tables keep their names; Kafka's and tagged ones get their own.
                stem = f"throughput-{part}" + "".join(
                    f"-{x}" for x in (args.broker if args.broker != "tansu" else "", args.tag) if x
                )
                md = _run_part(part, cluster, size, header, stem)
                (RESULTS / f"{stem}.md").write_text(md)
                print(md)
            print(f"total {time.monotonic() - t0:.0f} s")
    finally:
        cleanup(work)
    return 0


def _run_part(part: str, cluster: Cluster, size: Size, header: str, stem: str) -> str:
    print(f"== {part}")
    if part == "slow":
        specs, results = scale_out(cluster, size, "io", (1, 4), 0, print)
        table = scale_table(specs, results)
        scale_plot(specs, results, "5 ms async I/O handler", RESULTS / f"{stem}.png")
    elif part == "cpu":
        loops = calibrate_cpu_loops()
        print(f"cpu handler: {loops} loop iterations ~ 1 ms here")
        specs, results = scale_out(cluster, size, "cpu", (1, 2, 4), loops, print)
        table = scale_table(specs, results) + f"\n\nCPU handler: {loops} loop iterations (~1 ms).\n"
        scale_plot(specs, results, "~1 ms CPU handler", RESULTS / f"{stem}.png")
    elif part == "filter":
        specs, results = filter_overhead(cluster, size, print)
        table = filter_table(specs, results)
        filter_plot(specs, results, RESULTS / f"{stem}.png")
    elif part == "churn":
        specs, results = churn(cluster, size, print)
        table = churn_table(specs, results)
    else:
        specs, results = amplification(cluster, size, print)
        table = amp_table(specs, results)
        amp_plot(specs, results, RESULTS / f"{stem}.png")
    save_json(RESULTS / f"{stem}.json", [r for rs in results.values() for r in rs])
    return f"{header}\n{table}\n"


if __name__ == "__main__":
    sys.exit(main())
