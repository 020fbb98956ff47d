"""SIGTERM to a consumer under load: the handoff pause and the duplicates, before and after
the consumer handled signals itself (issue 14), in the same run.

    python -m bench.sigterm_handoff            # 3 consumers, 1,000 records/s, 20 ms handler
    python -m bench.sigterm_handoff --quick

One Tansu broker and one coordinator; two groups on two 1-partition topics, one after the
other, each with 3 real consumer processes (`keyshard.local.demo_worker`, 64 lanes) under a
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
import time
from pathlib import Path
from typing import Any

from bench import RESULTS
from bench._common import machine
from harness import CoordinatorProcess, Workers, create_topic, markdown_table, produce, wait_for
from harness.brokers import running_broker

SESSION_MS = 6000  # the demo worker's default session timeout


async def one_case(
    case: str, graceful: bool, coord: CoordinatorProcess, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    topic, group = f"sigterm.{case}", f"sigterm-{case}"
    await create_topic(coord.bootstrap, topic)
    workers = Workers(coord, out / case, topic=topic, group=group)
    workers.out_dir.mkdir(exist_ok=True)
    victim_name = f"{case}-c0"
    options = ["--handler-ms", str(args.handler_ms), "--session-timeout-ms", str(SESSION_MS)]
    try:
        for i in range(3):
            workers.spawn(f"{case}-c{i}", *options, *([] if graceful else ["--no-signals"]))
        await wait_for(lambda: coord.settled(3, group), 60, f"{case}: 3 members")
        producing = asyncio.ensure_future(
            produce(coord.bootstrap, int(args.rate * args.seconds), args.keys, topic=topic,
                    rate=args.rate)
        )  # fmt: skip
        await asyncio.sleep(args.seconds / 3)  # steady state, records in flight everywhere
        view = await coord.group(group)
        assert view is not None
        victim = next(m for m in view["members"] if m["name"] == victim_name)
        termed = time.monotonic()
        workers.procs[victim_name].send_signal(signal.SIGTERM)
        await wait_for(lambda: coord.settled(2, group), 60, f"{case}: 2 members")
        produced = len(await producing)
        await wait_for(lambda: workers.unique() >= produced, 120, f"{case}: every record processed")
        view = await coord.group(group)
        assert view is not None
        moved = [
            h for h in view["handoffs"]
            if h["from_member"] == victim["member_id"] and h["started_at"] >= termed
        ]  # fmt: skip
        events = workers.processed()
        return {
            "case": case,
            "handle_signals": graceful,
            "pause_s": round(max(h["resumed_at"] for h in moved) - termed, 3),
            "handoff_kinds": sorted({h["kind"] for h in moved}),
            "produced": produced,
            "duplicates": len(events) - workers.unique(),
            "exit_code": workers.procs[victim_name].wait(30),
        }
    finally:
        workers.stop_all()


async def run_bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before the run
    for old in [*out.glob("*/*.jsonl"), *out.glob("*/*.err")]:  # noqa: ASYNC240
        old.unlink()
    with running_broker("tansu") as broker:
        coord = CoordinatorProcess(broker.bootstrap_servers, out)
        try:
            await coord.start()
            return [
                await one_case("before", False, coord, out, args),
                await one_case("after", True, coord, out, args),
            ]
        finally:
            coord.stop()


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
