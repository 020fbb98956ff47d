"""Pure parts of exactly-once mode: writer records, position unions, outputs, settings."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from keyshard.consumer_client import CoordinatedConsumer, Outputs
from keyshard.consumer_client._exactly_once.txn_log import (
    WriterRecord,
    merge_positions,
    start_positions,
)
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange

TP = ("orders", 0)


def test_writer_record_round_trips() -> None:
    pmap = RangePositionMap()
    pmap.assign(SlotRange(0, 99), Position(40, ((42, 45),)))
    record = WriterRecord("g", "app.g.a.1", RangeSet.from_pairs([(0, 99)]), {TP: pmap})
    back = WriterRecord.decode(record.encode())
    assert back == record
    assert not back.retired


def test_writer_record_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        WriterRecord.decode(b'{"v": 9}')


def test_merge_positions_unites_per_slot() -> None:
    maps: dict[tuple[str, int], RangePositionMap] = {}
    merge_positions(maps, {TP: [(SlotRange(0, 9), Position(5))]})
    merge_positions(maps, {TP: [(SlotRange(5, 14), Position(3, ((6, 8),)))]})
    assert maps[TP].get(0) == Position(5)
    assert maps[TP].get(7) == Position(5, ((6, 8),))
    assert maps[TP].get(12) == Position(3, ((6, 8),))
    assert maps[TP].get(20) == Position(0)


def test_start_positions_take_what_any_writer_committed() -> None:
    """The coordinator may be behind what was committed (a member died before its Ping):
    the start is the union, clipped to the granted slots and the coordinator's partitions."""
    committed = RangePositionMap()
    committed.assign(SlotRange(0, 65535), Position(100))
    other_topic = RangePositionMap(Position(7))
    writer = WriterRecord("g", "t", RangeSet(), {TP: committed, ("other", 0): other_topic})
    coordinator = {TP: [(SlotRange(0, 65535), Position(60, ((120, 130),)))]}
    slots = RangeSet.from_pairs([(10, 20)])
    start = start_positions([writer], coordinator, slots)
    assert start == {TP: [(SlotRange(10, 20), Position(100, ((120, 130),)))]}


def test_outputs_refuse_what_kafka_cannot_take() -> None:
    out = Outputs()
    out.send("out", b"v", key=b"k", headers=[("h", b"1")])
    with pytest.raises(ValueError, match="topic"):
        out.send("", b"v")
    with pytest.raises(TypeError, match="value must be bytes"):
        out.send("out", "text")  # type: ignore[arg-type]
    assert len(out.records) == 1


def consumer(**extra: object) -> CoordinatedConsumer:
    return CoordinatedConsumer(
        group="g",
        topics=["t"],
        coordinator="127.0.0.1:7171",
        bootstrap_servers="127.0.0.1:9092",
        **extra,  # type: ignore[arg-type]
    )


def test_bad_transaction_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="transactional_id_prefix"):
        consumer(transactional_id_prefix="has space")
    with pytest.raises(ValueError, match="transaction_interval_ms"):
        consumer(transactional_id_prefix="app", transaction_interval_ms=0)


async def test_the_two_run_modes_are_not_mixed() -> None:
    with pytest.raises(ValueError, match="run_exactly_once"):
        await consumer(transactional_id_prefix="app").run(lambda r: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="transactional_id_prefix"):
        await consumer().run_exactly_once(lambda r, o: None)  # type: ignore[arg-type,return-value]


async def test_outputs_past_a_quarter_of_the_budget_are_committed_at_once() -> None:
    """The batch waits for the interval (10 s here) unless its outputs reach
    `max_batch_bytes`: then it is committed at once, so held outputs stay bounded."""
    from keyshard.consumer_client._datapath.progress import ConsumerProgress
    from keyshard.consumer_client._exactly_once.transactions import TransactionalWriter
    from keyshard.core.kafka.settings import KafkaSettings

    writer = TransactionalWriter(
        progress=ConsumerProgress(),
        txn_log=SimpleNamespace(prefix="app", group="g"),  # type: ignore[arg-type]
        bootstrap="127.0.0.1:9092",
        kafka=KafkaSettings.parse({}),
        name="w",
        interval_ms=10_000,
        max_batch_bytes=1000,
    )
    commits: list[int] = []
    committed = asyncio.Event()

    async def commit() -> None:
        commits.append(writer.batch_bytes)
        writer.batch, writer.batch_bytes = [], 0
        committed.set()

    writer.commit = commit  # type: ignore[assignment, method-assign]

    async def handler(record: object, outputs: Outputs) -> None:
        outputs.send("out", b"v" * 400, key=b"k")

    run = writer.wrap(handler)
    loop = asyncio.create_task(writer._commit_loop())
    try:
        await run(None)
        await run(None)
        assert writer.batch_bytes == 802 and not committed.is_set()
        await run(None)  # 1203 bytes: past the budget's quarter
        await asyncio.wait_for(committed.wait(), 5)
        assert commits == [1203] and writer.batch_bytes == 0
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
