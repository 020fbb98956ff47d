"""The state log on a real broker: two replicas, one partition, a takeover that fences.

Replica A claims partition 0 and writes; B, a hot standby, has A's records in its image;
B claims the partition (epoch 2); A's next write is refused (Fenced): by the broker's
transaction fencing on Kafka, by the epoch marker A's own tail sees on the embedded
broker (which has no transactions).

With a replica secret, what a mere topic writer appends (a beat, an epoch marker with a
huge epoch) is not believed, and a record nobody can read is skipped alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from harness import append, wait_for
from harness.brokers import Broker
from keyshard.coordinator.storage.base import Fenced
from keyshard.coordinator.storage.kafka_log import KafkaStateLog, ReplicaIdentity
from keyshard.coordinator.storage.log_format import EpochMarker, MemberRecord, ReplicaBeat, encode
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.ranges import RangeSet

pytestmark = pytest.mark.integration
TOPIC = "__keyshard_state"


SECRET = ReplicaSecret.from_text("the-replicas-shared-secret")


def replica(broker: Broker, name: str, secret: ReplicaSecret | None = None) -> KafkaStateLog:
    identity = ReplicaIdentity(name, f"{name}:7171", f"http://{name}:7172")
    return KafkaStateLog(
        broker.bootstrap_servers, TOPIC, settings=KafkaSettings.parse(), identity=identity,
        partitions=3, timeout=20.0, secret=secret,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def started_pair(
    broker: Broker, secret: ReplicaSecret | None = None
) -> AsyncIterator[tuple[KafkaStateLog, KafkaStateLog]]:
    """Replicas A and B, started on the state topic (both with `secret`, or neither)."""
    a, b = replica(broker, "a", secret), replica(broker, "b", secret)
    try:
        await a.start()
        await b.start()
        yield a, b
    finally:
        await asyncio.gather(a.stop(), b.stop())


@pytest.fixture
async def logs(broker: Broker) -> AsyncIterator[tuple[KafkaStateLog, KafkaStateLog]]:
    async with started_pair(broker) as pair:
        yield pair


def members(log: KafkaStateLog) -> set[str] | None:
    group = log.images[0].groups().get("g")
    return None if group is None else set(group.members)


def record(member_id: str, epoch: int) -> tuple[bytes, bytes | None]:
    m = MemberRecord("g", member_id, member_id, 1, 10_000, 1, RangeSet.full(), ("t",), epoch=epoch)
    return m.key, encode(m)


async def test_a_takeover_fences_the_previous_writer(
    logs: tuple[KafkaStateLog, KafkaStateLog], broker: Broker
) -> None:
    a, b = logs
    assert a.partitions == b.partitions == 3
    epoch_a, _ = await a.claim(0)
    assert epoch_a == 1
    await a.write(0, epoch_a, [record("m1", epoch_a)])
    # B is a hot standby. (Polled, not `end_of` right after the write: Kafka writes the
    # commit markers after the commit returns, and until then a reader sees nothing.)
    await wait_for(lambda: members(b) == {"m1"}, 20, "B to read A's write")

    epoch_b, image = await b.claim(0)
    assert epoch_b == 2 and set(image.groups()["g"].members) == {"m1"}
    if not a.transactions:  # the embedded broker: A learns from its own tail
        await wait_for(lambda: a.images[0].epoch == epoch_b, 20, "A to read B's claim")
    with pytest.raises(Fenced):
        await a.write(0, epoch_a, [record("m2", epoch_a)])
    await b.write(0, epoch_b, [record("m3", epoch_b)])
    await wait_for(lambda: members(a) == {"m1", "m3"}, 20, "A to read B's write")
    assert a.images[0].owner is not None and a.images[0].owner.replica_id == "b"


async def test_replicas_see_each_others_beats(logs: tuple[KafkaStateLog, KafkaStateLog]) -> None:
    a, b = logs

    async def both_alive() -> None:
        while set(a.alive(4)) != {"a", "b"}:
            await asyncio.gather(a.beat(), b.beat())
            await asyncio.sleep(0.05)

    await asyncio.wait_for(both_alive(), 20)
    assert a.caught_up and b.caught_up

    # B falls silent: once A has beaten four more times, B is gone in A's view. B, not
    # having read those beats yet (a frozen replica), still sees A alive: liveness is
    # counted in one's own beats, not by a clock that ran on while it was not looking.
    async def b_gone() -> None:
        while "b" in a.alive(4):
            await a.beat()
            await asyncio.sleep(0.05)

    await asyncio.wait_for(b_gone(), 20)
    assert "a" in a.alive(4) and "a" in b.alive(4)


async def test_a_handed_over_partition_is_held_by_nobody(
    logs: tuple[KafkaStateLog, KafkaStateLog],
) -> None:
    a, b = logs
    epoch, _ = await a.claim(0)
    await wait_for(lambda: b.images[0].holder == "a", 20, "B to read A's claim")
    await a.release(0, handed_over_at=epoch)
    await wait_for(lambda: b.images[0].holder is None, 20, "B to read A's release")
    assert b.images[0].epoch == epoch
    assert (await b.claim(0))[0] == epoch + 1


@pytest.mark.brokers("tansu")
async def test_no_transactions_on_tansu_is_said_at_info_not_as_a_warning(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Tansu has no transactions by design: its refusal is expected, not a fault to warn
    about (a broker not known to lack them still gets a WARNING)."""
    log = replica(broker, "a")
    with caplog.at_level(logging.INFO, logger="keyshard.coordinator.storage.kafka_log"):
        try:
            await log.start()
        finally:
            await log.stop()
    assert log.transactions is False
    said = [r for r in caplog.records if "takes no transactional producer" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO], said
    assert "expected of Tansu" in said[0].getMessage()


@pytest.fixture
async def signed(broker: Broker) -> AsyncIterator[tuple[KafkaStateLog, KafkaStateLog]]:
    async with started_pair(broker, SECRET) as pair:
        yield pair


def _forged_marker(epoch: int) -> tuple[bytes, bytes]:
    marker = EpochMarker(0, epoch, "forger", "forger:7171", "http://forger:7172")
    value = encode(marker)
    assert value is not None
    return marker.key, value


async def test_a_forged_marker_with_a_huge_epoch_moves_nothing(
    signed: tuple[KafkaStateLog, KafkaStateLog], broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = signed
    epoch, _ = await a.claim(0)
    await wait_for(lambda: b.images[0].holder == "a", 20, "B to read A's claim")
    with caplog.at_level(logging.WARNING, logger="keyshard.coordinator.storage.record_reader"):
        await append(
            broker.bootstrap_servers, TOPIC, 0, _forged_marker(2**40), _forged_marker(epoch + 1)
        )
        await wait_for(
            lambda: a.images[0].unverified_epoch == b.images[0].unverified_epoch == epoch + 1,
            20, "A and B to read them",
        )  # fmt: skip
    for image in (a.images[0], b.images[0]):
        assert (image.holder, image.epoch) == ("a", epoch)
    await a.write(0, epoch, [record("m1", epoch)])  # A is not fenced
    await wait_for(lambda: members(b) == {"m1"}, 20, "B to read A's write")
    assert any("forger" in r.getMessage() and "not signed" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    # A takeover goes above the forged epoch it can count, never to the huge one.
    assert (await b.claim(0))[0] == epoch + 2


async def test_a_forged_beat_is_not_believed(
    signed: tuple[KafkaStateLog, KafkaStateLog], broker: Broker
) -> None:
    a, b = signed
    forged = ReplicaBeat("forger", "forger:7171", "http://forger:7172", 0)
    value = encode(forged)
    assert value is not None
    await append(broker.bootstrap_servers, TOPIC, 0, (forged.key, value))

    async def b_alive() -> None:
        while "b" not in a.alive(4):
            await asyncio.gather(a.beat(), b.beat())
            await asyncio.sleep(0.05)

    await asyncio.wait_for(b_alive(), 20)
    assert set(a.beats) == {"a", "b"}  # the forged beat, before B's, was read and dropped


async def test_an_unreadable_record_is_skipped_alone(
    signed: tuple[KafkaStateLog, KafkaStateLog], broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = signed
    epoch, _ = await a.claim(0)
    with caplog.at_level(logging.ERROR, logger="keyshard.coordinator.storage.record_reader"):
        await append(
            broker.bootstrap_servers, TOPIC, 0, (b"M\x00g\x00junk", b"[]"), record("after", epoch)
        )
        await wait_for(
            lambda: members(a) == members(b) == {"after"}, 20, "A and B to read the record after"
        )
    assert any("skipping unreadable state record 0/" in r.getMessage() for r in caplog.records)
