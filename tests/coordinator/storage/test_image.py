"""Replaying a state partition: the union of position chunks, members, and the fence."""

from __future__ import annotations

import json
from dataclasses import replace

from keyshard.coordinator.group.state import MAX_AUDIT_HISTORY, AuditEntry
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.log_format import (
    AuditRecord,
    EpochMarker,
    MemberRecord,
    PositionsChunk,
    ResetMarker,
    Tombstone,
    decode,
    encode,
    encode_positions,
    member_key,
    reset_key,
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


def test_a_member_keeps_its_principal_and_one_stored_without_is_anonymous() -> None:
    m = replace(member("m1", 2, RangeSet.full()), principal="User:team-a")
    assert decode(m.key, encode(m)) == m
    stored = json.loads(encode(member("m1", 2, RangeSet.full())) or b"")
    del stored["principal"]
    old = decode(m.key, json.dumps(stored).encode())
    assert isinstance(old, MemberRecord) and old.principal == "User:ANONYMOUS"


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


# ---- a reset supersedes older chunks for its slots -------------------------------------

HIGH = RangeSet.from_pairs([(32768, 65535)])


def chunks_of(pmap: RangePositionMap, max_bytes: int = 200) -> list[PositionsChunk]:
    """`pmap` as the writer stores it, in small chunks (so a map of a few segments takes
    several, and a torn write can leave some of them behind)."""
    decoded = [decode(k, v) for k, v in encode_positions("g", TP, pmap, 1, max_bytes)]
    assert all(isinstance(c, PositionsChunk) for c in decoded)
    return decoded  # type: ignore[return-value]


def striped(offsets: list[int]) -> RangePositionMap:
    """A map of len(offsets) equal slices of the slot space, slice i at offsets[i]."""
    pmap = RangePositionMap()
    width = 65536 // len(offsets)
    for i, offset in enumerate(offsets):
        pmap.assign(SlotRange(i * width, (i + 1) * width - 1), Position(offset))
    return pmap


def test_a_reset_marker_round_trips_through_its_json() -> None:
    marker = ResetMarker("g", TP, HIGH, Position(7, ((9, 12),)), epoch=4)
    assert decode(marker.key, encode(marker)) == marker
    assert decode(reset_key("g", TP), None) == Tombstone(marker.key)


def test_chunks_older_than_a_reset_say_nothing_about_its_slots() -> None:
    """A torn write of the reset: the marker and the first new chunk landed, the old
    chunks after it did not get rewritten. The old ones still count outside the reset's
    slots; inside, the reset's position and what was written after it."""
    before = striped([900 + i for i in range(16)])
    old = chunks_of(before)
    assert len(old) > 2
    image = PartitionImage(0)
    offset = 0
    for chunk in old:
        image.apply(offset, chunk)
        offset += 1
    image.apply(offset, ResetMarker("g", TP, HIGH, Position(100), epoch=1))
    after = before.copy()
    for r in HIGH:
        after.assign(r, Position(100))
    image.apply(offset + 1, chunks_of(after)[0])  # the rest of the write is lost
    loaded = image.groups()["g"].positions[TP]
    assert loaded.get(40000) == Position(100)
    assert loaded.get(65535) == Position(100)
    assert loaded.get(0) == Position(900)
    assert loaded.get(32767) == Position(907)
    # Without the marker the stale chunks would have undone the reset:
    image.apply(offset + 2, Tombstone(reset_key("g", TP)))
    assert image.groups()["g"].positions[TP].get(65535) == Position(915)


def test_progress_written_after_a_reset_counts() -> None:
    image = PartitionImage(0)
    image.apply(0, positions(900, 1))
    image.apply(1, ResetMarker("g", TP, RangeSet.full(), Position(100), epoch=1))
    image.apply(2, positions(100, 1))  # the reset's own write
    assert image.groups()["g"].positions[TP].minimum_offset() == 100
    image.apply(3, positions(250, 1))  # the group moved on from there
    assert image.groups()["g"].positions[TP].minimum_offset() == 250


def test_a_reset_marker_of_a_fenced_writer_is_ignored() -> None:
    image = PartitionImage(0)
    image.apply(0, EpochMarker(0, 2, "b", "b:1", "http://b:2"))
    image.apply(1, positions(900, 2))
    image.apply(2, ResetMarker("g", TP, RangeSet.full(), Position(0), epoch=1))
    assert image.fenced_records == 1
    assert image.groups()["g"].positions[TP].minimum_offset() == 900


def test_the_audit_trail_keeps_the_last_entries_in_order_and_fenced_writers_add_none() -> None:
    def entry(seq: int) -> AuditRecord:
        return AuditRecord(
            "g", AuditEntry(1000 + seq, "User:ops", "fence", f"member m{seq}", seq), 1
        )

    assert decode(entry(7).key, encode(entry(7))) == entry(7)
    image = PartitionImage(0)
    image.apply(0, EpochMarker(0, 1, "a", "a:1", "http://a:2"))
    # More entries than the trail keeps: each takes the key of the one it supersedes.
    for seq in range(MAX_AUDIT_HISTORY + 3):
        image.apply(seq + 1, entry(seq))
    assert len({entry(seq).key for seq in range(MAX_AUDIT_HISTORY + 3)}) == MAX_AUDIT_HISTORY
    image.apply(500, EpochMarker(0, 2, "b", "b:1", "http://b:2"))
    image.apply(501, entry(MAX_AUDIT_HISTORY + 3))  # epoch 1, after the marker of 2
    trail = image.groups()["g"].audit
    assert [e.seq for e in trail] == list(range(3, MAX_AUDIT_HISTORY + 3))
