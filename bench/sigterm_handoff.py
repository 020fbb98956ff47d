"""SIGTERM to a consumer under load: the handoff pause and the duplicates, before and after
the consumer handled signals itself (issue 14), in the same run.

    python bench/sigterm_handoff.py            # 3 consumers, 1,000 records/s, 20 ms handler
    python bench/sigterm_handoff.py --quick

One Tansu broker and one coordinator; two groups on two 1-partition topics, one after the
other, each with 3 real consumer processes (`keyshard demo-worker`, 64 lanes) under a
steady keyed producer. Then `kill -TERM` of one of them:
- *before*: the workers run with `--no-signals` (`handle_signals=False`): SIGTERM ends the
  process as Python's default does, which to the group is a crash;
- *after*: the library's default: the first SIGTERM drains and Leaves with exact positions.

Measured per group: the *pause*, from the SIGTERM until every range of the stopped consumer
runs on another one (the coordinator's `resumed_at` of its handoffs; CLOCK_MONOTONIC is
shared by every process of the machine), and the *duplicates*, records processed more
than once once everything produced was processed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench import RESULTS
from bench._common import machine
from bench._coord_common import ROOT, Coordinator, markdown_table, settled
from keyshard.local.broker import EmbeddedBroker
from keyshard.local.demo import worker_command
from keyshard.local.processes import stop_process
from keyshard.local.verify import read_processed

SESSION_MS = 6000  # the demo worker's default session timeout


async def wait_until(probe: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(probe):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def produce(bootstrap: str, topic: str, rate: float, seconds: float, keys: int) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    await producer.start()
    try:
        began, sent, futures = time.monotonic(), 0, []
        while time.monotonic() - began < seconds:
            futures.append(await producer.send(topic, key=f"key-{sent % keys}".encode(),
                                               value=str(sent).encode()))  # fmt: skip
            sent += 1
            if sent % 20 == 0:
                await asyncio.sleep(max(0.0, began + sent / rate - time.monotonic()))
        await asyncio.gather(*futures)
        return sent
    finally:
        await producer.stop()


def spawn(
    name: str, topic: str, group: str, graceful: bool, broker: str, coord: Coordinator,
    out: Path, args: argparse.Namespace,
) -> subprocess.Popen[bytes]:  # fmt: skip
    cmd = worker_command(
        name=name, coordinator=coord.address, bootstrap=broker, out=out / f"{name}.jsonl",
        topic=topic, group=group,
        extra=["--handler-ms", str(args.handler_ms), "--session-timeout-ms", str(SESSION_MS),
               *([] if graceful else ["--no-signals"])],
    )  # fmt: skip
    with open(out / f"{name}.err", "wb") as err:
        return subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, cwd=ROOT)


async def one_case(
    case: str, graceful: bool, broker: str, coord: Coordinator, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    topic, group = f"sigterm.{case}", f"sigterm-{case}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    await admin.close()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    files = []
    try:
        for i in range(3):
            files.append(out / f"{case}-c{i}.jsonl")
            procs[f"{case}-c{i}"] = spawn(
                f"{case}-c{i}", topic, group, graceful, broker, coord, out, args
            )
        await wait_until(lambda: settled(coord.group(group), 3), 60, f"{case}: 3 members")
        producing = asyncio.ensure_future(
            produce(broker, topic, args.rate, args.seconds, args.keys)
        )
        await asyncio.sleep(args.seconds / 3)  # steady state, records in flight everywhere
        view: Any = coord.group(group)
        assert view is not None
        victim = next(m for m in view["members"] if m["name"] == f"{case}-c0")
        termed = time.monotonic()
        procs[f"{case}-c0"].send_signal(signal.SIGTERM)
        await wait_until(lambda: settled(coord.group(group), 2), 60, f"{case}: 2 members")
        produced = await producing
        await wait_until(
            lambda: len({(e.partition, e.offset) for e in read_processed(files)}) >= produced,
            120, f"{case}: every record processed",
        )  # fmt: skip
        view = coord.group(group)
        assert view is not None
        moved = [
            h for h in view["handoffs"]
            if h["from_member"] == victim["member_id"] and h["started_at"] >= termed
        ]  # fmt: skip
        events = read_processed(files)
        return {
            "case": case,
            "handle_signals": graceful,
            "pause_s": round(max(h["resumed_at"] for h in moved) - termed, 3),
            "handoff_kinds": sorted({h["kind"] for h in moved}),
            "produced": produced,
            "duplicates": len(events) - len({(e.partition, e.offset) for e in events}),
            "exit_code": procs[f"{case}-c0"].wait(30),
        }
    finally:
        for proc in procs.values():
            stop_process(proc)


async def run_bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before the run
    for old in [*out.glob("*.jsonl"), *out.glob("*.err")]:  # noqa: ASYNC240
        old.unlink()
    broker = EmbeddedBroker()
    broker.start()
    coord = Coordinator(broker.bootstrap_servers, out / "coordinator.log")
    try:
        coord.start()
        return [
            await one_case("before", False, broker.bootstrap_servers, coord, out, args),
            await one_case("after", True, broker.bootstrap_servers, coord, out, args),
        ]
    finally:
        coord.stop()
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=12.0, help="of production per case")
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--handler-ms", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="6 s of production per case")
    parser.add_argument("--out-dir", default="/tmp/keyshard-bench-sigterm")
    parser.add_argument("--json", default=str(RESULTS / "sigterm_handoff.json"))
    args = parser.parse_args()
    if args.quick:
        args.seconds = 6.0
    rows = asyncio.run(run_bench(args))
    Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    print(machine())
    print(markdown_table(
        ["SIGTERM to 1 of 3 consumers", "pause (s)", "handoff", "duplicates", "exit"],
        [[("before: handle_signals=False" if not r["handle_signals"] else "after: default"),
          f"{r['pause_s']:.3f}", "/".join(r["handoff_kinds"]), r["duplicates"], r["exit_code"]]
         for r in rows],
    ))  # fmt: skip


if __name__ == "__main__":
    main()
