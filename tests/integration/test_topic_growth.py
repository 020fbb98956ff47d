"""Topics that grow under traffic, and topics by pattern, with real brokers, a real
coordinator and consumer processes: nothing lost, new partitions read within seconds,
per-key order kept across the change (judged from the handlers' own log against the
producer's send order), and every partition in the tools."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from harness import GROUP, TOPIC, CoordinatorProcess, Workers, create_topic, wait_for
from keyshard.local.verify import Processed, Produced
from tests.integration.test_kafka_tooling import describe

pytestmark = [pytest.mark.integration]

#: A producer refreshes its metadata this often here (Kafka's default is 5 minutes):
#: the growth window must cover it.
PRODUCER_METADATA_AGE_MS = 2_000
GROWTH_FLAGS = ("--metadata-refresh-ms", "1000", "--partition-growth-window-ms", "4000")
RATE = 200  # records per second
KEYS = 300


class PacedProducer:
    """Keyed records at `RATE` per second with Kafka's default partitioner (aiokafka's
    DefaultPartitioner is Java's: murmur2 of the key, modulo the partition count), in a
    background task; `sent` is the send order."""

    def __init__(self, bootstrap: str, topic: str = TOPIC) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, linger_ms=2, metadata_max_age_ms=PRODUCER_METADATA_AGE_MS
        )
        self.topic = topic
        self.sent: list[tuple[str, asyncio.Future[Any]]] = []

    async def run(self, count: int) -> list[Produced]:
        await self.producer.start()
        try:
            began = time.monotonic()
            for i in range(count):
                key = f"key-{i % KEYS}"
                future = await self.producer.send(
                    self.topic, key=key.encode(), value=str(i).encode()
                )
                self.sent.append((key, future))
                if i % 20 == 0:
                    await asyncio.sleep(max(0.0, began + i / RATE - time.monotonic()))
            out = []
            for key, future in self.sent:
                meta = await future
                out.append(Produced(meta.partition, meta.offset, key))
            return out
        finally:
            await self.producer.stop()


async def grow(bootstrap: str, topic: str, total: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total_count=total)})
    finally:
        await admin.close()


def order_violations(produced: Sequence[Produced], processed: Sequence[Processed]) -> list[str]:
    """Records that started before an earlier record of their key (in the producer's send
    order, whatever the partition) had finished; first handling of each record only. Each
    is said: the record, who ran it, and the earlier record of its key still running."""
    runs: dict[tuple[int, int], Processed] = {}
    for e in processed:
        where = (e.partition, e.offset)
        if where not in runs or e.t0 < runs[where].t0:
            runs[where] = e
    latest: dict[str, Processed] = {}
    out = []
    for record in produced:
        run = runs[(record.partition, record.offset)]
        before = latest.get(record.key)
        if before is not None and run.t0 < before.t1:
            out.append(
                f"{record.key}: {run.partition}@{run.offset} by {run.worker} started "
                f"{(before.t1 - run.t0) / 1e6:.1f} ms before {before.partition}@{before.offset} "
                f"by {before.worker} ended"
            )
        if before is None or run.t1 > before.t1:
            latest[record.key] = run
    return out


@pytest.mark.brokers("kafka")
@pytest.mark.coordinator_args(*GROWTH_FLAGS)
@pytest.mark.parametrize("grown_to", [4, 3], ids=["2to4", "2to3"])
async def test_a_topic_grown_under_traffic_is_read_at_once_in_key_order(
    coordinator: CoordinatorProcess, workers: Workers, grown_to: int
) -> None:
    await create_topic(coordinator.bootstrap, partitions=2)
    for name in ("a", "b", "c"):
        workers.spawn(name, "--handler-ms", "2", "--log-level", "INFO")
    await wait_for(lambda: coordinator.settled(3), 60, "three members settled")
    producer = PacedProducer(coordinator.bootstrap)
    before, after = 5 * RATE, 10 * RATE  # seconds of traffic before and after the growth
    producing = asyncio.create_task(producer.run(before + after))
    await wait_for(lambda: len(producer.sent) >= before, 30, "traffic before the growth")
    grown_ns = time.monotonic_ns()
    await grow(coordinator.bootstrap, TOPIC, grown_to)
    produced = await producing
    new = [r for r in produced if r.partition >= 2]
    assert new, "the producer wrote to the new partitions"
    wanted = {(r.partition, r.offset) for r in produced}

    def missing() -> set[tuple[int, int]]:
        return wanted - {(e.partition, e.offset) for e in workers.processed()}

    await wait_for(lambda: not missing(), 90, "every record processed")
    processed = workers.processed()
    first_new_s = (min(e.t0 for e in processed if e.partition >= 2) - grown_ns) / 1e9
    violations = order_violations(produced, processed)
    duplicates = len(processed) - len({(e.partition, e.offset) for e in processed})
    moved = len({r.key for r in new})
    print(
        f"\n2 -> {grown_to} partitions: {len(produced)} produced ({len(new)} to new "
        f"partitions, {moved} keys there), lost {len(missing())}, first new-partition "
        f"record {first_new_s:.2f} s after create_partitions, {len(violations)} per-key order "
        f"violations, {duplicates} duplicates"
    )
    for name in ("a", "b", "c"):
        lines = [x for x in workers.output(name, "err").splitlines() if "transition" in x]
        print(
            f"  worker {name}: "
            + " | ".join(x.split(" INFO ")[0] + " " + x.rsplit(": ", 1)[-1] for x in lines)
        )
    assert not missing()
    assert first_new_s < 10
    assert not violations, violations[:20]
    assert duplicates == 0
    assert f"grew from 2 to {grown_to} partitions" in coordinator.read_log()

    ends = {p: 1 + max(r.offset for r in produced if r.partition == p) for p in range(grown_to)}

    async def every_partition_done() -> dict[str, Any] | None:
        """The view once it lists every partition at its end with no lag (members report
        ends with their next Ping, which the coordinator checks against Kafka first)."""
        view = await coordinator.group(GROUP)
        if view is None:
            return None
        rows = [p for p in view["partitions"] if p["topic"] == TOPIC]
        done = {
            p["partition"] for p in rows if p["end_offset"] == ends[p["partition"]] and not p["lag"]
        }
        return view if done == set(range(grown_to)) == {p["partition"] for p in rows} else None

    await wait_for(
        every_partition_done, 30, "the admin API to list every partition at its end, lag 0"
    )

    def tool_rows() -> dict[int, dict[str, str]] | None:
        rows = describe(coordinator.bootstrap, GROUP)
        done = {p: r for p, r in rows.items() if r["CURRENT-OFFSET"] == str(ends.get(p))}
        return rows if set(done) == set(range(grown_to)) else None

    rows = await wait_for(lambda: asyncio.to_thread(tool_rows), 60, "kafka-consumer-groups")
    assert sorted(rows) == list(range(grown_to))


@pytest.mark.brokers("tansu", "kafka")
@pytest.mark.coordinator_args("--metadata-refresh-ms", "1000")
async def test_a_pattern_picks_up_a_new_topic_and_drops_a_deleted_one(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    bootstrap = coordinator.bootstrap
    await create_topic(bootstrap, "orders-a", partitions=2)
    await create_topic(bootstrap, "other", partitions=1)
    workers.topic_pattern = "orders-.*"
    for name in ("a", "b"):
        workers.spawn(name, "--handler-ms", "1")
    await wait_for(lambda: coordinator.settled(2), 60, "two members settled")

    async def send(topic: str, count: int, start: int) -> list[tuple[str, int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, metadata_max_age_ms=1000)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=f"key-{i % 50}".encode(), value=b"x")
                for i in range(start, start + count)
            ]
            return [(topic, m.partition, m.offset) for m in await asyncio.gather(*futures)]
        finally:
            await producer.stop()

    def done() -> set[tuple[str, int, int]]:
        return {(e.topic, e.partition, e.offset) for e in workers.processed()}

    first = await send("orders-a", 200, 0) + await send("other", 50, 0)
    await wait_for(lambda: {r for r in first if r[0] == "orders-a"} <= done(), 60, "orders-a read")
    created_ns = time.monotonic_ns()
    await create_topic(bootstrap, "orders-b", partitions=2)
    second = await send("orders-b", 200, 0)
    await wait_for(lambda: set(second) <= done(), 60, "the new topic read")
    picked_up_s = (
        min(e.t0 for e in workers.processed() if e.topic == "orders-b") - created_ns
    ) / 1e9
    assert not {r for r in done() if r[0] == "other"}, "a topic that does not match is not read"
    assert "topic orders-b (matches 'orders-.*') joins" in coordinator.read_log()

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(["orders-a"])
    finally:
        await admin.close()
    await wait_for(lambda: "topic orders-a is gone" in coordinator.read_log(), 60, "the WARNING")
    third = await send("orders-b", 200, 200)
    await wait_for(lambda: set(third) <= done(), 60, "the rest carries on")
    view = await coordinator.group(GROUP)
    assert view is not None and view["topics"] == ["orders-b"]
    assert {p["topic"] for p in view["partitions"]} == {"orders-b"}
    assert all(workers.procs[n].poll() is None for n in ("a", "b")), "both members still run"
    print(f"\npattern: new topic's first record {picked_up_s:.2f} s after it was created")


def concurrent_owners(processed: Sequence[Processed]) -> int:
    """Handler runs of a slot that overlapped a run of the same slot by another member."""
    by_slot: dict[int, list[Processed]] = defaultdict(list)
    for e in processed:
        by_slot[e.slot].append(e)
    overlaps = 0
    for runs in by_slot.values():
        latest_end: dict[str, int] = {}
        for e in sorted(runs, key=lambda r: r.t0):
            if any(m != e.member and end > e.t0 for m, end in latest_end.items()):
                overlaps += 1
            latest_end[e.member] = max(latest_end.get(e.member, -1), e.t1)
    return overlaps


@pytest.mark.brokers("kafka")
@pytest.mark.coordinator_args(*GROWTH_FLAGS)
async def test_churn_while_a_topic_grows(coordinator: CoordinatorProcess, workers: Workers) -> None:
    """A join, a graceful leave and a kill -9 around the growth: nothing lost, no two
    members ever run one slot at once, per-key order kept, and the only duplicates are
    records the killed consumer ran and never reported."""
    await create_topic(coordinator.bootstrap, partitions=2)
    session = ("--handler-ms", "2", "--session-timeout-ms", "3000")
    for name in ("a", "b", "c"):
        workers.spawn(name, *session)
    await wait_for(lambda: coordinator.settled(3), 60, "three members settled")
    producer = PacedProducer(coordinator.bootstrap)
    producing = asyncio.create_task(producer.run(15 * RATE))
    await wait_for(lambda: len(producer.sent) >= 3 * RATE, 30, "traffic")
    workers.spawn("d", *session)
    await wait_for(lambda: len(producer.sent) >= 5 * RATE, 30, "the growth's moment")
    await grow(coordinator.bootstrap, TOPIC, 4)
    await wait_for(lambda: len(producer.sent) >= 6 * RATE, 30, "the leave's moment")
    workers.stop("b")
    await wait_for(lambda: len(producer.sent) >= 8 * RATE, 30, "the kill's moment")
    workers.kill("c")
    produced = await producing
    wanted = {(r.partition, r.offset) for r in produced}

    def missing() -> set[tuple[int, int]]:
        return wanted - {(e.partition, e.offset) for e in workers.processed()}

    await wait_for(lambda: not missing(), 120, "every record processed")
    processed = workers.processed()
    runs: dict[tuple[int, int], set[str]] = defaultdict(set)
    for e in processed:
        runs[(e.partition, e.offset)].add(e.worker)
    duplicated = {k: w for k, w in runs.items() if len(w) > 1}
    violations = order_violations(produced, processed)
    overlapping = concurrent_owners(processed)
    print(
        f"\nchurn while growing 2 -> 4: {len(produced)} produced, lost {len(missing())}, "
        f"{overlapping} concurrent-owner overlaps, {len(violations)} order violations, "
        f"{len(duplicated)} duplicates (all of the killed consumer: "
        f"{all('c' in w for w in duplicated.values())})"
    )
    assert not missing()
    assert overlapping == 0
    assert not violations, violations[:20]
    assert all("c" in w for w in duplicated.values()), duplicated


@pytest.mark.brokers("kafka")
@pytest.mark.coordinator_args(*GROWTH_FLAGS)
async def test_a_backlog_across_the_growth_is_read_in_key_order(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """The members are away while the topic grows under traffic, and come back to a
    backlog in which one key's records are in an old partition and, written later, in a
    new one: a new partition is short and read at once, an old one takes many fetches,
    so without the merge a key's newer records would run before its older ones."""
    await create_topic(coordinator.bootstrap, partitions=2)
    for name in ("a", "b", "c"):
        workers.spawn(name, "--handler-ms", "2")
    await wait_for(lambda: coordinator.settled(3), 60, "three members settled")
    for name in ("a", "b", "c"):
        workers.stop(name)

    async def nobody() -> bool:
        view = await coordinator.group(GROUP)
        return view is not None and not view["members"]

    await wait_for(nobody, 30, "every member gone")
    producer = PacedProducer(coordinator.bootstrap)
    producing = asyncio.create_task(producer.run(15 * RATE))
    await wait_for(lambda: len(producer.sent) >= 5 * RATE, 30, "traffic before the growth")
    await grow(coordinator.bootstrap, TOPIC, 4)
    produced = await producing
    await wait_for(lambda: "grew from 2 to 4" in coordinator.read_log(), 30, "the growth seen")
    for name in ("d", "e", "f"):
        workers.spawn(name, "--handler-ms", "2")
    wanted = {(r.partition, r.offset) for r in produced}

    def missing() -> set[tuple[int, int]]:
        return wanted - {(e.partition, e.offset) for e in workers.processed()}

    await wait_for(lambda: not missing(), 120, "every record processed")
    processed = workers.processed()
    violations = order_violations(produced, processed)
    print(f"\nbacklog across 2 -> 4: {len(produced)} produced, {len(violations)} order violations")
    assert not violations, violations[:20]
