"""A deterministic clickstream for the sessionization pipeline (`spark_jobs.pipeline`).

Records are keyed by user id; the value is a JSON object `{"ts": epoch ms, "page", "action"}`.
The same `--seed` always gives the same records in the same order, so a test can produce
them and compute the expected sessions from `clickstream.events(...)` in-process.

Shape: users act in bursts (gaps of seconds to minutes) separated now and then by long
pauses (more than the pipeline's 30 min session gap), and a few events arrive a little
late (their `ts` is up to 30 s before the user's previous event: event time, not arrival
order, decides the sessions). `--bad N` mixes N malformed records in (not JSON, a JSON
array, a missing or non-integer `ts`, a missing key), which the pipeline must skip.

    python -m keyshard.spark_jobs.clickstream --bootstrap-servers kafka:9092 --topic clicks \\
        --users 200 --events 20000 --seed 7 --partitions 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from keyshard.core.kafka.settings import KafkaSettings, load_properties

START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
PAGES = ["/", "/search", "/cart", "/checkout", "/account", *(f"/product/{n}" for n in range(40))]
ACTIONS = ["view"] * 12 + ["click"] * 5 + ["add_to_cart"] * 2 + ["purchase"]
BAD_VALUES = [
    b"{not json",
    b'[{"ts": 1, "page": "/", "action": "view"}]',
    b'{"page": "/", "action": "view"}',
    b'{"ts": "yesterday", "page": "/", "action": "view"}',
    b'{"ts": 1.5, "page": "/", "action": "view"}',
    b'{"ts": 1, "page": 7, "action": "view"}',
    b"",
]


@dataclass(frozen=True, slots=True)
class ClickRecord:
    """One record as produced: the key is the user id (None for a bad keyless record)."""

    key: bytes | None
    value: bytes


def user_id(n: int) -> str:
    return f"user-{n:05d}"


def _gap_ms(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.80:
        return rng.randint(1_000, 120_000)  # within a burst
    if roll < 0.95:
        return rng.randint(120_000, 20 * 60_000)  # a pause, same session
    return rng.randint(31 * 60_000, 6 * 3_600_000)  # gone: a new session


def events(users: int, count: int, seed: int, bad: int = 0) -> list[ClickRecord]:
    """`count` good events over `users` users plus `bad` malformed ones, deterministically."""
    if users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    if count < 0 or bad < 0:
        raise ValueError(f"events and bad must be >= 0, got {count} and {bad}")
    rng = random.Random(seed)
    clocks = [START_MS + rng.randint(0, 3_600_000) for _ in range(users)]
    out: list[ClickRecord] = []
    for _ in range(count):
        u = rng.randrange(users)
        clocks[u] += _gap_ms(rng)
        ts = clocks[u] - rng.randint(1, 30_000) if rng.random() < 0.03 else clocks[u]
        value = {"ts": ts, "page": rng.choice(PAGES), "action": rng.choice(ACTIONS)}
        out.append(ClickRecord(user_id(u).encode(), json.dumps(value).encode()))
    for i in range(bad):
        at = rng.randint(0, len(out))
        if i % (len(BAD_VALUES) + 1) == len(BAD_VALUES):
            record = ClickRecord(None, b'{"ts": 1, "page": "/", "action": "view"}')
        else:
            record = ClickRecord(
                user_id(rng.randrange(users)).encode(), BAD_VALUES[i % (len(BAD_VALUES) + 1)]
            )
        out.insert(at, record)
    return out


async def produce(
    bootstrap_servers: str,
    topic: str,
    records: list[ClickRecord],
    kafka_config: Mapping[str, str] | None = None,
) -> int:
    """Send `records` in order (keyed: a user's records land in one partition, in order)."""
    from aiokafka import AIOKafkaProducer

    options = KafkaSettings.parse(kafka_config).client_options()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=5, **options)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=r.key, value=r.value) for r in records]
        for future in futures:
            await future
    finally:
        await producer.stop()
    return len(records)


async def ensure_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    kafka_config: Mapping[str, str] | None = None,
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    options = KafkaSettings.parse(kafka_config).admin_options()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **options)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="keyshard.spark_jobs.clickstream", description="Produce a deterministic clickstream."
    )
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--users", type=int, default=100)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bad", type=int, default=0, help="malformed records to mix in")
    p.add_argument(
        "--partitions", type=int, default=None, help="create the topic with this many partitions"
    )
    p.add_argument("--kafka-config", default=None, help="Kafka client settings (.properties)")
    return p


async def _main(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaConnectionError

    records = events(args.users, args.events, args.seed, args.bad)
    config = load_properties(args.kafka_config) if args.kafka_config else {}
    try:
        if args.partitions is not None:
            await asyncio.wait_for(
                ensure_topic(args.bootstrap_servers, args.topic, args.partitions, config), 30
            )
        sent = await produce(args.bootstrap_servers, args.topic, records, config)
    except (KafkaConnectionError, TimeoutError) as err:
        print(f"error: Kafka at {args.bootstrap_servers} is unreachable: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"topic": args.topic, "records": sent, "bad": args.bad}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        events(args.users, 0, args.seed, 0)
        if args.events < 0 or args.bad < 0:
            raise ValueError("--events and --bad must be >= 0")
    except ValueError as err:
        parser.error(str(err))
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
