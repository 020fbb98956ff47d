"""What the state topic stores per member and per position segment, from the log codec.

The sizing estimate in docs/operations/high-availability.md multiplies these: a member
record (written when its ownership changes) and a position map of one partition (written
every flush interval while positions move), for groups of 10 and 100 members each owning
one range, every segment with one acknowledged interval past its next offset.

Run: .venv/bin/python -m bench.state_sizes
"""

from __future__ import annotations

from keyshard.coordinator.storage.log_format import MemberRecord, encode, encode_positions
from keyshard.core.model.hashing import SLOT_COUNT
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange


def main() -> None:
    for members in (10, 100):
        step = SLOT_COUNT // members
        record = MemberRecord(
            group="orders-042", member_id="m-0123456789abcdef", name="worker-17", capacity=1,
            session_timeout_ms=10_000, member_epoch=12, owned=RangeSet([SlotRange(0, step - 1)]),
            topics=("orders.events",), fixed_ranges=None, epoch=3, principal="",
        )  # fmt: skip
        positions = RangePositionMap()
        for i in range(members):
            offset = 10**8 + i * 50
            position = Position(offset, ((offset + 9, offset + 11),))
            positions.update([(SlotRange(i * step, (i + 1) * step - 1), position)])
        chunks = encode_positions("orders-042", ("orders.events", 3), positions, 3)
        map_bytes = sum(len(key) + len(value) for key, value in chunks)
        member_bytes = len(record.key) + len(encode(record) or b"")
        print(
            f"{members} members: a member record {member_bytes} bytes; "
            f"a partition's position map {map_bytes} bytes ({map_bytes / members:.0f} per segment)"
        )


if __name__ == "__main__":
    main()
