"""One state partition as replayed from its log: what a replica taking it over starts from.

Every replica tails every partition (a hot standby), so a takeover costs only the tail it
had not read yet. Replay is in offset order with one fencing rule: after an epoch marker,
records of an older coordinator epoch are ignored (a fenced writer's, which on a broker
without transactions can still land after the takeover). Records before the marker count,
whatever their epoch: the new owner read up to its own marker before deciding anything.

A marker that does not verify (`coordinator.storage.signing`) says nothing about who
holds the partition; its epoch only keeps the next claim above it (`next_epoch`), so
epochs never go backwards when replicas start signing, since consumers refuse a
coordinator older than one they heard. A forger gains a larger number at most: an
unverified epoch above `MAX_UNVERIFIED_EPOCH` is not counted at all.

A group's positions of one topic-partition are the union of its chunks (see
`coordinator.storage.log_format`), with one exception: a chunk older than the partition's
latest `ResetMarker` says nothing about the slots that reset covers. A reset may move
positions backwards, and a chunk from before it (one a torn write left behind) would
undo it there. The marker's own positions fill those slots; chunks written after it
unite with them as usual, being the positions the group reached from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keyshard.coordinator.group.state import AuditEntry
from keyshard.coordinator.storage.log_format import (
    AuditRecord,
    EpochMarker,
    MemberRecord,
    PositionsChunk,
    ReplicaBeat,
    ResetMarker,
    StateRecord,
    Tombstone,
    TopicsRecord,
    merge_into,
)
from keyshard.core.model.positions import RangePositionMap, TopicPartition


@dataclass(slots=True)
class GroupImage:
    """A group as its durable records say: positions, the members that owned ranges,
    what it reads, and its audit trail (oldest first)."""

    positions: dict[TopicPartition, RangePositionMap] = field(default_factory=dict)
    members: dict[str, MemberRecord] = field(default_factory=dict)
    topics: TopicsRecord | None = None
    audit: list[AuditEntry] = field(default_factory=list)


#: Two billion takeovers: more than a real deployment makes, less than int64 holds.
MAX_UNVERIFIED_EPOCH = 2**31


@dataclass(slots=True)
class PartitionImage:
    partition: int
    epoch: int = 0  # the highest coordinator epoch a marker announced
    unverified_epoch: int = 0  # the highest of markers that did not verify (counted)
    owner: EpochMarker | None = None  # the latest marker: who claimed it, or released it
    next_offset: int = 0  # the next log offset to apply
    fenced_records: int = 0  # ignored: written under an epoch older than a marker's
    _chunks: dict[bytes, PositionsChunk] = field(default_factory=dict)
    _chunk_offsets: dict[bytes, int] = field(default_factory=dict)  # where each was read
    _resets: dict[bytes, tuple[int, ResetMarker]] = field(default_factory=dict)  # by offset
    _members: dict[bytes, MemberRecord] = field(default_factory=dict)
    _topics: dict[bytes, TopicsRecord] = field(default_factory=dict)
    _audit: dict[bytes, AuditRecord] = field(default_factory=dict)

    def apply(self, offset: int, record: StateRecord) -> None:
        self.next_offset = max(self.next_offset, offset + 1)
        match record:
            case EpochMarker():
                # Two replicas claiming at once both write the next epoch: the first in
                # the log has it; at an equal epoch only the holder speaks (its release).
                same_holder = self.owner is not None and self.owner.replica_id == record.replica_id
                if record.epoch > self.epoch or (record.epoch == self.epoch and same_holder):
                    self.epoch = record.epoch
                    self.owner = record
            case ReplicaBeat():
                pass  # liveness is tracked apart (coordinator.storage.kafka_log)
            case Tombstone(key):
                self._chunks.pop(key, None)
                self._chunk_offsets.pop(key, None)
                self._resets.pop(key, None)
                self._members.pop(key, None)
                self._topics.pop(key, None)
                self._audit.pop(key, None)
            case PositionsChunk() | ResetMarker() | MemberRecord() | TopicsRecord() | AuditRecord():
                if record.epoch < self.epoch:
                    self.fenced_records += 1
                    return
                if isinstance(record, PositionsChunk):
                    self._chunks[record.key] = record
                    self._chunk_offsets[record.key] = offset
                elif isinstance(record, ResetMarker):
                    self._resets[record.key] = (offset, record)
                elif isinstance(record, TopicsRecord):
                    self._topics[record.key] = record
                elif isinstance(record, AuditRecord):
                    self._audit[record.key] = record
                else:
                    self._members[record.key] = record

    def unverified(self, offset: int, epoch: int) -> None:
        """A marker at `offset` that did not verify: only its epoch is kept (see above)."""
        self.next_offset = max(self.next_offset, offset + 1)
        if epoch <= MAX_UNVERIFIED_EPOCH:
            self.unverified_epoch = max(self.unverified_epoch, epoch)

    @property
    def next_epoch(self) -> int:
        """The epoch a claim of this partition takes."""
        return max(self.epoch, self.unverified_epoch) + 1

    @property
    def holder(self) -> str | None:
        """The replica that claimed the partition last and has not released it."""
        return None if self.owner is None or self.owner.released else self.owner.replica_id

    def groups(self) -> dict[str, GroupImage]:
        """Every group with a record here: positions as the union of their chunks, each
        chunk older than its partition's reset outside the slots reset (see above), the
        members that owned ranges, and the audit trail in its order."""
        groups: dict[str, GroupImage] = {}
        resets = {(r.group, r.tp): (offset, r) for offset, r in self._resets.values()}
        for key, chunk in self._chunks.items():
            image = groups.setdefault(chunk.group, GroupImage())
            pmap = image.positions.setdefault(chunk.tp, RangePositionMap())
            reset = resets.get((chunk.group, chunk.tp))
            if reset is not None and self._chunk_offsets[key] < reset[0]:
                merge_into(pmap, chunk.positions, reset[1].slots.complement())
            else:
                merge_into(pmap, chunk.positions)
        for (group, tp), (_, reset_marker) in resets.items():
            image = groups.setdefault(group, GroupImage())
            merge_into(image.positions.setdefault(tp, RangePositionMap()), reset_marker.positions())
        for member in self._members.values():
            groups.setdefault(member.group, GroupImage()).members[member.member_id] = member
        for topics in self._topics.values():
            groups.setdefault(topics.group, GroupImage()).topics = topics
        for audit in sorted(self._audit.values(), key=lambda r: r.entry.seq):
            groups.setdefault(audit.group, GroupImage()).audit.append(audit.entry)
        return groups

    def chunk_count(self, group: str, tp: TopicPartition) -> int:
        """Chunks live for one group and partition (a shorter write tombstones the rest)."""
        live = [c.chunk for c in self._chunks.values() if c.group == group and c.tp == tp]
        return max(live, default=-1) + 1
