"""Which coordinator replica owns which state partition: pure functions, no I/O.

The replicas are members of a Kafka consumer group on the state topic; its leader runs
`assign` (as Kafka's own group leader runs a partition assignor) and every replica gets
the whole answer back. Between rebalances, a replica whose heartbeats stop has its
partitions taken over at once by the survivors (`take_orphans`), each computing the same
answer from the same view, so a `kill -9` does not wait for Kafka's session timeout.
When Kafka's rebalance follows, `assign` keeps those takeovers where they are (sticky),
so the two paths agree. Where views differ for a moment, the state partition's
coordinator epoch decides: a takeover raises it, and the higher epoch wins (fencing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ReplicaClaim:
    """What a replica says of itself when the group assigns: who it is, where consumers
    and the admin API reach it, and the partitions it holds with their epochs."""

    replica_id: str
    address: str  # consumer channel host:port
    admin_url: str
    holds: Mapping[int, int] = field(default_factory=dict)  # partition -> coordinator epoch
    version: int = 0  # of the placement it acts on now (see `next_version`)


Owners = dict[int, str]  # state partition -> replica id
#: A replica whose beats were silent this long has its partitions taken over.
DEFAULT_REPLICA_TIMEOUT_MS = 2_000


def assign(partitions: int, replicas: Iterable[ReplicaClaim]) -> Owners:
    """Every partition to one replica: sticky, then balanced.

    1. A partition stays with the replica that holds it at the highest epoch (two
       claims of one partition: the older epoch lost it to a takeover it missed).
    2. Partitions nobody holds go one by one to the replica holding the fewest.
    3. While one replica holds two more than another, one partition moves from the
       busiest to the idlest (the highest-numbered: a stable, deterministic choice).
    Ties break by replica id, so every replica computes the same answer.
    """
    claims = sorted(replicas, key=lambda r: r.replica_id)
    if not claims:
        return {}
    owner: Owners = {}
    best: dict[int, int] = {}
    for claim in claims:
        for partition, epoch in claim.holds.items():
            if 0 <= partition < partitions and epoch > best.get(partition, -1):
                best[partition] = epoch
                owner[partition] = claim.replica_id
    owner = _fill(owner, partitions, [c.replica_id for c in claims])
    return _balance(owner, [c.replica_id for c in claims])


def take_orphans(current: Owners, partitions: int, alive: Iterable[str]) -> Owners:
    """`current` with the partitions of replicas no longer alive handed to the live ones
    (fewest first), nothing else moved: the fast path between rebalances."""
    live = sorted(set(alive))
    if not live:
        return {}
    kept = {p: r for p, r in current.items() if r in live and 0 <= p < partitions}
    return _fill(kept, partitions, live)


def _counts(owner: Owners, replicas: list[str]) -> dict[str, int]:
    counts = dict.fromkeys(replicas, 0)
    for replica in owner.values():
        counts[replica] = counts.get(replica, 0) + 1
    return counts


def _fill(owner: Owners, partitions: int, replicas: list[str]) -> Owners:
    owner = dict(owner)
    counts = _counts(owner, replicas)
    for partition in range(partitions):
        if partition not in owner:
            idlest = min(replicas, key=lambda r: (counts[r], r))
            owner[partition] = idlest
            counts[idlest] += 1
    return owner


def _balance(owner: Owners, replicas: list[str]) -> Owners:
    owner = dict(owner)
    counts = _counts(owner, replicas)
    while True:
        busiest = max(replicas, key=lambda r: (counts[r], r))
        idlest = min(replicas, key=lambda r: (counts[r], r))
        if counts[busiest] - counts[idlest] < 2:
            return owner
        moved = max(p for p, r in owner.items() if r == busiest)
        owner[moved] = idlest
        counts[busiest] -= 1
        counts[idlest] += 1


def next_version(claims: Iterable[ReplicaClaim], seen: Iterable[int] = ()) -> int:
    """The version of a new placement: above every one a member acts on or was seen
    acting on, so replicas can tell a newer placement from the one they hold."""
    return max([0, *(c.version for c in claims), *seen]) + 1
