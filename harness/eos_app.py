"""A read-process-write app for the exactly-once tests and benchmark: one output per input.

Input records carry `key` and the value `"<key>:<seq>"`; the handler waits `--handler-ms`,
burns `--cpu-ms` of CPU and writes to the output topic, under the same key, the JSON
`{"k": key, "seq": seq, "p": partition, "o": offset}`. Run as
`python -m harness.eos_app ...`; SIGTERM closes gracefully, SIGKILL is the crash.
`--at-least-once` runs the same handler without transactions (a plain producer's send,
awaited until Kafka has it), for the benchmark's comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import signal
import time
from typing import Any

from aiokafka import AIOKafkaProducer

from keyshard.consumer_client import CoordinatedConsumer, Outputs


def output_of(record: Any) -> tuple[bytes, bytes]:
    key, seq = record.value.decode().rsplit(":", 1)
    value = {
        "k": key, "seq": int(seq), "p": record.partition, "o": record.offset,
        "t": record.timestamp,  # when the input was produced (ms): for latency
    }  # fmt: skip
    return record.key, json.dumps(value).encode()


def burn(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


async def main(args: argparse.Namespace) -> None:
    consumer = CoordinatedConsumer(
        group=args.group,
        topics=[args.input],
        coordinator=args.coordinator,
        bootstrap_servers=args.bootstrap,
        name=args.name,
        max_concurrency=args.max_concurrency,
        session_timeout_ms=args.session_timeout_ms,
        transactional_id_prefix=None if args.at_least_once else args.prefix,
        transaction_interval_ms=args.interval_ms,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(consumer.close()))
    loop.add_signal_handler(signal.SIGUSR2, _dump_tasks)
    delay = args.handler_ms / 1000

    async def work(record: Any) -> tuple[bytes, bytes]:
        if delay:
            await asyncio.sleep(delay)
        if args.cpu_ms:
            burn(args.cpu_ms)
        return output_of(record)

    if args.at_least_once:
        producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=5)
        await producer.start()

        async def plain(record: Any) -> None:
            key, value = await work(record)
            # Acknowledged only once Kafka has the output: at least once, never lost.
            await producer.send_and_wait(args.output, value, key=key)

        try:
            await consumer.run(plain)
        finally:
            await producer.stop()
        return

    async def transactional(record: Any, outputs: Outputs) -> None:
        key, value = await work(record)
        outputs.send(args.output, value, key=key)

    await consumer.run_exactly_once(transactional)


def _dump_tasks() -> None:
    """SIGUSR2: every asyncio task's stack on stderr (a stuck app, seen from a test)."""
    for task in asyncio.all_tasks():
        task.print_stack(limit=8)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--group", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--coordinator", required=True)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--prefix", default="eos-app")
    p.add_argument("--interval-ms", type=int, default=100)
    p.add_argument("--handler-ms", type=float, default=2.0)
    p.add_argument("--cpu-ms", type=float, default=0.0)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--at-least-once", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a stuck app's stacks, for a test's log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(parse()))
