"""Topics that change under a group: partitions added, topics created that match its
pattern, topics deleted. Pure, like `coordinator.group.handlers`: the runtime's
partition watcher (`coordinator.runtime.partition_watch`) reads the cluster and calls
these with what it found; the records are replayed and logged like any other.

Added partitions start from their first offset, whatever `auto_offset_reset` says: every
record in them came after the group started. Members take them up without registering
again: each one running ranges gets an *extension*, a StartFetcher of the ranges it
already runs with the positions of the added partitions only, which starts those ranges
there and nowhere else (no grant, no epoch change, no handoff). Slots draining or free get
the added partitions with their next grant, which lists the group's partitions as of then.

A topic that grows moves keys: a keyed producer partitions by `hash % count`, and until
its next metadata refresh it still writes by the old count. So a grown topic is *in
transition* (`Transition`) while records written by the old count may still arrive, and
members admit its records in timestamp order meanwhile (docs/protocol.md §9.5).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace

from keyshard.coordinator.group.effects import Result, SendStart
from keyshard.coordinator.group.records import PartitionsChanged, TransitionsChanged
from keyshard.coordinator.group.state import GroupState, Member, Transition
from keyshard.core.model.positions import TopicPartition

#: How long after a growth was seen records written by the old count may still arrive:
#: Kafka producers refresh their metadata every `metadata.max.age.ms` (5 minutes).
DEFAULT_GROWTH_WINDOW_MS = 300_000


def counts_of(partitions: Iterable[TopicPartition]) -> dict[str, int]:
    """Partitions per topic, from a group's partitions (always 0..n-1 of each topic)."""
    counts: dict[str, int] = {}
    for topic, partition in partitions:
        counts[topic] = max(counts.get(topic, 0), partition + 1)
    return counts


def partitions_of(counts: Mapping[str, int]) -> tuple[TopicPartition, ...]:
    return tuple((topic, p) for topic in sorted(counts) for p in range(counts[topic]))


def partitions_changed(
    state: GroupState, counts: Mapping[str, int], *, now: float, wall_ms: int, window_ms: int
) -> Result:
    """The cluster has `counts` (topic -> partitions) for the group's topics now.

    1. Nothing differs: nothing.
    2. A topic grew: its added partitions join the group (from their first offset: no
       position map exists for them, which reads as every slot at 0), and a transition
       starts, until `wall_ms + window_ms`; a transition under way goes on through the
       new count, to the new end.
    3. A topic new to the group (created, and matching its pattern) joins whole, with no
       transition: none of its keys were anywhere else.
    4. A topic gone, or with fewer partitions (deleted, and perhaps created again): those
       partitions leave the group, positions and all.
    5. Every member running ranges gets them on the added partitions and is told which
       partitions left (an extension, see the module docstring).
    """
    old = counts_of(state.partitions)
    if dict(counts) == old:
        return Result()
    transitions = {t: tr for t, tr in state.transitions.items() if t in counts}
    for topic, count in counts.items():
        before = old.get(topic)
        if before is None or count == before:
            continue
        if count < before:
            transitions.pop(topic, None)
            continue
        prior = transitions.get(topic)
        chain = (*prior.counts, count) if prior is not None else (before, count)
        transitions[topic] = Transition(topic, chain, wall_ms, wall_ms + window_ms)
    partitions = partitions_of(counts)
    record = PartitionsChanged(
        tuple(sorted(counts)), partitions, tuple(sorted(transitions.values())), now,
        state.topic_pattern,
    )  # fmt: skip
    known = set(state.partitions)
    added = [tp for tp in partitions if tp not in known]
    kept = set(partitions)
    dropped = tuple(tp for tp in state.partitions if tp not in kept)
    effects = [
        effect
        for member in sorted(state.members.values(), key=lambda m: m.member_id)
        if (effect := _extension(state, member, added, dropped)) is not None
    ]
    return Result(records=[record], effects=list(effects))


def extend_member(state: GroupState, member_id: str, runs: Collection[TopicPartition]) -> Result:
    """A member adopted with a claim runs `runs`: the partitions the group has that it
    does not run get an extension, and those it runs that the group no longer has are
    dropped (they changed while it was looking for its coordinator)."""
    member = state.members.get(member_id)
    if member is None:
        return Result()
    added = [tp for tp in state.partitions if tp not in runs]
    known = set(state.partitions)
    dropped = tuple(sorted(tp for tp in runs if tp not in known))
    effect = _extension(state, member, added, dropped)
    return Result(effects=[] if effect is None else [effect])


def _extension(
    state: GroupState,
    member: Member,
    added: list[TopicPartition],
    dropped: tuple[TopicPartition, ...],
) -> SendStart | None:
    running = member.owned - member.draining
    if not running or not (added or dropped):
        return None
    positions = {tp: state.position_map(tp).segments(running) for tp in added}
    return SendStart(
        member.member_id, running, member.epoch, positions, extends=True, dropped=dropped
    )


def transitions_due(
    state: GroupState, *, wall_ms: int, ends: Mapping[TopicPartition, int]
) -> Result:
    """Move transitions on with the partition ends read at or after `wall_ms`.

    A transition past its `until_ms` takes those ends as its fence (records written by
    the old count are all below them, but for clock skew); once the group's positions
    are past the fence in every slot of every partition of the topic, it ends: no member
    can meet such a record again, whichever ranges it is given later.
    """
    kept: list[Transition] = []
    changed = False
    for transition in sorted(state.transitions.values()):
        if transition.fence is None:
            tps = [(transition.topic, p) for p in range(transition.counts[-1])]
            if wall_ms >= transition.until_ms and all(tp in ends for tp in tps):
                fence = tuple((tp[1], ends[tp]) for tp in tps)
                transition = replace(transition, fence=fence)
                changed = True
            kept.append(transition)
        elif all(
            state.position_map((transition.topic, p)).minimum_offset() >= end
            for p, end in transition.fence
        ):
            changed = True
        else:
            kept.append(transition)
    return Result(records=[TransitionsChanged(tuple(kept))]) if changed else Result()


def unknown_partitions(
    state: GroupState, reported: Iterable[TopicPartition]
) -> list[TopicPartition]:
    """Partitions of the group's topics a member reported that the group does not know:
    a hint that a topic grew (only a hint: the watcher asks the cluster)."""
    known = set(state.partitions)
    topics = set(state.topics)
    return sorted({tp for tp in reported if tp[0] in topics and tp not in known})
