"""The state log's records: keys, values, and their JSON. Pure: no I/O.

A group lives in one partition of the state topic (`partition_of`), and every record of
the group goes there, so one partition's log is everything its coordinator needs:

- `PositionsChunk`  the range position map of one topic-partition of a group, in chunks
                    of at most `MAX_RECORD_BYTES` (loading takes the union of a
                    partition's chunks: positions only say which offsets are done, so a
                    stale or torn chunk can only say less, never something false);
- `ResetMarker`     the latest reset of a group's positions of one topic-partition
                    (coordinator.group.resets), written ahead of the rewritten
                    chunks: a reset may move positions backwards, where a stale chunk
                    would say more than the truth, so a load lets chunks older than the
                    marker say nothing about the slots it reset (`image`);
- `MemberRecord`    a member and the ranges it owns, written before a StartFetcher
                    leaves: what a new coordinator checks a re-registering member's
                    claim against (a tombstone when the member is gone);
- `TopicsRecord`    the group's topics (or pattern), partition counts and transitions
                    (coordinator.group.growth): a transition cannot be seen on the
                    cluster any more by the replica that takes the group over;
- `AuditRecord`     one entry of the group's audit trail (who changed what through the
                    admin API, when), keyed by its place in a ring of the group's last
                    `MAX_AUDIT_HISTORY`, so compaction keeps those and no more;
- `EpochMarker`     a replica took the partition over, with the next coordinator epoch:
                    records of older epochs after it are a fenced writer's and are ignored;
- `ReplicaBeat`     a replica is alive (partition 0 only, outside transactions).

Keys start with a kind letter so compaction keeps the latest of each thing; every value
carries the coordinator epoch of its writer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from keyshard.coordinator.group.state import (
    ANONYMOUS_PRINCIPAL,
    MAX_AUDIT_HISTORY,
    AuditEntry,
    Transition,
)
from keyshard.core.model.positions import Position, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import RangeSet

FORMAT_VERSION = 3
#: Half of Kafka's default max.message.bytes: room for the batch's own overhead.
MAX_RECORD_BYTES = 512 * 1024
SEP = "\x00"


class RecordError(ValueError):
    """A state record this version cannot read."""


@dataclass(frozen=True, slots=True)
class PositionsChunk:
    group: str
    tp: TopicPartition
    chunk: int
    positions: RangePositionMap
    epoch: int = 0

    @property
    def key(self) -> bytes:
        return _key("P", self.group, self.tp[0], str(self.tp[1]), str(self.chunk))


@dataclass(frozen=True, slots=True)
class ResetMarker:
    """Positions `slots` of `tp` were reset to `position`: what the log held of those
    slots before this record is superseded."""

    group: str
    tp: TopicPartition
    slots: RangeSet
    position: Position
    epoch: int = 0

    @property
    def key(self) -> bytes:
        return reset_key(self.group, self.tp)

    def positions(self) -> RangePositionMap:
        """The reset's slots at its position, every other slot at offset 0 (which a union
        leaves as it is)."""
        pmap = RangePositionMap()
        pmap.update((slots, self.position) for slots in self.slots)
        return pmap


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A member as the coordinator last made it durable: enough to re-create it when it
    re-registers with a matching claim after a failover."""

    group: str
    member_id: str
    name: str
    capacity: int
    session_timeout_ms: int
    member_epoch: int
    owned: RangeSet
    topics: tuple[str, ...]
    fixed_ranges: RangeSet | None = None
    epoch: int = 0  # the coordinator epoch that wrote it
    # Who it authenticated as: only that principal may adopt its claim. A record without
    # one (written before principals existed) is anonymous.
    principal: str = ANONYMOUS_PRINCIPAL

    @property
    def key(self) -> bytes:
        return member_key(self.group, self.member_id)


@dataclass(frozen=True, slots=True)
class TopicsRecord:
    """What a group reads: its topics (what its pattern matched, with one), how many
    partitions each has, and the topics in transition."""

    group: str
    topics: tuple[str, ...]
    counts: tuple[tuple[str, int], ...]
    topic_pattern: str | None = None
    transitions: tuple[Transition, ...] = ()
    epoch: int = 0

    @property
    def key(self) -> bytes:
        return topics_key(self.group)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    group: str
    entry: AuditEntry
    epoch: int = 0

    @property
    def key(self) -> bytes:
        return audit_key(self.group, self.entry.seq)


@dataclass(frozen=True, slots=True)
class EpochMarker:
    partition: int
    epoch: int
    replica_id: str
    address: str
    admin_url: str
    # Written by the owner when it hands the partition over: nobody holds it now, and
    # the next owner may claim it at once.
    released: bool = False
    # The placement version the claim acted on (coordinator.replication): a holder keeps
    # its partition until a newer placement moves it.
    placement_version: int = 0

    @property
    def key(self) -> bytes:
        return _key("E", str(self.partition))


@dataclass(frozen=True, slots=True)
class ReplicaBeat:
    replica_id: str
    address: str
    admin_url: str
    sent_at_ms: int  # the writer's wall clock: only for display, liveness uses log order
    # Its last beat: it is shutting down and has handed its partitions over; the others
    # need not wait for its beats to stop.
    leaving: bool = False
    # The version of the placement it acts on (coordinator.replication): a replica with
    # a newer one does not take partitions from it before it had a chance to hand over.
    placement_version: int = 0

    @property
    def key(self) -> bytes:
        return _key("H", self.replica_id)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A deleted key (a member that left, a chunk a shorter write no longer needs)."""

    key: bytes


StateRecord = (
    PositionsChunk
    | ResetMarker
    | MemberRecord
    | TopicsRecord
    | AuditRecord
    | EpochMarker
    | ReplicaBeat
    | Tombstone
)


def _key(kind: str, *parts: str) -> bytes:
    return SEP.join((kind, *parts)).encode()


def member_key(group: str, member_id: str) -> bytes:
    return _key("M", group, member_id)


def topics_key(group: str) -> bytes:
    return _key("T", group)


def audit_key(group: str, seq: int) -> bytes:
    """Where the trail's entry `seq` is stored: the slot of the one `MAX_AUDIT_HISTORY`
    entries before it, which it supersedes."""
    return _key("A", group, str(seq % MAX_AUDIT_HISTORY))


def chunk_key(group: str, tp: TopicPartition, chunk: int) -> bytes:
    return _key("P", group, tp[0], str(tp[1]), str(chunk))


def reset_key(group: str, tp: TopicPartition) -> bytes:
    return _key("R", group, tp[0], str(tp[1]))


# ---- encoding -------------------------------------------------------------------------


def _ranges(ranges: RangeSet | None) -> list[list[int]] | None:
    return None if ranges is None else [list(pair) for pair in ranges.to_pairs()]


def encode(record: StateRecord) -> bytes | None:
    """The record's value (None: a tombstone)."""
    body: dict[str, Any]
    match record:
        case Tombstone():
            return None
        case PositionsChunk():
            raise RecordError("positions are encoded in chunks: use encode_positions")
        case ResetMarker():
            body = {
                "kind": "reset", "group": record.group, "topic": record.tp[0],
                "partition": record.tp[1], "slots": _ranges(record.slots),
                "position": record.position.to_json(),
            }  # fmt: skip
        case MemberRecord():
            body = {
                "kind": "member", "group": record.group, "member_id": record.member_id,
                "name": record.name, "capacity": record.capacity,
                "session_timeout_ms": record.session_timeout_ms,
                "member_epoch": record.member_epoch, "owned": _ranges(record.owned),
                "topics": list(record.topics), "fixed_ranges": _ranges(record.fixed_ranges),
                "principal": record.principal,
            }  # fmt: skip
        case TopicsRecord():
            body = {
                "kind": "topics", "group": record.group, "topics": list(record.topics),
                "counts": [list(c) for c in record.counts],
                "topic_pattern": record.topic_pattern,
                "transitions": [_transition(t) for t in record.transitions],
            }  # fmt: skip
        case AuditRecord(group, entry):
            body = {
                "kind": "audit", "group": group, "seq": entry.seq, "at_ms": entry.at_ms,
                "principal": entry.principal, "action": entry.action, "detail": entry.detail,
            }  # fmt: skip
        case EpochMarker():
            body = {
                "kind": "epoch", "partition": record.partition, "replica_id": record.replica_id,
                "address": record.address, "admin_url": record.admin_url,
                "released": record.released, "placement_version": record.placement_version,
            }  # fmt: skip
        case ReplicaBeat():
            body = {
                "kind": "beat", "replica_id": record.replica_id, "address": record.address,
                "admin_url": record.admin_url, "sent_at_ms": record.sent_at_ms,
                "leaving": record.leaving, "placement_version": record.placement_version,
            }  # fmt: skip
    epoch = getattr(record, "epoch", 0)
    return _dump({"v": FORMAT_VERSION, "epoch": epoch, **body})


def encode_positions(
    group: str, tp: TopicPartition, pmap: RangePositionMap, epoch: int,
    max_bytes: int = MAX_RECORD_BYTES,
) -> list[tuple[bytes, bytes]]:  # fmt: skip
    """(key, value) per chunk of the map, each value at most about `max_bytes` (a single
    segment larger than that still gets a chunk of its own)."""
    head = {"v": FORMAT_VERSION, "epoch": epoch, "kind": "positions", "group": group,
            "topic": tp[0], "partition": tp[1]}  # fmt: skip
    overhead = len(_dump(head)) + 32
    chunks: list[list[Any]] = [[]]
    size = overhead
    for segment in pmap.to_json():
        length = len(_dump(segment)) + 1
        if chunks[-1] and size + length > max_bytes:
            chunks.append([])
            size = overhead
        chunks[-1].append(segment)
        size += length
    return [
        (chunk_key(group, tp, i), _dump({**head, "chunk": i, "positions": chunk}))
        for i, chunk in enumerate(chunks)
    ]


#: Epochs are int64 for every reader; a record above is not one of ours.
MAX_EPOCH = 2**63 - 1


def decode(key: bytes, value: bytes | None) -> StateRecord:
    """The record a key and value say; a `RecordError` (or another ValueError, KeyError
    or TypeError) when they are not one this version wrote."""
    if value is None:
        return Tombstone(key)
    data: Any = json.loads(value)
    if not isinstance(data, dict):
        raise RecordError(f"a state record is a JSON object, not {type(data).__name__}")
    if data.get("v") != FORMAT_VERSION:
        raise RecordError(f"state record of unknown format version {data.get('v')!r}")
    epoch = data.get("epoch", 0)
    if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH:
        raise RecordError("state record whose epoch is not an int64 >= 0")
    kind = data.get("kind")
    if kind == "positions":
        tp = (str(data["topic"]), int(data["partition"]))
        pmap = RangePositionMap.from_json(data["positions"])
        return PositionsChunk(str(data["group"]), tp, int(data["chunk"]), pmap, epoch)
    if kind == "reset":
        return ResetMarker(
            group=str(data["group"]),
            tp=(str(data["topic"]), int(data["partition"])),
            slots=RangeSet.from_pairs(tuple(p) for p in data["slots"]),
            position=Position.from_json(data["position"]),
            epoch=epoch,
        )
    if kind == "member":
        fixed = data.get("fixed_ranges")
        return MemberRecord(
            group=str(data["group"]),
            member_id=str(data["member_id"]),
            name=str(data["name"]),
            capacity=int(data["capacity"]),
            session_timeout_ms=int(data["session_timeout_ms"]),
            member_epoch=int(data["member_epoch"]),
            owned=RangeSet.from_pairs(tuple(p) for p in data["owned"]),
            topics=tuple(str(t) for t in data["topics"]),
            fixed_ranges=None if fixed is None else RangeSet.from_pairs(tuple(p) for p in fixed),
            epoch=epoch,
            principal=str(data.get("principal", ANONYMOUS_PRINCIPAL)),
        )
    if kind == "topics":
        return TopicsRecord(
            group=str(data["group"]),
            topics=tuple(str(t) for t in data["topics"]),
            counts=tuple((str(t), int(n)) for t, n in data["counts"]),
            topic_pattern=None if data.get("topic_pattern") is None else str(data["topic_pattern"]),
            transitions=tuple(_read_transition(t) for t in data.get("transitions", [])),
            epoch=epoch,
        )
    if kind == "audit":
        entry = AuditEntry(
            int(data["at_ms"]), str(data["principal"]), str(data["action"]),
            str(data["detail"]), int(data["seq"]),
        )  # fmt: skip
        return AuditRecord(str(data["group"]), entry, epoch)
    if kind == "epoch":
        return EpochMarker(
            int(data["partition"]), epoch, str(data["replica_id"]), str(data["address"]),
            str(data["admin_url"]), bool(data.get("released", False)),
            int(data.get("placement_version", 0)),
        )  # fmt: skip
    if kind == "beat":
        return ReplicaBeat(
            str(data["replica_id"]), str(data["address"]), str(data["admin_url"]),
            int(data["sent_at_ms"]), bool(data.get("leaving", False)),
            int(data.get("placement_version", 0)),
        )  # fmt: skip
    raise RecordError(f"state record of unknown kind {kind!r}")


def _transition(t: Transition) -> dict[str, Any]:
    fence = None if t.fence is None else [list(pair) for pair in t.fence]
    return {"topic": t.topic, "counts": list(t.counts), "seen_at_ms": t.seen_at_ms,
            "until_ms": t.until_ms, "fence": fence}  # fmt: skip


def _read_transition(data: dict[str, Any]) -> Transition:
    fence = data.get("fence")
    return Transition(
        str(data["topic"]), tuple(int(n) for n in data["counts"]), int(data["seen_at_ms"]),
        int(data["until_ms"]),
        None if fence is None else tuple((int(p), int(o)) for p, o in fence),
    )  # fmt: skip


def _dump(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def merge_into(
    target: RangePositionMap, part: RangePositionMap, within: RangeSet | None = None
) -> None:
    """`target` |= `part`, slot by slot (see the module docstring for why a union), or
    only the slots `within`."""
    for slots, position in part.segments(within):
        target.update(
            (piece, old.union(position)) for piece, old in target.segments(RangeSet((slots,)))
        )
