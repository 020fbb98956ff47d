"""The Kafka groups the handoff benchmark (bench.handoff_pause) sets against keyshard.

- `plain`: an aiokafka `subscribe()` group (classic protocol, eager rebalance), records
  one at a time per process, on a 6-partition topic;
- `kip848`: a KIP-848 consumer group (confluent-kafka, `group.protocol=consumer`: the
  broker assigns partitions incrementally), records one at a time, on a 6-partition topic;
- `share`: a KIP-932 share group (confluent_kafka.ShareConsumer, implicit acks), each
  poll's records with up to 64 handlers at once, on a 1-partition topic like keyshard's.

Each member is a worker process (this module run as `python -m bench._handoff_groups`
from the repository root, in the group's client virtualenv: it imports only the
standard library and `bench._worker`, which does too, at the top) that logs one JSON line per
handled record, {"p", "o", "t0"} (CLOCK_MONOTONIC ns at the handler's start), and
"started" / "leaving" events. `analyse_group` turns a group's logs into the same
measures for every group: per join/leave the largest extra record delay and the time
until every partition processed a record produced after the event; and the records
handled more than once (a share group redelivers what a leaving member held).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._worker import set_share_group_earliest


@dataclass(frozen=True)
class PeerGroup:
    name: str  # plain | kip848 | share
    topic: str
    partitions: int
    label: str


PEER_GROUPS = {
    "plain": PeerGroup("plain", "plain.events", 6, "aiokafka group"),
    "kip848": PeerGroup("kip848", "kip848.events", 6, "KIP-848 group"),
    "share": PeerGroup("share", "share.events", 1, "share group"),
}


def worker_command(group: PeerGroup, bootstrap: str, out: Path, handler_ms: float) -> list[str]:
    """One member's command line, to run from the repository root (the driver's side)."""
    # Imported here: bench._common needs what the peers' virtualenvs lack (aiokafka, ...).
    from bench._common import peer_python

    return [
        str(peer_python(group.name)), "-m", "bench._handoff_groups", "--group", group.name,
        "--bootstrap", bootstrap, "--out", str(out), "--handler-ms", str(handler_ms),
    ]  # fmt: skip


# ---- the members (worker mode) --------------------------------------------------------


async def _member(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    group = PEER_GROUPS[args.group]
    delay = args.handler_ms / 1000
    with open(args.out, "a", buffering=1) as out:  # noqa: ASYNC230 - line-buffered log

        def event(name: str) -> None:
            out.write(json.dumps({"event": name, "t": time.monotonic_ns()}) + "\n")

        async def handle(partition: int, offset: int) -> None:
            t0 = time.monotonic_ns()
            await asyncio.sleep(delay)
            out.write(json.dumps({"p": partition, "o": offset, "t0": t0}) + "\n")

        runner = {"plain": _plain, "kip848": _kip848, "share": _share}[group.name]
        await runner(args, group, handle, event, stop)


async def _plain(args: Any, group: PeerGroup, handle: Any, event: Any, stop: Any) -> None:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        group.topic,
        bootstrap_servers=args.bootstrap,
        group_id=group.name,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=200,
    )
    await consumer.start()
    event("started")
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    await handle(r.partition, r.offset)
    finally:
        event("leaving")
        await consumer.stop()


async def _kip848(args: Any, group: PeerGroup, handle: Any, event: Any, stop: Any) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": group.name,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "auto.commit.interval.ms": 200,
        }
    )
    consumer.subscribe([group.topic])
    event("started")
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            msg = consumer.poll(0)
            if msg is None:
                msg = await loop.run_in_executor(None, consumer.poll, 0.1)
            if msg is not None and not msg.error():
                await handle(msg.partition(), msg.offset())
    finally:
        event("leaving")
        await loop.run_in_executor(None, consumer.close)


async def _share(args: Any, group: PeerGroup, handle: Any, event: Any, stop: Any) -> None:
    from confluent_kafka import ShareConsumer

    set_share_group_earliest(args.bootstrap, group.name)
    consumer = ShareConsumer({"bootstrap.servers": args.bootstrap, "group.id": group.name})
    consumer.subscribe([group.topic])
    event("started")
    loop = asyncio.get_running_loop()
    limit = asyncio.Semaphore(64)

    async def one(msg: Any) -> None:
        async with limit:
            await handle(msg.partition(), msg.offset())

    try:
        while not stop.is_set():
            batch = await loop.run_in_executor(None, consumer.poll, 0.1)
            await asyncio.gather(*(one(m) for m in batch if not m.error()))
    finally:
        event("leaving")
        await loop.run_in_executor(None, consumer.close)


# ---- analysis (driver side) -------------------------------------------------------------


def started_at(path: Path) -> int | None:
    """When the member in `path`'s log said "started" (ns), if it has."""
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if '"started"' in line:
            return int(json.loads(line)["t"])
    return None


def analyse_group(
    group: PeerGroup,
    sent: dict[tuple[str, int, int], int],
    rows: list[dict[str, Any]],
    events: list[tuple[str, int]],
) -> dict[str, Any]:
    """Per join/leave event: (kind, largest extra delay ms, every partition back ms)."""
    first: dict[tuple[int, int], int] = {}
    handled = 0
    for row in rows:
        if "p" in row:
            handled += 1
            key = (row["p"], row["o"])
            first[key] = min(first.get(key, row["t0"]), row["t0"])
    delays = [
        (sent[(group.topic, p, o)], t0 - sent[(group.topic, p, o)], p)
        for (p, o), t0 in first.items()
        if (group.topic, p, o) in sent
    ]
    ordered = sorted(d for _, d, _ in delays)
    base = ordered[len(ordered) // 2] if ordered else 0
    out = []
    for i, (kind, at) in enumerate(events):
        # Up to the next event, so one long stall is not counted for several events.
        until = events[i + 1][1] if i + 1 < len(events) else at + 30_000_000_000
        around = [d for t, d, _ in delays if at - 1_000_000_000 <= t < until]
        resumed = []
        for p in range(group.partitions):
            after = [t + d for t, d, q in delays if q == p and t >= at]
            if after:
                resumed.append(min(after) - at)
        extra = max((d - base for d in around), default=0)
        out.append((kind, extra / 1e6, max(resumed, default=0) / 1e6))
    return {
        "events": out,
        "base_ms": base / 1e6,
        "records": len(delays),
        "redelivered": handled - len(first),
        "missing": sum(1 for (topic, _, _) in sent if topic == group.topic) - len(delays),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="one member of a handoff-benchmark group")
    parser.add_argument("--group", required=True, choices=sorted(PEER_GROUPS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--handler-ms", type=float, default=3.0)
    asyncio.run(_member(parser.parse_args()))


if __name__ == "__main__":
    main()
