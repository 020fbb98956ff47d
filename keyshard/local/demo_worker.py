"""A consumer process for the demo and the integration tests:
`python -m keyshard.local.demo_worker --group G --topics T ...` (not a `keyshard` command:
users run their own handlers with `keyshard worker`).

It logs every handler run (key, offset, slot, member, start/end on the system-wide
monotonic clock) to a JSON-lines file, which `keyshard.local.verify` checks against
what was produced. SIGTERM closes gracefully (drain + Leave: the library's own signal
handling); SIGKILL is the crash case, and so is SIGTERM with `--no-signals` (the
library's handling off, as for an application that handles signals itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from keyshard.consumer_client import CoordinatedConsumer, RetryPolicy
from keyshard.core.kafka.settings import load_properties
from keyshard.core.model.hashing import slot_for_record


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m keyshard.local.demo_worker",
        description="A consumer that records every handler run, for the demo and the tests.",
    )
    parser.add_argument("--group", required=True, help="consumer group")
    subscription = parser.add_mutually_exclusive_group(required=True)
    subscription.add_argument("--topics", help="comma-separated topics")
    subscription.add_argument("--topic-pattern", help="every topic whose name matches (regex)")
    parser.add_argument("--coordinator", required=True, help="coordinator HOST:PORT[,...]")
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka HOST:PORT[,...]")
    parser.add_argument("--kafka-config", help="Kafka client settings (.properties)")
    parser.add_argument("--name", required=True, help="consumer name")
    parser.add_argument("--out", required=True, help="JSON-lines file of handler runs")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ...")
    parser.add_argument("--max-concurrency", type=int, default=64, help="keys in flight")
    parser.add_argument("--session-timeout-ms", type=int, default=6000, help="session")
    parser.add_argument("--handler-ms", type=float, default=2.0, help="awaited per record")
    parser.add_argument(
        "--no-wait-every",
        type=int,
        default=0,
        help="records whose offset is a multiple of this finish without awaiting (0: "
        "none do), so the consumer's inline path and its hand-over to a lane both run",
    )
    parser.add_argument("--stuck-key", help="this key's first record hangs until cancelled")
    parser.add_argument("--fail-key", help="this key's records always fail")
    parser.add_argument("--dead-letter-topic", help="where failed records go")
    parser.add_argument(
        "--no-signals",
        action="store_true",
        help="SIGTERM as a crash: the library's signal handling off (bench/sigterm_handoff.py)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    consumer = CoordinatedConsumer(
        group=args.group,
        topics=args.topics.split(",") if args.topics else None,
        topic_pattern=args.topic_pattern,
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
                    "t": record.topic,
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


if __name__ == "__main__":
    sys.exit(main())
