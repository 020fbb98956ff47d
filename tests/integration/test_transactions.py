"""Transactional topics on Apache Kafka: consumers read committed data only.

A transactional producer writes 500 records and commits, 500 and aborts, 500 and commits:
no aborted record ever reaches a handler, positions step over the transaction markers and
the aborted span (a graceful restart processes nothing again), and a consumer waits at an
open transaction until it commits. Tansu has no transactional producer: Kafka only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from harness import (
    GROUP,
    TOPIC,
    CoordinatorProcess,
    Workers,
    create_topic,
    wait_for,
)
from keyshard.local.verify import Produced, check

pytestmark = [pytest.mark.integration, pytest.mark.brokers("kafka")]


async def transaction(
    producer: AIOKafkaProducer, start: int, count: int, *, commit: bool
) -> list[Produced]:
    """`count` keyed records (key = index mod 50) in one transaction, committed or not."""
    await producer.begin_transaction()
    sent = []
    for i in range(start, start + count):
        key = f"key-{i % 50}"
        sent.append((key, await producer.send(TOPIC, key=key.encode(), value=str(i).encode())))
    records = [Produced((m := await f).partition, m.offset, k) for k, f in sent]
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()
    return records


async def lag_view(coordinator: CoordinatorProcess) -> list[dict[str, Any]]:
    view = await coordinator.group(GROUP)
    return [] if view is None else [r for m in view["members"] for r in m["range_lag"]]


async def caught_up(coordinator: CoordinatorProcess, members: int) -> bool:
    """Every owned range's position is at the partition's end (nothing left to do)."""
    if await coordinator.settled(members) is None:
        return False
    lags = await lag_view(coordinator)
    return bool(lags) and all(r["lag"] == 0 for r in lags)


async def test_aborted_records_are_never_processed_nor_processed_again(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    producer = AIOKafkaProducer(
        bootstrap_servers=coordinator.bootstrap, transactional_id="test-txn-writer"
    )
    await producer.start()
    try:
        committed = await transaction(producer, 0, 500, commit=True)
        aborted = await transaction(producer, 500, 500, commit=False)
        committed += await transaction(producer, 1000, 500, commit=True)
    finally:
        await producer.stop()
    for name in ("a", "b"):
        workers.spawn(name)
    await wait_for(lambda: workers.unique() >= len(committed), 60, "committed records processed")
    await wait_for(lambda: caught_up(coordinator, 2), 30, "positions at the partition's end")
    processed = workers.processed()
    done = {(e.partition, e.offset) for e in processed}
    assert done == {(r.partition, r.offset) for r in committed}
    assert not done & {(r.partition, r.offset) for r in aborted}
    report = check(committed, processed)
    assert report.duplicates == 0 and report.order_violations == [] and report.lost == []
    assert all(r["counted_to"] == "last_stable_offset" for r in await lag_view(coordinator))

    runs_before = len(processed)
    for name in ("a", "b"):
        workers.stop(name)  # graceful: exact positions

    async def left() -> bool:
        view = await coordinator.group(GROUP)
        return view is not None and not view["members"]

    await wait_for(left, 30, "both left")
    for name in ("c", "d"):
        workers.spawn(name)
    await wait_for(lambda: caught_up(coordinator, 2), 30, "new members at the end")
    assert len(workers.processed()) == runs_before, "nothing processed again after a restart"


async def test_a_consumer_waits_at_an_open_transaction_and_goes_on_at_its_commit(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    producer = AIOKafkaProducer(
        bootstrap_servers=coordinator.bootstrap, transactional_id="test-open-txn"
    )
    plain = AIOKafkaProducer(bootstrap_servers=coordinator.bootstrap)
    await asyncio.gather(producer.start(), plain.start())
    try:
        before = await transaction(producer, 0, 100, commit=True)
        workers.spawn("a")
        await wait_for(lambda: workers.unique() >= 100, 30, "the first transaction processed")

        await producer.begin_transaction()  # left open for now
        pending = [await producer.send(TOPIC, key=b"key-1", value=str(i).encode())
                   for i in range(100, 200)]  # fmt: skip
        for future in pending:
            await future  # on the broker: the transaction is open from here
        # A record written after the open transaction began waits for it too (the last
        # stable offset stops at the open transaction's first record).
        after_open = await (await plain.send(TOPIC, key=b"key-2", value=b"plain"))
        await wait_for(
            lambda: caught_up(coordinator, 1), 30, "the consumer at the last stable offset"
        )
        assert workers.unique() == 100, "nothing past the open transaction was processed"

        await producer.commit_transaction()
        await wait_for(lambda: workers.unique() >= 201, 30, "the transaction's records")
    finally:
        await asyncio.gather(producer.stop(), plain.stop())
    done = {(e.partition, e.offset) for e in workers.processed()}
    assert (after_open.partition, after_open.offset) in done
    assert {(r.partition, r.offset) for r in before} <= done
