"""Demand per load bucket: the work waiting, seen before anyone processes it.

Processed counts (`coordinator.group.load`) say where work went, not where it waits: a
backlog behind one member shows up only as that member's steady rate, however long it
is. But every member reading a partition examines all of its records (it filters by
slot), so the key distribution of a backlog is known from the first fetch. Each Ping
reply reports, per partition, the offsets the member examined since the last one and how
many records of each load bucket were among them (`FetchedWindow`, owned or not).

Members reading one partition see the same records, so windows are merged by offset, not
added up: per partition the group keeps the end of what it has counted (`frontier`); a
window that starts at or past it counts, one that ends before it is already counted, and
one that straddles it is dropped (scaling its counts by the new fraction made per-bucket
errors that only ever added up: too high stayed, too low was cut by the cap below).
Dropping only ever under-counts. Completions (the `load` of the same replies) are counted
per bucket too; the backlog of a bucket is fetched minus completed.

Estimates that went wrong anyway are reset rather than left to drift: a departing
member's buckets are forgotten (`forget`: a Leave carries no completions, so its last
ones would be waiting forever), and whenever every partition of the group is caught up
the whole backlog is zero (`settle`).

What it cannot see, and why that is fine for balancing: records beyond every member's
fetch (a backlog longer than consumers read ahead) are assumed distributed like the ones
seen, which changes no member's share. After a coordinator restart counting starts
again at the consumers' cursors: records examined before it and completed after would
make a bucket's completions exceed its fetches, so completions are capped at fetches
(the surplus is dropped instead of hiding later arrivals of that bucket). A member's own
completions never precede the fetch counts of the same records (its reply carries both,
fetched applied first, or another member read them earlier), so the cap loses nothing
otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from coordinator.model.hashing import LOAD_BUCKET_COUNT, LOAD_BUCKET_SHIFT, SLOT_COUNT
from coordinator.model.positions import TopicPartition
from coordinator.model.ranges import RangeSet

_BUCKET_WIDTH = 1 << LOAD_BUCKET_SHIFT


class BucketDemand:
    def __init__(self) -> None:
        self._frontier: dict[TopicPartition, int] = {}
        self._fetched = [0.0] * LOAD_BUCKET_COUNT
        self._completed = [0.0] * LOAD_BUCKET_COUNT
        self.waiting = 0.0  # the sum of the backlog, kept as counts arrive
        self._checked_at = float("-inf")

    def __eq__(self, other: object) -> bool:
        """Equal counts (tests compare whole group states)."""
        return isinstance(other, BucketDemand) and (
            self._frontier,
            self._fetched,
            self._completed,
        ) == (other._frontier, other._fetched, other._completed)

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, not hashable

    def fetched(
        self, tp: TopicPartition, start: int, end: int, buckets: Iterable[tuple[int, int]]
    ) -> None:
        """Records examined in [start, end) of `tp`: counted if the window starts at or
        past the frontier (see the module doc)."""
        frontier = self._frontier.get(tp)
        if end <= start or (frontier is not None and end <= frontier):
            return
        self._frontier[tp] = end
        if frontier is not None and start < frontier:
            return  # straddles what is counted: its new part cannot be told apart
        for bucket, count in buckets:
            if 0 <= bucket < LOAD_BUCKET_COUNT and count > 0:
                self._fetched[bucket] += count
                self.waiting += count

    def completed(self, buckets: Iterable[tuple[int, int]]) -> None:
        """Handler completions per bucket (capped at what was fetched: see the module doc)."""
        fetched, completed = self._fetched, self._completed
        for bucket, count in buckets:
            if 0 <= bucket < LOAD_BUCKET_COUNT and count > 0:
                before = completed[bucket]
                completed[bucket] = min(before + count, fetched[bucket])
                self.waiting -= completed[bucket] - before

    def forget(self, buckets: Iterable[int]) -> None:
        """Nothing known waits in `buckets` any more."""
        for bucket in buckets:
            self.waiting -= self._fetched[bucket] - self._completed[bucket]
            self._completed[bucket] = self._fetched[bucket]

    def check_due(self, at: float) -> bool:
        """Whether to look whether the group is caught up (`settle`): only while something
        is counted as waiting, and at most once a second (it reads every partition's
        positions)."""
        if self.waiting < 0.5 or at - self._checked_at < 1.0:
            return False
        self._checked_at = at
        return True

    def settle(self) -> None:
        """Nothing waits anywhere: every partition is read and done to its end."""
        self._completed = list(self._fetched)
        self.waiting = 0.0

    def backlog(self) -> list[float] | None:
        """Records waiting per bucket; None when nothing is."""
        if self.waiting < 0.5:
            return None
        waiting = [f - c for f, c in zip(self._fetched, self._completed, strict=True)]
        return waiting if any(w > 0.5 for w in waiting) else None


def demand_profile(
    rates: Mapping[int, float], backlog: Sequence[float] | None, horizon_s: float
) -> list[float] | None:
    """Per-slot demand: the records waiting plus those expected within `horizon_s` at the
    measured rate (a bucket's demand spread evenly over its slots); None if neither is
    known. The assignor balances this: equal demand per capacity is equal time to drain."""
    if not rates and backlog is None:
        return None
    per_bucket = list(backlog) if backlog is not None else [0.0] * LOAD_BUCKET_COUNT
    for bucket, rate in rates.items():
        per_bucket[bucket] += rate * horizon_s
    load = [0.0] * SLOT_COUNT
    for bucket, weight in enumerate(per_bucket):
        if weight > 0:
            start = bucket << LOAD_BUCKET_SHIFT
            load[start : start + _BUCKET_WIDTH] = [weight / _BUCKET_WIDTH] * _BUCKET_WIDTH
    return load


def discounted(
    backlog: Sequence[float], owned: Mapping[str, RangeSet], done: Mapping[str, float]
) -> list[float] | None:
    """`backlog` less what each owner has completed since it was counted: `done[member]`
    records taken off its buckets pro rata (a bucket belongs to the owner of its middle
    slot); None when nothing is left waiting."""
    waiting = list(backlog)
    for member_id, ranges in owned.items():
        gone = done.get(member_id, 0.0)
        if gone <= 0:
            continue
        mine = buckets_of(ranges)
        total = sum(waiting[b] for b in mine)
        if total <= 0:
            continue
        keep = max(0.0, 1 - gone / total)
        for b in mine:
            waiting[b] *= keep
    return waiting if any(w > 0.5 for w in waiting) else None


def buckets_of(ranges: RangeSet) -> list[int]:
    """The load buckets whose middle slot is in `ranges`: each bucket has one owner."""
    half = _BUCKET_WIDTH // 2  # bucket b's middle slot is b * width + half
    return [
        b
        for r in ranges
        for b in range(
            (r.start + half - 1) >> LOAD_BUCKET_SHIFT, (r.end + half) >> LOAD_BUCKET_SHIFT
        )
    ]


def backlog_excess(
    backlog: Sequence[float], owned: Mapping[str, RangeSet], capacity: Mapping[str, int]
) -> float:
    """Records waiting on the member furthest above its capacity share of the backlog,
    beyond that share: the work the others could be doing instead of idling at the end."""
    total_capacity = sum(capacity.values())
    total = sum(backlog)
    if total_capacity <= 0 or total <= 0:
        return 0.0
    prefix = [0.0]
    for weight in backlog:
        prefix.append(prefix[-1] + weight)

    def upto(slot: int) -> float:  # backlog of slots [0, slot)
        bucket, within = divmod(slot, _BUCKET_WIDTH)
        partial = backlog[bucket] * within / _BUCKET_WIDTH if within else 0.0
        return prefix[bucket] + partial

    worst = 0.0
    for member_id, ranges in owned.items():
        waiting = sum(upto(r.end + 1) - upto(r.start) for r in ranges)
        fair = total * capacity.get(member_id, 1) / total_capacity
        worst = max(worst, waiting - fair)
    return worst
