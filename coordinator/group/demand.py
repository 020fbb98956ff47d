"""Demand per load bucket: the work waiting, seen before anyone processes it.

Processed counts (`coordinator.group.load`) say where work went, not where it waits: a
backlog behind one member shows up only as that member's steady rate, however long it
is. But every member reading a partition examines all of its records (it filters by
slot), so the key distribution of a backlog is known from the first fetch. Each Ping
reply reports, per partition, the offsets the member examined since the last one and how
many records of each load bucket were among them (`FetchedWindow`, owned or not).

Members reading one partition see the same records, so windows are merged by offset, not
added up: per partition the group keeps the end of what it has counted (`frontier`), and
a window adds only its part past it (its counts scaled by that fraction: within one
window records are spread evenly enough for balancing). Completions (the `load` of the
same replies) lower the level of their bucket, never below zero.

Such an estimate drifts: a scaled window is a little off per bucket, a completion that
finds its bucket at zero is lost while an overestimate stays, and in steady traffic every
window straddles the frontier. So levels fade with a half-life (60 s): a real backlog is
raised again by every window that reads further into it, a wrong count fades. (Fading
also under-counts an old backlog, by a share that is the same for every bucket: 9% after
8 s; shares between members stay right, and shares are what the balance check reads.)
A departing member's buckets are forgotten (a Leave carries no completions), and a group
whose partitions are all done to their end has no backlog at all (`settle`). Records
beyond every member's fetch (a backlog longer than consumers read ahead) are taken to be
distributed like those seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from keyshard.core.model.hashing import LOAD_BUCKET_COUNT, LOAD_BUCKET_SHIFT, SLOT_COUNT
from keyshard.core.model.positions import TopicPartition
from keyshard.core.model.ranges import RangeSet

_BUCKET_WIDTH = 1 << LOAD_BUCKET_SHIFT
_REBASE_AFTER = 50.0  # rebase the scaling origin before exp() could overflow


class BucketDemand:
    """Records waiting per load bucket: a level per bucket that fetched windows raise,
    completions lower (never below zero) and time lets fade (half-life, lazily, as
    `coordinator.group.load.BucketLoad` decays rates): an estimate that nothing refreshes
    cannot linger, whatever made it wrong."""

    def __init__(self, half_life_s: float = 60.0) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self._lambda = math.log(2) / half_life_s
        self._origin: float | None = None
        self._scaled: dict[int, float] = {}  # bucket -> level x exp(lambda (t - origin))
        self._frontier: dict[TopicPartition, int] = {}
        self._checked_at = float("-inf")

    def __eq__(self, other: object) -> bool:
        """Equal levels (tests compare whole group states)."""
        return isinstance(other, BucketDemand) and self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, not hashable

    def _values(self) -> tuple[object, ...]:
        return self._lambda, self._origin, self._scaled, self._frontier

    def _scale(self, at: float) -> float:
        """exp(lambda (at - origin)), rebasing the origin before it could overflow."""
        if self._origin is None:
            self._origin = at
        if self._lambda * (at - self._origin) > _REBASE_AFTER:
            factor = math.exp(-self._lambda * (at - self._origin))
            self._scaled = {b: v * factor for b, v in self._scaled.items() if v * factor > 1e-9}
            self._origin = at
        return math.exp(self._lambda * (at - self._origin))

    def fetched(
        self,
        tp: TopicPartition,
        start: int,
        end: int,
        buckets: Iterable[tuple[int, int]],
        at: float,
    ) -> None:
        """Records examined in [start, end) of `tp`: the part past the frontier counts."""
        frontier = self._frontier.get(tp)
        if end <= start or (frontier is not None and end <= frontier):
            return
        share = 1.0 if frontier is None or start >= frontier else (end - frontier) / (end - start)
        self._frontier[tp] = end
        scale = self._scale(at) * share
        levels = self._scaled
        for bucket, count in buckets:
            if 0 <= bucket < LOAD_BUCKET_COUNT and count > 0:
                levels[bucket] = levels.get(bucket, 0.0) + count * scale

    def completed(self, buckets: Iterable[tuple[int, int]], at: float) -> None:
        """Handler completions per bucket (a level never goes below zero)."""
        scale = self._scale(at)
        levels = self._scaled
        for bucket, count in buckets:
            level = levels.get(bucket)
            if level is not None and count > 0:
                left = level - count * scale
                if left > 0:
                    levels[bucket] = left
                else:
                    del levels[bucket]

    def forget(self, buckets: Iterable[int]) -> None:
        """Nothing known waits in `buckets` any more."""
        for bucket in buckets:
            self._scaled.pop(bucket, None)

    def check_due(self, at: float) -> bool:
        """Whether to look whether the group is caught up (`settle`): only while something
        waits, and at most once a second (it reads every partition's positions)."""
        if not self._scaled or at - self._checked_at < 1.0:
            return False
        self._checked_at = at
        return True

    def settle(self) -> None:
        """Nothing waits anywhere: every partition is read and done to its end."""
        self._scaled = {}

    def waiting_in(self, buckets: Iterable[int], at: float) -> float:
        """Records waiting in `buckets` as of `at`: what `backlog` says of them, at the cost
        of those buckets only."""
        if self._origin is None or not self._scaled:
            return 0.0
        levels = self._scaled
        return math.exp(-self._lambda * (at - self._origin)) * sum(
            levels.get(bucket, 0.0) for bucket in buckets
        )

    def backlog(self, at: float) -> list[float] | None:
        """Records waiting per bucket as of `at`; None when nothing is."""
        if self._origin is None or not self._scaled:
            return None
        factor = math.exp(-self._lambda * (at - self._origin))
        waiting = [0.0] * LOAD_BUCKET_COUNT
        for bucket, level in self._scaled.items():
            waiting[bucket] = level * factor
        return waiting if sum(waiting) >= 0.5 else None


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
    backlog: Sequence[float], owned: Mapping[str, RangeSet], capacity: Mapping[str, float]
) -> float:
    """Records waiting on the member furthest above its share of the backlog (shares by
    `capacity`: declared capacity at measured speed), beyond that share: the work the
    others could be doing instead of idling at the end."""
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
