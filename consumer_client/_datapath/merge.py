"""Key order across a partition-count change: fetched records of a topic in transition are
admitted in timestamp order across its partitions (docs/protocol.md §9.5). Pure, no I/O.

A keyed producer writes a key to `hash % count`. When a topic grows, each producer goes on
using the old count until its next metadata refresh, so for a while the records of one
key are in two partitions, and reading the new partition at once could run a key's newer
records before its older ones still waiting in the old partition. While the coordinator
says a topic is in transition, each fetched record of it waits here until every partition
it could share a key with has been *fetched past* its timestamp (a record fetched there
with a later timestamp, or fetched up to its end), and none of their records that are as
old is still waiting; then it is admitted, in (timestamp, partition) order. A k-way merge
with a watermark, as Kafka Streams' `max.task.idle.ms`: the rule is local to each member,
which fetches every partition it runs slots of.

Which partitions a record waits for (`TopicTransition.waits_on`): when every count the
topic went through is a multiple of the one before, `hash % new` keeps a key where it was
or moves it to a partition added later, so a record waits only for the partitions that
existed before its own was added (and the first partitions' records wait for nothing);
otherwise every partition waits for every other.

The transition ends on the member once every partition it fetches has been fetched past
`until_ms`: nothing written by an old count can still arrive (within clock skew). Every
record waiting then is admitted, in order, and the topic flows through untouched again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from sortedcontainers import SortedList

from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.core.model.positions import TopicPartition

_UNKNOWN = -(2**63)  # a partition not fetched since the transition began (or a rewind)


@dataclass(frozen=True, slots=True)
class TopicTransition:
    topic: str
    counts: tuple[int, ...]  # the partition counts the topic went through, oldest first
    until_ms: int  # records up to this timestamp may still be written by an old count

    def waits_on(self, partition: int) -> range | frozenset[int]:
        """The partitions a record of `partition` may share a key with, written earlier."""
        counts = self.counts
        if all(later % earlier == 0 for earlier, later in pairwise(counts)):
            for i, count in enumerate(counts):
                if partition < count:
                    return range(counts[i - 1]) if i > 0 else range(0)
            return range(counts[-1])  # a partition it does not know: wait for all
        return frozenset(range(counts[-1])) - {partition}


@dataclass(slots=True)
class _Partition:
    # Records waiting, in fetch order: (timestamp, record, generation, session, bytes).
    queue: deque[tuple[int, Any, int | None, int, int]] = field(default_factory=deque)
    bytes: int = 0  # of the records waiting
    times: SortedList = field(default_factory=SortedList)  # their timestamps
    watermark: int = _UNKNOWN  # fetched past this timestamp
    generation: int | None = None

    def reset(self) -> None:
        self.queue.clear()
        self.bytes = 0
        self.times.clear()
        self.watermark = _UNKNOWN

    def oldest(self, partition: int) -> tuple[int, int] | None:
        return None if not self.times else (self.times[0], partition)


@dataclass(slots=True)
class _TopicMerge:
    transition: TopicTransition
    partitions: dict[int, _Partition] = field(default_factory=dict)  # those fetched


class MergeGate:
    """The fetcher feeds it what it fetched of topics in transition and dispatches what
    comes out; `held` counts against the consumer's `max_pending` and `held_bytes` in its
    memory budget (as waiting), and `waited_on` says which partitions must go on being
    fetched while either is full."""

    def __init__(self) -> None:
        self.topics: dict[str, _TopicMerge] = {}
        self.held = 0
        self.held_bytes = 0
        self.ended: list[TopicTransition] = []  # ended on this member, for the log

    # ---- what the coordinator says, and what the member fetches -----------------------

    def begin(self, transitions: Iterable[TopicTransition]) -> None:
        """Topics in transition as a StartFetcher lists them. A topic already merging
        keeps what it holds and knows under a newer transition; one that ended here
        merges again (its grant may reach back before `until_ms`)."""
        for transition in transitions:
            merge = self.topics.get(transition.topic)
            if merge is None:
                self.topics[transition.topic] = _TopicMerge(transition)
            else:
                merge.transition = transition

    def track(self, fetched: Iterable[TopicPartition]) -> list[Chunk]:
        """The partitions the member fetches now (those with a grant): a record waits only
        for partitions it fetches. One no longer fetched lets go of what it held (its
        records would be skipped anyway)."""
        wanted: dict[str, set[int]] = {}
        for topic, partition in fetched:
            wanted.setdefault(topic, set()).add(partition)
        for topic, merge in self.topics.items():
            mine = wanted.get(topic, set())
            for partition in [p for p in merge.partitions if p not in mine]:
                self._let_go(merge.partitions.pop(partition))
            for partition in mine - merge.partitions.keys():
                merge.partitions[partition] = _Partition()
        return self._admit_all()

    def rewound(self, tp: TopicPartition) -> None:
        """The fetcher seeks `tp` back: what it held of it will be fetched again."""
        merge = self.topics.get(tp[0])
        part = merge.partitions.get(tp[1]) if merge is not None else None
        if part is not None:
            self._let_go(part)

    def waiting_on(self, rewound: Iterable[TopicPartition]) -> set[TopicPartition]:
        """The partitions fetched here whose records wait on one of `rewound`: what they
        let out was measured against a watermark the rewind took back."""
        out: set[TopicPartition] = set()
        for topic, partition in rewound:
            merge = self.topics.get(topic)
            if merge is None:
                continue
            for other in merge.partitions:
                if other != partition and partition in merge.transition.waits_on(other):
                    out.add((topic, other))
        return out

    def clear(self) -> None:
        """The session is lost: nothing held is ours any more."""
        self.topics.clear()
        self.held = self.held_bytes = 0

    def _let_go(self, part: _Partition) -> None:
        self.held -= len(part.queue)
        self.held_bytes -= part.bytes
        part.reset()

    # ---- records --------------------------------------------------------------------

    def merging(self, topic: str) -> bool:
        return topic in self.topics

    def holding(self, tp: TopicPartition) -> bool:
        merge = self.topics.get(tp[0])
        part = merge.partitions.get(tp[1]) if merge is not None else None
        return part is not None and bool(part.queue)

    def feed(self, chunk: Chunk) -> list[Chunk]:
        """Fetched records of `chunk.tp`: the chunks that may be dispatched now, in
        order (the records of a topic not in transition, at once and whole)."""
        merge = self.topics.get(chunk.tp[0])
        part = merge.partitions.get(chunk.tp[1]) if merge is not None else None
        if merge is None or part is None:
            return [chunk]
        if chunk.generation is not None and chunk.generation != part.generation:
            if part.generation is not None and chunk.generation < part.generation:
                return [chunk]  # fetched before a rewind: the dispatcher fetches it again
            self._let_go(part)
            part.generation = chunk.generation
        # Each record carries an even share of the chunk's bytes: exact enough for the
        # budget, and no record is measured twice.
        share = chunk.size // len(chunk.records) if chunk.records else 0
        for record in chunk.records:
            timestamp = int(record.timestamp)
            part.queue.append((timestamp, record, chunk.generation, chunk.session, share))
            part.times.add(timestamp)
            part.watermark = max(part.watermark, timestamp)
        self.held += len(chunk.records)
        part.bytes += share * len(chunk.records)
        self.held_bytes += share * len(chunk.records)
        return self._admit_all()

    def caught_up(self, tp: TopicPartition, now_ms: int) -> list[Chunk]:
        """`tp` was fetched up to its end at `now_ms`: whatever is written to it later
        carries a later timestamp (within clock skew)."""
        merge = self.topics.get(tp[0])
        part = merge.partitions.get(tp[1]) if merge is not None else None
        if part is None or part.watermark >= now_ms:
            return []
        part.watermark = now_ms
        return self._admit_all()

    def waited_on(self) -> set[TopicPartition]:
        """Partitions whose fetching a waiting record needs (the others may pause)."""
        waited: set[TopicPartition] = set()
        for topic, merge in self.topics.items():
            for partition, part in merge.partitions.items():
                if not part.queue:
                    continue
                timestamp = part.queue[0][0]
                for other in merge.transition.waits_on(partition):
                    theirs = merge.partitions.get(other)
                    if theirs is not None and theirs.watermark <= timestamp:
                        waited.add((topic, other))
        return waited

    # ---- admission ------------------------------------------------------------------

    def _admit_all(self) -> list[Chunk]:
        out: list[Chunk] = []
        for topic in list(self.topics):
            merge = self.topics[topic]
            out += self._admit(merge)
            parts = merge.partitions.values()
            if parts and all(p.watermark > merge.transition.until_ms for p in parts):
                out += self._flush(merge)
                del self.topics[topic]
                self.ended.append(merge.transition)
        return out

    def _admit(self, merge: _TopicMerge) -> list[Chunk]:
        """Admit heads, smallest (timestamp, partition) first, while one is admissible."""
        out: list[Chunk] = []
        while True:
            best: tuple[int, int] | None = None
            for partition, part in merge.partitions.items():
                if part.queue and self._admissible(merge, partition, part.queue[0][0]):
                    key = (part.queue[0][0], partition)
                    if best is None or key < best:
                        best = key
            if best is None:
                return out
            self._take(merge, best[1], out)

    def _admissible(self, merge: _TopicMerge, partition: int, timestamp: int) -> bool:
        key = (timestamp, partition)
        for other in merge.transition.waits_on(partition):
            theirs = merge.partitions.get(other)
            if theirs is None:
                continue  # not fetched by this member: none of its records are ours
            if theirs.watermark <= timestamp:
                return False
            oldest = theirs.oldest(other)
            if oldest is not None and oldest < key:
                return False
        return True

    def _flush(self, merge: _TopicMerge) -> list[Chunk]:
        """Everything held, in (timestamp, partition) order, heads first."""
        out: list[Chunk] = []
        while True:
            heads = [(p.queue[0][0], n) for n, p in merge.partitions.items() if p.queue]
            if not heads:
                return out
            self._take(merge, min(heads)[1], out)

    def _take(self, merge: _TopicMerge, partition: int, out: list[Chunk]) -> None:
        part = merge.partitions[partition]
        timestamp, record, generation, session, size = part.queue.popleft()
        part.times.remove(timestamp)
        self.held -= 1
        part.bytes -= size
        self.held_bytes -= size
        tp = (merge.transition.topic, partition)
        last = out[-1] if out else None
        if last is not None and (last.tp, last.generation, last.session) == (
            tp,
            generation,
            session,
        ):
            last.records.append(record)
            last.size += size
        else:
            out.append(Chunk(tp, generation, session, [record], size=size))
