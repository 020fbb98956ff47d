"""Key -> slot mapping shared by the coordinator and every consumer.

The slot numbers are Pulsar's (murmur3_32, seed 0, masked positive, modulo 65536), so a
key lands in the same slot here as in a Pulsar Key_Shared subscription. `mmh3` is the C
implementation: a pure-Python murmur would halve the consumer's read speed.
"""

from __future__ import annotations

import mmh3

SLOT_COUNT = 65536
MAX_SLOT = SLOT_COUNT - 1
ORDERING_KEY_HEADER = "ordering-key"
LOAD_BUCKET_SHIFT = 4  # 4096 load buckets of 16 slots each, reported on Ping
LOAD_BUCKET_COUNT = SLOT_COUNT >> LOAD_BUCKET_SHIFT


def positive_hash(data: bytes) -> int:
    """murmur3_32 (seed 0) masked positive: Pulsar's key hash, for slots and anything
    else keyed by a name (a group's state partition)."""
    return int(mmh3.hash(data, 0, signed=False)) & 0x7FFFFFFF


def slot_for_key(key: bytes) -> int:
    """Slot of an ordering key."""
    return (mmh3.hash(key, 0, signed=False) & 0x7FFFFFFF) % SLOT_COUNT


def ordering_key(
    key: bytes | None,
    headers: tuple[tuple[str, bytes], ...] | list[tuple[str, bytes]] | None,
    header_name: str = ORDERING_KEY_HEADER,
) -> bytes | None:
    """The key whose order is kept: the ordering header (PIP-34) wins over the record key."""
    if headers:
        for name, value in headers:
            if name == header_name and value is not None:
                return bytes(value)
    return key


def slot_for_record(
    key: bytes | None,
    headers: tuple[tuple[str, bytes], ...] | list[tuple[str, bytes]] | None,
    offset: int,
    header_name: str = ORDERING_KEY_HEADER,
) -> tuple[int, bytes | None]:
    """Slot and ordering key of a record.

    Records with neither key nor ordering header carry no order constraint; spreading them
    by offset lets every consumer share them instead of piling them onto one slot.
    """
    okey = ordering_key(key, headers, header_name)
    if okey is None:
        return offset % SLOT_COUNT, None
    return slot_for_key(okey), okey
