"""Watching the topics of the groups this replica serves: partitions added, topics created
that match a group's pattern, topics deleted, and where every partition ends.

Every `refresh_s` (and soon after a member reports a partition its group does not know,
which is only a hint: the cluster is asked) one metadata request gives every topic's
partition count; each group's topics are its names, or what its pattern matches
(`matching`), and a difference goes through `coordinator.group.growth` like any change
of a group. A topic missing, or with fewer partitions, must be seen so twice in a row
before its partitions leave the group: one metadata answer that lacks a topic (a broker
that has not caught up with the controller) must not cost a group its positions.

The partitions' ends are read too (a fetch answer checks ListOffsets, which some brokers
under-report: `keyshard.core.kafka.ends`), so lag covers a partition nobody reads yet,
and a transition past its window takes them as its fence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from keyshard.coordinator.group import growth
from keyshard.coordinator.group.effects import Result
from keyshard.coordinator.group.records import EndsObserved
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.subscription import grown_before_join, matching
from keyshard.coordinator.runtime.timers import Clock
from keyshard.coordinator.storage.base import ClusterMetadata

log = logging.getLogger(__name__)
#: A hint from a member refreshes at most this often (every member of a group reports the
#: same partitions).
MIN_GAP_S = 1.0
#: Refreshes in a row a topic must be missing (or short of partitions) before it counts.
CONFIRMATIONS = 2


class PartitionWatcher:
    def __init__(
        self,
        groups: Mapping[str, GroupState],
        metadata: ClusterMetadata,
        run: Callable[[str, Result], None],
        owner_of: Callable[[str], object | None],
        clock: Clock,
        wall_clock: Callable[[], float],
        config: RuntimeConfig,
    ) -> None:
        self._groups = groups
        self._metadata = metadata
        self._run = run  # the runtime's apply path: replay, reconcile, effects
        self._owner_of = owner_of  # None: this replica does not serve the group (now)
        self._clock = clock
        self._wall_clock = wall_clock  # record timestamps are wall-clock ms
        self.refresh_s = config.metadata_refresh_ms / 1000
        self.window_ms = config.partition_growth_window_ms
        self._hinted = asyncio.Event()
        # (group, topic) -> refreshes in a row it was missing or short of partitions.
        self._doubts: dict[tuple[str, str], int] = {}

    def hint(self) -> None:
        """A member reported a partition its group does not know: refresh soon."""
        self._hinted.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hinted.wait(), self.refresh_s)
            self._hinted.clear()
            try:
                await self.refresh()
            except Exception as err:
                log.warning("partition watch: could not read the cluster's topics: %s", err)
            await asyncio.sleep(MIN_GAP_S)

    async def refresh(self) -> None:
        """One look at the cluster for every group served here."""
        watched = {g: s for g, s in self._groups.items() if self._owner_of(g) and _reads(s)}
        if not watched:
            return
        counts = await self._metadata.topic_counts()
        for group, state in watched.items():
            if self._groups.get(group) is not state:
                continue  # released meanwhile
            wanted = self._confirmed(group, state, counts)
            result = growth.partitions_changed(
                state, wanted, now=self._clock(), wall_ms=self._wall_ms(),
                window_ms=self.window_ms,
            )  # fmt: skip
            if result.records:
                _log_change(group, state, wanted)
                self._run(group, result)
        wall_ms = self._wall_ms()  # before the ends are read: they are ends as of then
        # (Not those of a topic missing from the answer: their fetch would only time out.)
        partitions = sorted(
            {tp for s in watched.values() for tp in s.partitions if tp[1] < counts.get(tp[0], 0)}
        )
        if not partitions:
            return
        ends = await self._metadata.partition_ends(partitions)
        for group, state in watched.items():
            if self._groups.get(group) is not state:
                continue
            mine = tuple((tp, ends[tp]) for tp in state.partitions if tp in ends)
            result = Result(records=[EndsObserved(mine)])
            result.records += growth.transitions_due(state, wall_ms=wall_ms, ends=ends).records
            self._run(group, result)

    def _confirmed(
        self, group: str, state: GroupState, counts: Mapping[str, int]
    ) -> dict[str, int]:
        """The group's topics as `counts` has them, but a topic that is missing or shrank
        keeps its known count until that was seen `CONFIRMATIONS` times in a row."""
        if state.topic_pattern is not None:
            wanted = matching(state.topic_pattern, counts)
        else:
            wanted = {t: counts[t] for t in state.topics if t in counts}
        for topic, known in growth.counts_of(state.partitions).items():
            key = (group, topic)
            if wanted.get(topic, 0) >= known:
                self._doubts.pop(key, None)
                continue
            self._doubts[key] = self._doubts.get(key, 0) + 1
            if self._doubts[key] < CONFIRMATIONS:
                wanted[topic] = known
            else:
                del self._doubts[key]
        return wanted

    def before_join(
        self, state: GroupState, counts: Mapping[str, int], topics: tuple[str, ...],
        pattern: str | None,
    ) -> dict[str, int]:  # fmt: skip
        """A Register counted `counts`: the counts it joins with, after the growth it was
        the first to see, if any, went through (coordinator.runtime.subscription)."""
        joined, grown = grown_before_join(
            state, counts, topics, pattern, now=self._clock(), wall_ms=self._wall_ms(),
            window_ms=self.window_ms,
        )  # fmt: skip
        if grown.records:
            _log_change(state.group, state, joined)
            self._run(state.group, grown)
        return joined

    def forget(self, group: str) -> None:
        for key in [k for k in self._doubts if k[0] == group]:
            del self._doubts[key]

    def _wall_ms(self) -> int:
        return int(self._wall_clock() * 1000)


def _reads(state: GroupState) -> bool:
    """A group with something to watch: topics, or a pattern that may match some."""
    return bool(state.topics or state.topic_pattern or state.partitions)


def _log_change(group: str, state: GroupState, wanted: Mapping[str, int]) -> None:
    """One line per topic that changed: INFO for what the group gains, WARNING for what
    it loses."""
    known = growth.counts_of(state.partitions)
    for topic in sorted(set(known) | set(wanted)):
        old, new = known.get(topic), wanted.get(topic)
        if old == new:
            continue
        if old is None:
            log.info(
                "group %s: topic %s (matches %r) joins with %d partition(s), read from their "
                "first offsets", group, topic, state.topic_pattern, new,
            )  # fmt: skip
        elif new is None:
            log.warning(
                "group %s: topic %s is gone (deleted, or no longer matches): its %d "
                "partition(s) leave the group with their positions", group, topic, old,
            )  # fmt: skip
        elif new > old:
            log.info(
                "group %s: topic %s grew from %d to %d partitions; the new ones are read "
                "from their first offsets", group, topic, old, new,
            )  # fmt: skip
        else:
            log.warning(
                "group %s: topic %s has %d partitions, was %d (deleted and created "
                "again?): partitions %d..%d leave the group", group, topic, new, old, new,
                old - 1,
            )  # fmt: skip
