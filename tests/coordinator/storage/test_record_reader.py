"""What a replica believes of what it reads, record by record: a record it cannot read is
skipped alone (the rest of its batch applied), and with a replica secret a beat or an
epoch marker that does not verify moves nothing and names no address."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from keyshard.coordinator.storage.image import MAX_UNVERIFIED_EPOCH, PartitionImage
from keyshard.coordinator.storage.log_format import (
    EpochMarker,
    MemberRecord,
    ReplicaBeat,
    StateRecord,
    encode,
)
from keyshard.coordinator.storage.record_reader import RecordReader
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.model.ranges import RangeSet

TOPIC = "__keyshard_state"
SECRET = ReplicaSecret.from_text("the-replicas-secret-0123")
FORGER = ReplicaSecret.from_text("not-the-replicas-secret")


@dataclass
class Record:
    """What the reader takes of aiokafka's ConsumerRecord."""

    key: bytes | None
    value: bytes | None
    offset: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def _record(
    record: StateRecord, offset: int, partition: int = 0, signed_by: ReplicaSecret | None = None
) -> Record:
    key, value = record.key, encode(record)
    headers = [] if signed_by is None else signed_by.headers(TOPIC, partition, key, value)
    return Record(key, value, offset, headers)


def _member(member_id: str, epoch: int) -> MemberRecord:
    return MemberRecord(
        "g", member_id, member_id, 1, 10_000, 1, RangeSet.full(), ("t",), epoch=epoch
    )


def _marker(epoch: int, replica: str, partition: int = 0) -> EpochMarker:
    return EpochMarker(partition, epoch, replica, f"{replica}:7171", f"http://{replica}:7172")


@pytest.mark.parametrize(
    "value",
    [b"[]", b"not json", b'"a string"', b'{"v":3,"epoch":1e400,"kind":"member"}',
     b'{"v":3,"epoch":-1,"kind":"member"}', b'{"v":3,"epoch":true,"kind":"member"}',
     b'{"v":3,"kind":"member"}', b'{"v":3,"kind":"epoch","partition":"x"}'],
)  # fmt: skip
def test_an_unreadable_record_is_skipped_alone(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    image = PartitionImage(0)
    records = [
        _record(_member("before", 1), 10),
        Record(b"M\x00g\x00bad", value, 11),
        _record(_member("after", 1), 12),
    ]
    with caplog.at_level(logging.ERROR, logger="keyshard.coordinator.storage.record_reader"):
        RecordReader(TOPIC, None).replay(image, records)
    assert set(image.groups()["g"].members) == {"before", "after"}
    assert image.next_offset == 13
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("skipping unreadable state record 0/11: ")


def test_a_marker_that_does_not_verify_moves_nothing(caplog: pytest.LogCaptureFixture) -> None:
    image = PartitionImage(0)
    reader = RecordReader(TOPIC, SECRET)
    with caplog.at_level(logging.WARNING, logger="keyshard.coordinator.storage.record_reader"):
        reader.replay(
            image,
            [
                _record(_marker(1, "owner"), 0, signed_by=SECRET),
                _record(_member("m1", 1), 1),
                _record(_marker(2**40, "forger"), 2),  # unsigned
                _record(_marker(5, "forger"), 3, signed_by=FORGER),
                _record(_marker(6, "forger", partition=1), 4, signed_by=SECRET),  # moved
                _record(_member("m2", 1), 5),  # the owner's, still at its epoch
            ],
        )
    assert image.owner == _marker(1, "owner") and image.holder == "owner" and image.epoch == 1
    assert set(image.groups()["g"].members) == {"m1", "m2"}
    assert image.next_offset == 6
    # A forged epoch only keeps the next claim above it, and only within bounds.
    assert image.unverified_epoch == 5 and image.next_epoch == 6
    image.unverified(7, MAX_UNVERIFIED_EPOCH)
    assert image.next_epoch == MAX_UNVERIFIED_EPOCH + 1
    lines = [r.getMessage() for r in caplog.records]
    unsigned = "ignoring the epoch marker (1099511627776, forger) at 0/2: it is not signed"
    assert unsigned in lines, lines
    assert any("skipping unreadable state record 0/4" in line for line in lines), lines


def test_without_a_secret_every_readable_marker_counts() -> None:
    image = PartitionImage(0)
    RecordReader(TOPIC, None).replay(image, [_record(_marker(7, "anyone"), 0)])
    assert (image.holder, image.epoch, image.next_epoch) == ("anyone", 7, 8)


def test_a_beat_that_does_not_verify_is_not_believed() -> None:
    beat = ReplicaBeat("r1", "10.0.0.1:7171", "http://10.0.0.1:7172", 0)
    reader = RecordReader(TOPIC, SECRET)
    assert reader.beat(_record(beat, 0, signed_by=SECRET)) == beat
    assert reader.beat(_record(beat, 1)) is None
    assert reader.beat(_record(beat, 2, signed_by=FORGER)) is None
    assert reader.beat(Record(beat.key, b"[]", 3)) is None
    assert reader.beat(_record(_member("m", 1), 4, signed_by=SECRET)) is None  # not a beat
    assert RecordReader(TOPIC, None).beat(_record(beat, 5)) == beat
