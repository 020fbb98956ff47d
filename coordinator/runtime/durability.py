"""Making a group durable: group commit of its positions and members to the state log.

A StartFetcher may leave only once the positions it carries *and* the grant itself (the
member's record: what it owns, at which epoch) are in the log, so a range always starts
from a stored position, and a replica taking the group over knows who runs what even if
this one dies right after. Progress is persisted periodically besides. Every caller waits
for the one write in flight, or the next one if that started before the version it needs.

A write carries the positions of the partitions that changed since the one before it
(`GroupState.position_changes`), as it carries only the members that changed: the
chunks of the others stand in the log, and a load unites every partition's latest ones.

A reset of positions (coordinator.group.resets) is written as its marker ahead of the
rewritten chunks, in the same write: whatever part of that write lands, a load sees the
reset (coordinator.storage.image). The group's audit entries not yet stored go with the
next write.

One write is one call of `StateLog.write`: a transaction on brokers that have them, under
the group's state partition's coordinator epoch, so a replica that lost the partition
cannot write it any more (`Fenced`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from keyshard.coordinator.group.growth import counts_of
from keyshard.coordinator.group.state import AuditEntry, GroupState, Member, Reset
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.storage.base import Positions
from keyshard.coordinator.storage.log_format import (
    MAX_RECORD_BYTES,
    AuditRecord,
    MemberRecord,
    ResetMarker,
    TopicsRecord,
    chunk_key,
    encode,
    encode_positions,
    member_key,
    reset_key,
)
from keyshard.core.model.positions import RangePositionMap, TopicPartition

log = logging.getLogger(__name__)
Spawn = Callable[[Coroutine[Any, Any, Any], str], None]
LogRecords = list[tuple[bytes, bytes | None]]


class LogWriter(Protocol):
    async def write(self, partition: int, epoch: int, records: LogRecords) -> None: ...


class OffsetCommitter(Protocol):
    async def commit_low_watermarks(self, group: str, positions: Positions) -> None: ...


class NotOwned(RuntimeError):
    """The group's state partition is not this replica's (any more): nothing to write."""


class StateWriter:
    def __init__(
        self,
        log_writer: LogWriter,
        committer: OffsetCommitter,
        groups: Mapping[str, GroupState],
        activity: Activity,
        spawn: Spawn,
        owner_of: Callable[[str], tuple[int, int] | None],
        max_record_bytes: int = MAX_RECORD_BYTES,
        write_failed: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.log = log_writer
        self.committer = committer
        self.groups = groups
        self.activity = activity
        self.spawn = spawn
        self.owner_of = owner_of  # group -> (state partition, coordinator epoch) if ours
        self.max_record_bytes = max_record_bytes
        self.write_failed = write_failed  # a periodic flush was refused (fenced, say)
        self.flushed: dict[str, int] = {}  # per group: log_version known stored
        self.writes: dict[str, asyncio.Task[None]] = {}  # per group: the write in flight
        self.waiting = 0  # callers waiting for a write (a gauge for the activity line)
        self._positions_written: dict[str, int] = {}  # positions_version last written
        self._records: dict[str, set[str]] = {}  # members with a live record, per group
        self._chunks: dict[tuple[str, TopicPartition], int] = {}  # chunks live in the log
        self._topics_written: dict[str, int] = {}  # topology_version last written
        self._resets: dict[tuple[str, TopicPartition], Reset] = {}  # markers written
        self._audit_written: dict[str, int] = {}  # per group: next_audit_seq stored

    def adopted(
        self,
        group: str,
        state: GroupState,
        members: set[str],
        chunks: Mapping[TopicPartition, int],
    ) -> None:
        """The group as just loaded from the log is stored already: its version, the
        members that have a record there, and how many chunks each partition's map has."""
        self.flushed[group] = state.log_version
        self._positions_written[group] = state.positions_version
        self._topics_written[group] = state.topology_version
        self._audit_written[group] = state.next_audit_seq
        self._records[group] = set(members)
        for tp, count in chunks.items():
            self._chunks[(group, tp)] = count

    def forget(self, group: str) -> None:
        """The group left this replica (handed over, or fenced). A write of it still in
        flight stays that group's: if the partition comes back, the group adopted then
        starts writes of its own (see `flush`)."""
        self.writes.pop(group, None)
        self.flushed.pop(group, None)
        self._positions_written.pop(group, None)
        self._records.pop(group, None)
        self._topics_written.pop(group, None)
        self._audit_written.pop(group, None)
        for key in [k for k in self._chunks if k[0] == group]:
            del self._chunks[key]
        for key in [k for k in self._resets if k[0] == group]:
            del self._resets[key]

    async def flush(self, group: str, needed: int | None = None) -> None:
        """Make the group as of this call (or version `needed`) durable (group commit).

        Callers waiting while a write is in flight are all served by the next one: each
        needs the version it saw on arrival, not the newest, or a burst of StartFetchers
        would each wait for a write of its own while pings keep moving positions on.
        They wait on the write itself, not in a lock's queue: thousands of waiters then
        resume in one loop turn when it lands instead of one per turn (a convoy that
        would hold StartFetchers for seconds in a join storm).

        Raises NotOwned when the group is not served here, or was let go of before its
        write landed, whatever the write did: a group by this name served later (its
        partition taken back) is another state, with versions of its own, and what this
        call was asked to store never was. Returning as if stored would let a grant of
        the group that was let go of leave; passing on the old write's refusal (Fenced:
        its epoch is the old one) would make the caller let go of the new one.
        """
        state = self.groups.get(group)
        if state is None:
            raise NotOwned(f"group {group!r} is not coordinated here")
        if needed is None:
            needed = state.log_version
        self.waiting += 1
        try:
            while True:
                if self.groups.get(group) is not state:
                    raise NotOwned(f"group {group!r} was let go of before it was stored")
                if self.flushed.get(group, -1) >= needed:
                    return
                write = self.writes.get(group)
                if write is None or write.done():
                    write = self.writes[group] = asyncio.create_task(
                        self._write(group, state), name=f"flush-{group}"
                    )
                    # Its waiters see a failure; this keeps one nobody waits for from
                    # being reported as never retrieved.
                    write.add_done_callback(lambda t: t.cancelled() or t.exception())
                try:
                    await asyncio.shield(write)
                except Exception as err:
                    if self.groups.get(group) is not state:  # a refusal then is not ours
                        raise NotOwned(f"group {group!r} was let go of during its write") from err
                    raise
        finally:
            self.waiting -= 1

    async def _write(self, group: str, state: GroupState) -> None:
        owner = self.owner_of(group)
        if owner is None:
            raise NotOwned(f"group {group!r} is not coordinated here")
        partition, epoch = owner
        version, positions_version = state.log_version, state.positions_version
        topology_version, audit_seq = state.topology_version, state.next_audit_seq
        began = time.perf_counter()
        records: LogRecords = []
        chunk_counts: dict[TopicPartition, int] = {}
        snapshot: Positions = {}
        if topology_version != self._topics_written.get(group):
            records.append(_topics_record(state, epoch))
        stored = self._audit_written.get(group, 0)
        records += [
            _audit_record(group, e, epoch) for e in state.audit if stored <= e.seq < audit_seq
        ]
        positions_written = self._positions_written.get(group)
        positions_changed = positions_version != positions_written
        resets: dict[TopicPartition, Reset] = {}
        if positions_changed:
            snapshot = {tp: pmap.copy() for tp, pmap in state.positions.items()}
            resets = {
                tp: reset
                for tp, reset in state.resets.items()
                if self._resets.get((group, tp)) != reset
            }
            records += [_reset_marker(group, tp, reset, epoch) for tp, reset in resets.items()]
            for tp in _changed_since(state, positions_written):
                pmap = snapshot[tp]
                chunks = encode_positions(group, tp, pmap, epoch, self.max_record_bytes)
                records += chunks
                chunk_counts[tp] = len(chunks)
                stale = range(len(chunks), self._chunks.get((group, tp), 0))
                records += [(chunk_key(group, tp, i), None) for i in stale]
            for g, tp in [k for k in self._chunks if k[0] == group and k[1] not in snapshot]:
                # A partition that left the group: its positions go with it.
                records += [(chunk_key(g, tp, i), None) for i in range(self._chunks[(g, tp)])]
                records.append((reset_key(g, tp), None))  # a reset of it, if there was one
                chunk_counts[tp] = 0
        written = self._records.setdefault(group, set())
        since = self._written_members_version(group)
        changed = [mid for mid, v in state.member_changes.items() if v > since]
        for mid in changed:
            member = state.members.get(mid)
            if member is not None and member.owned:
                records.append(_member_record(state, member, epoch))
            elif mid in state.claims:
                continue  # its record stands: a replica may yet have to adopt it
            elif mid in written:
                records.append((member_key(group, mid), None))
        if records:
            await self.log.write(partition, epoch, records)
        if self.groups.get(group) is not state:
            # Let go of during the write (`forget` cleared what was known stored): what
            # it wrote says nothing of the group served by this name now, if any.
            raise NotOwned(f"group {group!r} was let go of during its write")
        for key, value in records:
            member_id = _member_of(key, group)
            if member_id is not None:
                (written.add if value is not None else written.discard)(member_id)
        for tp, reset in resets.items():
            self._resets[(group, tp)] = reset
        for tp, count in chunk_counts.items():
            if count:
                self._chunks[(group, tp)] = count
            else:
                self._chunks.pop((group, tp), None)
        self._positions_written[group] = positions_version
        self._topics_written[group] = topology_version
        self._audit_written[group] = max(stored, audit_seq)
        self.flushed[group] = max(self.flushed.get(group, -1), version)
        self.activity.timed("flush", time.perf_counter() - began)
        if positions_changed:
            # Every partition of the group, those nobody has a position in yet at their
            # first offset: tools then show a new partition's whole backlog as lag.
            unread = {tp: RangePositionMap() for tp in state.partitions if tp not in snapshot}
            committed = {**snapshot, **unread}
            if committed:
                self.spawn(
                    self.committer.commit_low_watermarks(group, committed), f"commit-{group}"
                )

    def _written_members_version(self, group: str) -> int:
        return self.flushed.get(group, -1)

    async def flush_all(self) -> None:
        for group in list(self.groups):
            if self.owner_of(group) is not None:
                with contextlib.suppress(NotOwned):  # let go of meanwhile: not ours to store
                    await self.flush(group)

    async def run(self, interval: float) -> None:
        """Persist progress every `interval`, or less often when a flush itself is slow
        (thousands of members: the maps are large): at most about a tenth of the time
        goes to it. A StartFetcher still waits for its positions, whatever this does."""
        took = 0.0
        while True:
            await asyncio.sleep(max(interval, 9 * took))
            began = time.perf_counter()
            for group in list(self.groups):
                if self.owner_of(group) is None:
                    continue
                try:
                    await self.flush(group)
                except NotOwned:
                    pass  # handed over meanwhile
                except Exception as err:
                    log.error("could not persist the state of group %s: %s", group, err)
                    if self.write_failed is not None:
                        self.write_failed(group, err)  # fenced: let the partition go
            took = time.perf_counter() - began


def _changed_since(state: GroupState, written: int | None) -> list[TopicPartition]:
    """The partitions whose positions changed since version `written` was stored (all
    of them when none was): the others' chunks in the log hold their positions already.
    A partition whose change is not known (positions loaded with the group) counts as
    changed, so no position is ever left out of the log."""
    if written is None:
        return list(state.positions)
    changes = state.position_changes
    return [tp for tp in state.positions if changes.get(tp, written + 1) > written]


def _topics_record(state: GroupState, epoch: int) -> tuple[bytes, bytes | None]:
    record = TopicsRecord(
        group=state.group,
        topics=state.topics,
        counts=tuple(sorted(counts_of(state.partitions).items())),
        topic_pattern=state.topic_pattern,
        transitions=tuple(sorted(state.transitions.values())),
        epoch=epoch,
    )
    return record.key, encode(record)


def _audit_record(group: str, entry: AuditEntry, epoch: int) -> tuple[bytes, bytes | None]:
    record = AuditRecord(group, entry, epoch)
    return record.key, encode(record)


def _reset_marker(
    group: str, tp: TopicPartition, reset: Reset, epoch: int
) -> tuple[bytes, bytes | None]:
    record = ResetMarker(group, tp, reset.slots, reset.position, epoch)
    return record.key, encode(record)


def _member_record(state: GroupState, member: Member, epoch: int) -> tuple[bytes, bytes | None]:
    record = MemberRecord(
        group=state.group,
        member_id=member.member_id,
        name=member.name,
        capacity=member.capacity,
        session_timeout_ms=member.session_timeout_ms,
        member_epoch=member.epoch,
        owned=member.owned,
        topics=state.topics,
        fixed_ranges=member.fixed_ranges,
        epoch=epoch,
        principal=member.principal,
    )
    return record.key, encode(record)


def _member_of(key: bytes, group: str) -> str | None:
    prefix = member_key(group, "")
    return key[len(prefix) :].decode() if key.startswith(prefix) else None
