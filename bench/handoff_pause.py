"""Handoff pause under load: keyshard's ordered handoff vs. Kafka group rebalances.

    bash scripts/bench.sh handoff [--quick] [--broker tansu|kafka]

One real broker (Tansu, or Apache Kafka with `--broker kafka`), one steady keyed producer
writing the same records to one topic per group, and in the same run:
- keyshard: a real coordinator process and 3 real consumer processes
  (`keyshard.local.demo_worker`, a few ms of async I/O per record, 64 lanes) on a 1-partition
  topic;
- a plain aiokafka `subscribe()` group: 3 processes with the same handler (records
  processed one at a time per process, as a plain consumer loop does) on a 6-partition
  topic;
- on Kafka also a KIP-848 group (6 partitions) and a share group (1 partition), 3
  processes each (bench._handoff_groups).
Then, several times: a 4th consumer joins every group, they settle, the 4th leaves every
group (SIGTERM: graceful close) and they settle.

Every record's processing start is compared with when it was produced. Its *extra delay*
is that delay minus the median delay of the run (the normal fetch/queue latency), so a
range or partition that pauses shows up as records waiting longer than usual.
- keyshard, per handoff the coordinator recorded (GET /v1/groups/demo/handoffs): the
  coordinator's own pause (StopFetcher sent -> range running on its new owner, which
  includes waiting for in-flight records of the range), and the largest extra delay of
  records of the *moved* slots produced between [start - 1 s, resume]; and for all
  records of slots that did *not* move, produced during any handoff, the largest extra
  delay;
- every other group, per join/leave: the largest extra delay of any record produced from
  1 s before the event until the next event (an eager rebalance stops every partition),
  and the time from the event until every partition processed a record produced after it;
  and the records handled more than once (redelivered).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench import RESULTS
from bench._common import ROOT, machine
from bench._handoff_groups import PEER_GROUPS, analyse_group, started_at
from bench._handoff_groups import worker_command as peer_command
from harness import (
    TOPIC,
    CoordinatorProcess,
    Workers,
    create_topic,
    markdown_table,
    median,
    percentile,
    wait_for,
)
from harness.brokers import BROKER_KINDS, running_broker
from keyshard.core.model.ranges import RangeSet
from keyshard.local.processes import stop_process
from keyshard.local.verify import read_processed

# ---- driver ----------------------------------------------------------------------


class Producer:
    """Writes record i with key `key-{i % keys}` to both topics at a steady rate and
    remembers when each was sent (CLOCK_MONOTONIC ns, like the handlers' logs)."""

    def __init__(self, bootstrap: str, rate: float, keys: int, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.rate = rate
        self.keys = keys
        self.sent: dict[tuple[str, int, int], int] = {}
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=1)
        await producer.start()
        pending: list[tuple[int, str, asyncio.Future[Any]]] = []
        try:
            began = time.monotonic()
            i = 0
            while not self.stopping.is_set():
                key = f"key-{i % self.keys}".encode()
                now = time.monotonic_ns()
                for topic in self.topics:
                    fut = await producer.send(topic, key=key, value=str(i).encode())
                    pending.append((now, topic, fut))
                i += 1
                if i % 10 == 0:
                    await asyncio.sleep(max(0.0, began + i / self.rate - time.monotonic()))
                if len(pending) > 2000:
                    await self._collect(pending)
            await self._collect(pending)
        finally:
            await producer.stop()

    async def _collect(self, pending: list[tuple[int, str, asyncio.Future[Any]]]) -> None:
        for t, topic, fut in pending:
            meta = await fut
            self.sent[(topic, meta.partition, meta.offset)] = t
        pending.clear()


@dataclass
class KeyshardHandoff:
    kind: str
    slots: int
    coordinator_pause_ms: float
    drain_ms: float  # StopFetcher sent -> final positions back (the in-flight records)
    moved_extra_ms: float  # largest extra delay of a record of the moved slots
    records: int


def read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        for line in p.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before the run
    for old in [*out.glob("*.jsonl"), *out.glob("*.err")]:  # noqa: ASYNC240
        old.unlink()
    with running_broker(args.broker) as broker:
        return await run_on(broker.bootstrap_servers, args, out)


async def run_on(bootstrap: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    groups = [PEER_GROUPS[name] for name in args.groups.split(",")]
    coord = CoordinatorProcess(bootstrap, out, extra=["--drain-timeout-ms", "5000"])
    keyshard = Workers(coord, out)
    peers: dict[str, subprocess.Popen[bytes]] = {}
    # (join|leave, monotonic ns) per group: a join when the joiner said "started"
    events: dict[str, list[tuple[str, int]]] = {g.name: [] for g in groups}

    def spawn(name: str) -> None:
        """A keyshard consumer and a member of every other group, each called `name`."""
        keyshard.spawn(name, "--handler-ms", str(args.handler_ms))
        for g in groups:
            cmd = peer_command(g, bootstrap, out / f"{g.name}-{name}.jsonl", args.handler_ms)
            with open(out / f"{g.name}-{name}.err", "wb") as err:
                peers[f"{g.name}-{name}"] = subprocess.Popen(
                    cmd, stdout=err, stderr=subprocess.STDOUT, cwd=ROOT
                )

    def peers_started(name: str) -> bool:
        return all(started_at(out / f"{g.name}-{name}.jsonl") for g in groups)

    def settled(members: int) -> Callable[[], Awaitable[dict[str, Any] | None]]:
        # Every 0.1 s: the admin API is asked while the handoffs being measured run.
        return lambda: coord.settled(members)

    topics = [TOPIC, *(g.topic for g in groups)]
    producer = Producer(bootstrap, args.rate, args.keys, topics)
    producing: asyncio.Task[None] | None = None
    try:
        for topic, partitions in [(TOPIC, 1), *((g.topic, g.partitions) for g in groups)]:
            await create_topic(bootstrap, topic, partitions)
        await coord.start()
        for i in range(3):
            spawn(f"c{i}")
        await wait_for(settled(3), 60, "3 keyshard members", interval=0.1)
        await wait_for(lambda: all(peers_started(f"c{i}") for i in range(3)), 60, "groups")
        producing = asyncio.ensure_future(producer.run())
        await asyncio.sleep(args.settle)  # both groups consuming at a steady state
        for cycle in range(args.cycles):
            name = f"j{cycle}"
            spawn(name)
            await wait_for(settled(4), 60, "4th keyshard member", interval=0.1)
            await wait_for(functools.partial(peers_started, name), 60, "4th members")
            for g in groups:
                events[g.name].append(("join", started_at(out / f"{g.name}-{name}.jsonl") or 0))
            await asyncio.sleep(args.settle)
            for g in groups:
                events[g.name].append(("leave", time.monotonic_ns()))
            # In threads: the producer shares this loop and must not stall.
            await asyncio.gather(
                asyncio.to_thread(keyshard.stop, name),
                *(asyncio.to_thread(stop_process, peers[f"{g.name}-{name}"]) for g in groups),
            )
            await wait_for(settled(3), 60, "3 keyshard members", interval=0.1)
            await asyncio.sleep(args.settle)
        producer.stopping.set()
        await producing
        await asyncio.sleep(3)  # let both groups drain what was produced last
        view = await coord.group()
        assert view is not None
        result = analyse(
            producer.sent,
            read_processed([*out.glob("c*.jsonl"), *out.glob("j*.jsonl")]),  # noqa: ASYNC240
            view["handoffs"],
        )
        result["groups"] = {
            g.name: analyse_group(
                g,
                producer.sent,
                read_jsonl(out.glob(f"{g.name}-*.jsonl")),  # noqa: ASYNC240
                events[g.name],
            )
            for g in groups
        }
        return result
    finally:
        if producing is not None and not producing.done():
            producer.stopping.set()
            producing.cancel()
        keyshard.stop_all()
        for proc in peers.values():
            stop_process(proc)
        coord.stop()


def analyse(
    sent: dict[tuple[str, int, int], int],
    keyshard: list[Any],
    handoffs: list[dict[str, Any]],
) -> dict[str, Any]:
    # First processing of each record, and its delay since it was produced (ns).
    ks_first: dict[tuple[int, int], Any] = {}
    for e in keyshard:
        if (e.partition, e.offset) not in ks_first or e.t0 < ks_first[(e.partition, e.offset)].t0:
            ks_first[(e.partition, e.offset)] = e
    ks = [
        (sent[(TOPIC, p, o)], e.t0 - sent[(TOPIC, p, o)], e.slot)
        for (p, o), e in ks_first.items()
        if (TOPIC, p, o) in sent
    ]
    ks_base = median([d for _, d, _ in ks])
    first_sent = min(sent.values())

    results: list[KeyshardHandoff] = []
    windows: list[tuple[int, int, RangeSet, str]] = []
    for h in handoffs:
        if not h["resumed_at"] or h["kind"] not in ("revoke", "leave"):
            continue
        start, end = int(h["started_at"] * 1e9), int(h["resumed_at"] * 1e9)
        if start < first_sent:
            continue  # before the load started
        moved = RangeSet.from_pairs(h["ranges"])
        windows.append((start, end, moved, h["kind"]))
        extra = [
            d - ks_base for t, d, slot in ks if start - 1_000_000_000 <= t <= end and slot in moved
        ]
        results.append(
            KeyshardHandoff(
                h["kind"], moved.size, (end - start) / 1e6,
                (h["released_after_s"] or 0.0) * 1e3,
                max(extra, default=0) / 1e6, len(extra),
            )
        )  # fmt: skip

    def unmoved_during(kinds: tuple[str, ...]) -> list[float]:
        return [
            d - ks_base
            for t, d, slot in ks
            if any(
                s - 1_000_000_000 <= t <= e and slot not in moved
                for s, e, moved, kind in windows
                if kind in kinds
            )
        ]

    unmoved = unmoved_during(("revoke", "leave"))
    # Joins start a process (imports, a Kafka client: ~1 s of CPU on a 2-core machine)
    # inside the window; leaves do not, so they show the protocol's own effect.
    unmoved_leaves = unmoved_during(("leave",))
    quiet = [
        d - ks_base for t, d, _ in ks if not any(s - 2e9 <= t <= e + 2e9 for s, e, _, _ in windows)
    ]

    return {
        "handoffs": results,
        "unmoved_extra_ms": max(unmoved, default=0) / 1e6,
        "unmoved_records": len(unmoved),
        "unmoved_p50_ms": percentile(unmoved, 50) / 1e6,
        "unmoved_p99_ms": percentile(unmoved, 99) / 1e6,
        "unmoved_leave_records": len(unmoved_leaves),
        "unmoved_leave_p50_ms": percentile(unmoved_leaves, 50) / 1e6,
        "unmoved_leave_p99_ms": percentile(unmoved_leaves, 99) / 1e6,
        "unmoved_leave_max_ms": max(unmoved_leaves, default=0) / 1e6,
        "quiet_records": len(quiet),
        "quiet_p50_ms": percentile(quiet, 50) / 1e6,
        "quiet_p99_extra_ms": percentile(quiet, 99) / 1e6,
        "quiet_max_ms": max(quiet, default=0) / 1e6,
        "ks_base_ms": ks_base / 1e6,
        "ks_records": len(ks),
    }


def groups_of(r: dict[str, Any]) -> dict[str, Any]:
    """The other groups' results; a JSON of before the KIP-848 and share groups has only
    the plain group's, under other names."""
    if "groups" in r:
        groups: dict[str, Any] = r["groups"]
        return groups
    plain = {"events": r["plain_events"], "base_ms": r["pl_base_ms"], "records": r["pl_records"]}
    return {"plain": {**plain, "redelivered": 0}}


def report(r: dict[str, Any], args: argparse.Namespace) -> str:
    hs: list[KeyshardHandoff] = r["handoffs"]
    pause = [h.coordinator_pause_ms for h in hs]
    moved = [h.moved_extra_ms for h in hs]
    groups = groups_of(r)

    def stats(values: list[float]) -> list[object]:
        return [
            len(values),
            f"{percentile(values, 50):.1f}",
            f"{percentile(values, 99):.1f}",
            f"{max(values, default=0):.1f}",
        ]

    drain = [h.drain_ms for h in hs]
    rows = [
        ["keyshard: moved ranges, coordinator pause (StopFetcher sent -> running on new owner)",
         *stats(pause)],
        ["  of which draining (StopFetcher sent -> final positions back)", *stats(drain)],
        ["keyshard: moved ranges, largest extra record delay per handoff", *stats(moved)],
        ["keyshard: ranges that did not move, extra record delay during handoffs",
         r["unmoved_records"], f"{r['unmoved_p50_ms']:.1f}", f"{r['unmoved_p99_ms']:.1f}",
         f"{r['unmoved_extra_ms']:.1f}"],
        ["  of which during leaves (no process starting)",
         r["unmoved_leave_records"], f"{r['unmoved_leave_p50_ms']:.1f}",
         f"{r['unmoved_leave_p99_ms']:.1f}", f"{r['unmoved_leave_max_ms']:.1f}"],
        ["keyshard: every record away from any handoff (> 2 s), the same measure",
         r["quiet_records"], f"{r['quiet_p50_ms']:.1f}", f"{r['quiet_p99_extra_ms']:.1f}",
         f"{r['quiet_max_ms']:.1f}"],
    ]  # fmt: skip
    for name, g in groups.items():
        label = PEER_GROUPS[name].label
        rows += [
            [f"{label}: largest extra record delay per join/leave (all partitions)",
             *stats([e[1] for e in g["events"]])],
            [f"{label}: join/leave -> every partition consuming records produced after it",
             *stats([e[2] for e in g["events"]])],
        ]  # fmt: skip
    kinds = ", ".join(f"{k}: {sum(1 for h in hs if h.kind == k)}" for k in ("revoke", "leave"))
    table = markdown_table(["measure", "samples", "p50 ms", "p99 ms", "max ms"], rows)
    lines = [
        f"{table}\n\nkeyshard handoffs by kind: {kinds}; median record delay (the baseline "
        f"subtracted): keyshard {r['ks_base_ms']:.1f} ms ({r['ks_records']} records)."
    ]
    for name, g in groups.items():
        gap = percentile([e[1] for e in g["events"]], 50)
        ratio = gap / percentile(moved, 50) if moved and percentile(moved, 50) > 0 else 0
        lines.append(
            f"{PEER_GROUPS[name].label}: median record delay {g['base_ms']:.1f} ms, "
            f"{g['records']} records, {g['redelivered']} handled more than once, "
            f"{g.get('missing', 0)} produced but never handled; p50 gap / keyshard's "
            f"moved-range gap: {ratio:.1f}x."
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Every sample on a log scale: keyshard per handoff, the aiokafka group per event."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = result["handoffs"]
    get = (lambda h, k: h[k]) if hs and isinstance(hs[0], dict) else getattr
    series = [
        ("keyshard\ncoordinator pause", [get(h, "coordinator_pause_ms") for h in hs]),
        ("keyshard\nmoved ranges:\nextra delay", [get(h, "moved_extra_ms") for h in hs]),
        ("keyshard\nunmoved ranges:\nlargest extra delay", [result["unmoved_extra_ms"]]),
    ]
    for name, g in groups_of(result).items():
        label = PEER_GROUPS[name].label
        series.append((f"{label}\nlargest extra delay", [e[1] for e in g["events"]]))
        series.append((f"{label}\nall partitions back", [e[2] for e in g["events"]]))
    fig, ax = plt.subplots(figsize=(max(9.0, 1.4 * len(series)), 4))
    for i, (_, values) in enumerate(series):
        ax.plot([i] * len(values), [max(v, 0.5) for v in values], "o", alpha=0.6)
    ax.axhline(100, ls=":", color="tab:red", label="target: p99 < 100 ms (moved ranges)")
    ax.set_xticks(range(len(series)), [name for name, _ in series], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title("join/leave under load: keyshard handoffs vs Kafka group rebalances")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 cycles, shorter settling")
    parser.add_argument("--cycles", type=int, default=4, help="join + leave cycles")
    parser.add_argument("--rate", type=float, default=300.0, help="records/s to each topic")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--handler-ms", type=float, default=3.0)
    parser.add_argument("--settle", type=float, default=4.0, help="s between steps")
    parser.add_argument("--out-dir", default="/tmp/keyshard-bench-handoff")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--plot", default=str(RESULTS / "handoff_pause.png"))
    parser.add_argument("--plot-only", default=None, help="re-plot a --json file, no run")
    parser.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    parser.add_argument(
        "--groups", help="groups beside keyshard (default: plain; on kafka plain,kip848,share)"
    )
    args = parser.parse_args()
    args.groups = args.groups or ("plain,kip848,share" if args.broker == "kafka" else "plain")
    if args.plot_only:
        plot(json.loads(Path(args.plot_only).read_text()), Path(args.plot))
        return
    if args.quick:
        args.cycles, args.settle = 2, 3.0
    print(machine(), flush=True)
    began = time.monotonic()
    result = asyncio.run(run_bench(args))
    print(
        f"command: bash scripts/bench.sh handoff {' '.join(sys.argv[1:])}  (broker {args.broker}; "
        f"{time.monotonic() - began:.0f} s; {args.cycles} join+leave cycles, "
        f"{args.rate:.0f} records/s, {args.keys} keys, handler {args.handler_ms} ms)"
    )
    print(report(result, args))
    plot(result, Path(args.plot))
    print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({**result, "handoffs": [vars(h) for h in result["handoffs"]]}, indent=1)
        )


if __name__ == "__main__":
    main()
