"""A consumer process for the demo and the integration tests.

It logs every handler run (key, offset, slot, member, start/end on the system-wide
monotonic clock) to a JSON-lines file, which `keyshard.local.verify` checks against
what was produced. SIGTERM closes gracefully (drain + Leave: the library's own signal
handling, `consumer_client.signals`); SIGKILL is the crash case, and so is SIGTERM with
`--no-signals` (the library's handling off: what every consumer did before it had it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from keyshard.consumer_client import CoordinatedConsumer, RetryPolicy
from keyshard.core.kafka.settings import load_properties
from keyshard.core.model.hashing import slot_for_record


def run_worker(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    consumer = CoordinatedConsumer(
        group=args.group,
        topics=args.topics.split(","),
        coordinator=args.coordinator,
        bootstrap_servers=args.bootstrap_servers,
        kafka_config=load_properties(args.kafka_config) if args.kafka_config else None,
        name=args.name,
        max_concurrency=args.max_concurrency,
        session_timeout_ms=args.session_timeout_ms,
        dead_letter_topic=args.dead_letter_topic,
        retry=RetryPolicy(initial_backoff_ms=20, max_backoff_ms=200, max_attempts=3),
        handle_signals=not args.no_signals,
    )
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - closed below, line-buffered
    stuck = args.stuck_key.encode() if args.stuck_key else None
    failing = args.fail_key.encode() if args.fail_key else None
    delay = args.handler_ms / 1000
    no_wait_every = args.no_wait_every
    stuck_once = asyncio.Event()  # the stuck key hangs once per process, like a lost call

    async def handle(record: Any) -> None:
        t0 = time.monotonic_ns()
        slot, okey = slot_for_record(record.key, record.headers, record.offset)
        if okey is not None and okey == failing:
            raise RuntimeError(f"handler refuses key {okey!r}")
        if okey is not None and okey == stuck and not stuck_once.is_set():
            stuck_once.set()
            print(f"{args.name}: stuck on offset {record.offset}", file=sys.stderr, flush=True)
            await asyncio.Event().wait()  # until the session is cancelled
        if not (no_wait_every and record.offset % no_wait_every == 0):
            await asyncio.sleep(delay)
        out.write(
            json.dumps(
                {
                    "p": record.partition,
                    "o": record.offset,
                    "k": (okey or b"").decode(errors="replace"),
                    "s": slot,
                    "w": args.name,
                    "m": consumer.member_id,
                    "t0": t0,
                    "t1": time.monotonic_ns(),
                }
            )
            + "\n"
        )

    try:
        await consumer.run(handle)
    finally:
        out.close()
    return 0
