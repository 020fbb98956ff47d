"""What the state writer (coordinator/runtime/durability.py) puts in the log, read back
as a replica taking the group over would (coordinator/storage/image.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.coordinator.group.records import MemberJoined, PositionsAdvanced, PositionsReset
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.durability import StateWriter
from keyshard.coordinator.storage.log_format import decode
from keyshard.core.model.positions import Position, RangePositionMap, TopicPartition
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.coordinator.runtime.memory import MemoryLog

TPS: tuple[TopicPartition, ...] = (("t", 0), ("t", 1), ("t", 2), ("u", 0))

# One step: positions of a partition move over slots [start, start + width) to an
# offset (a reset when `reset`, which may move them back), or a write of the group.
advance = st.tuples(
    st.sampled_from(TPS),
    st.integers(0, 60_000),
    st.integers(1, 5_000),
    st.integers(0, 500),
    st.booleans(),
)
steps = st.lists(st.one_of(advance, st.none()), max_size=40)


def _dropped(coroutine: Coroutine[Any, Any, Any], _name: str) -> None:
    coroutine.close()  # the low watermarks' commit: tooling only, not under test


def _writer(log: MemoryLog, state: GroupState) -> StateWriter:
    # Small records: a map of a few segments takes several chunks, so a map that shrinks
    # leaves chunks to tombstone.
    return StateWriter(
        log, log, {"g": state}, Activity(), _dropped, lambda _g: (0, 1), max_record_bytes=300
    )


class ChunkKeys(MemoryLog):
    """Records which partitions each write carried positions of."""

    def __init__(self) -> None:
        super().__init__()
        self.carried: list[set[TopicPartition]] = []

    async def write(self, partition: int, epoch: int, records: Any) -> None:
        decoded = [decode(key, value) for key, value in records]
        self.carried.append({r.tp for r in decoded if hasattr(r, "tp")})
        await super().write(partition, epoch, records)


def _stored(log: MemoryLog) -> dict[TopicPartition, RangePositionMap]:
    """The group's positions as a replica taking it over reads them from the log."""
    image = log.images[0].groups().get("g")
    return {} if image is None else image.positions


@settings(max_examples=60, deadline=None)
@given(steps)
def test_writing_only_changed_partitions_replays_to_what_writing_all_does(
    script: list[tuple[TopicPartition, int, int, int, bool] | None],
) -> None:
    """Each write carries the partitions whose positions changed since the one before;
    the log then replays to the group's positions, the same as a log every write of
    which carried every partition."""

    async def run() -> None:
        state = GroupState("g")
        replay(state, MemberJoined("m", "m", 1, 10_000, ("t", "u"), TPS, 0.0))
        changed_log, every_log = ChunkKeys(), MemoryLog()
        changed, every = _writer(changed_log, state), _writer(every_log, state)
        touched: set[TopicPartition] = set()
        for step in [*script, None]:
            if step is None:
                await changed.flush("g")
                every._positions_written.pop("g", None)  # as if nothing were stored yet
                await every.flush("g")
                if changed_log.carried:  # (no write when nothing changed)
                    assert changed_log.carried == [touched]
                    changed_log.carried.clear()
                touched = set()
                assert _stored(changed_log) == state.positions
                assert _stored(changed_log) == _stored(every_log)
                continue
            tp, start, width, offset, reset = step
            slots = SlotRange(start, min(start + width, 65_535))
            if reset:
                replay(state, PositionsReset(tp, RangeSet((slots,)), Position(offset), 0.0))
            else:
                replay(state, PositionsAdvanced(((tp, ((slots, Position(offset)),)),)))
            touched.add(tp)

    asyncio.run(run())
