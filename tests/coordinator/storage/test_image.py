"""Replaying a state partition: the union of position chunks, members, and the fence."""

from __future__ import annotations

from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.log_format import (
    EpochMarker,
    MemberRecord,
    PositionsChunk,
    Tombstone,
    decode,
    encode,
    encode_positions,
    member_key,
)
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange

TP = ("orders", 0)


def member(mid: str, epoch: int, owned: RangeSet) -> MemberRecord:
    return MemberRecord("g", mid, mid, 1, 10_000, 3, owned, ("orders",), epoch=epoch)


def positions(next_offset: int, epoch: int) -> PositionsChunk:
    pmap = RangePositionMap(Position(next_offset))
    ((key, value),) = encode_positions("g", TP, pmap, epoch)
    record = decode(key, value)
    assert isinstance(record, PositionsChunk)
    return record


def test_records_round_trip_through_their_json() -> None:
    m = member("m1", 2, RangeSet((SlotRange(0, 99), SlotRange(500, 600))))
    assert decode(m.key, encode(m)) == m
    e = EpochMarker(3, 7, "replica-a", "10.0.0.1:7171", "http://10.0.0.1:7172")
    assert decode(e.key, encode(e)) == e
    assert decode(b"M\x00g\x00m1", None) == Tombstone(b"M\x00g\x00m1")


def test_a_fenced_writer_after_the_marker_is_ignored_and_before_it_counts() -> None:
    image = PartitionImage(0)
    image.apply(0, EpochMarker(0, 1, "a", "a:1", "http://a:2"))
    image.apply(1, member("m1", 1, RangeSet.full()))
    image.apply(2, positions(100, 1))  # the old owner, before the takeover: counts
    image.apply(3, EpochMarker(0, 2, "b", "b:1", "http://b:2"))
    image.apply(4, positions(900, 1))  # the old owner again, fenced: ignored
    image.apply(5, member("m2", 1, RangeSet.full()))  # ignored too
    assert (image.epoch, image.fenced_records) == (2, 2)
    groups = image.groups()
    assert set(groups["g"].members) == {"m1"}
    assert groups["g"].positions[TP].minimum_offset() == 100
    image.apply(6, Tombstone(member_key("g", "m1")))
    assert image.groups()["g"].members == {}
    assert image.next_offset == 7


def test_of_two_claims_at_the_same_epoch_the_first_in_the_log_holds() -> None:
    """Without transactions (Tansu) two replicas may claim at once and both write the
    next epoch; the first marker in the log wins, and only its writer may speak at that
    epoch again (its release)."""
    image = PartitionImage(0)
    image.apply(0, EpochMarker(0, 1, "a", "a:1", "http://a:2"))
    image.apply(1, EpochMarker(0, 2, "b", "b:1", "http://b:2"))
    image.apply(2, EpochMarker(0, 2, "c", "c:1", "http://c:2"))  # too late: ignored
    assert (image.epoch, image.holder) == (2, "b")
    image.apply(3, EpochMarker(0, 2, "b", "b:1", "http://b:2", released=True))
    assert (image.epoch, image.holder) == (2, None)
    image.apply(4, EpochMarker(0, 3, "c", "c:1", "http://c:2"))
    assert (image.epoch, image.holder) == (3, "c")
