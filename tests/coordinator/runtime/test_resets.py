"""An operator's reset of positions through `operations`: what Kafka says is asked, the
reset is stored before it returns, and a replica taking the group over keeps it, also
when the write that stored it was torn."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from keyshard.coordinator.group.records import (
    MemberJoined,
    MemberRemoved,
    PositionsAdvanced,
    RangesGranted,
)
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.resets import Move, ResetTarget, ResetTargetMissing, ResetTo
from keyshard.coordinator.group.state import HandoffKind
from keyshard.coordinator.runtime import operations
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.core.model.hashing import MAX_SLOT
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.api.fake_runtime import HeldTimers
from tests.coordinator.runtime.memory import MemoryLog, serving_runtime

GROUP, TOPIC = "g", "t"
TPS = ((TOPIC, 0), (TOPIC, 1))
NOW = 50.0
HIGH = RangeSet.from_pairs([(32768, MAX_SLOT)])


class TearingLog(MemoryLog):
    """Lands only the first `keep` records of the next write, then fails it: a writer
    that crashed half-way on a broker without transactions."""

    def __init__(self) -> None:
        super().__init__(topic_partitions=len(TPS))
        self.keep: int | None = None

    async def write(
        self, partition: int, epoch: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> None:
        if self.keep is None:
            await super().write(partition, epoch, records)
            return
        await super().write(partition, epoch, records[: self.keep])
        self.keep = None
        raise ConnectionError("the coordinator died half-way through its write")


def runtime_on(log: MemoryLog) -> CoordinatorRuntime:
    runtime = serving_runtime(
        RuntimeConfig("unused:1"), log, clock=lambda: NOW, timers=HeldTimers()
    )
    runtime.writer.max_record_bytes = 200  # a map of a few segments in several chunks
    return runtime


async def group_done_to(runtime: CoordinatorRuntime, offsets: Sequence[int]) -> None:
    """The group read TPS, its member left, and every partition is done in 16 slices,
    slice i up to offsets[i]: stored."""
    state = runtime._group(GROUP)
    replay(state, MemberJoined("m", "m", 1, 6000, (TOPIC,), TPS, NOW))
    replay(state, MemberRemoved("m", HandoffKind.LEAVE, None, NOW))
    width = (MAX_SLOT + 1) // len(offsets)
    slices = tuple(
        (SlotRange(i * width, (i + 1) * width - 1), Position(offset))
        for i, offset in enumerate(offsets)
    )
    runtime.apply_records(GROUP, [PositionsAdvanced(tuple((tp, slices) for tp in TPS))])
    await runtime.writer.flush(GROUP)


async def test_a_dry_run_changes_nothing_and_execute_is_stored_and_kept_by_a_takeover() -> None:
    log = TearingLog()
    runtime = runtime_on(log)
    await group_done_to(runtime, [900] * 4)
    log.starts = {TPS[0]: 10}
    log.ends = {TPS[0]: 1000, TPS[1]: 1000}
    state = runtime.group_states()[GROUP]
    target = ResetTarget(ResetTo.OFFSET, offset=5)  # before the log start: moved into it

    moves = await operations.reset_positions(runtime, GROUP, target, topic=TOPIC, partition=0)
    assert moves == [Move(TPS[0], SlotRange(0, MAX_SLOT), 900, 10)]
    assert state.positions[TPS[0]].minimum_offset() == 900
    writes = log.writes

    await operations.reset_positions(runtime, GROUP, target, topic=TOPIC, partition=0, execute=True)
    assert state.positions[TPS[0]].minimum_offset() == 10
    assert log.writes == writes + 1  # stored before it returned

    taken_over = runtime_on(log)
    kept = taken_over.group_states()[GROUP].positions
    assert kept[TPS[0]].minimum_offset() == 10
    assert kept[TPS[1]].minimum_offset() == 900


async def test_a_torn_write_of_a_reset_still_resets_after_a_takeover() -> None:
    """Only the marker and the first rewritten chunk land: the older chunks left behind
    would undo a backward reset, but they say nothing about the slots it covers."""
    log = TearingLog()
    runtime = runtime_on(log)
    await group_done_to(runtime, [900 + i for i in range(16)])
    assert log.images[0].chunk_count(GROUP, TPS[0]) > 2
    log.keep = 2  # the marker, and the first chunk of the rewritten map
    with pytest.raises(ConnectionError):
        await operations.reset_positions(
            runtime, GROUP, ResetTarget(ResetTo.EARLIEST), topic=TOPIC, partition=0,
            slots=HIGH, execute=True,
        )  # fmt: skip

    kept = runtime_on(log).group_states()[GROUP].positions[TPS[0]]
    assert kept.get(MAX_SLOT) == Position(0)
    assert kept.get(32768) == Position(0)
    assert kept.get(0) == Position(900)
    assert kept.get(32767) == Position(907)


async def test_to_a_time_to_the_end_and_to_the_committed_offsets() -> None:
    log = TearingLog()
    runtime = runtime_on(log)
    await group_done_to(runtime, [900])
    log.ends = {TPS[0]: 1000, TPS[1]: 1200}
    log.at_times = {TPS[0]: 300}  # (t, 1) has no record that late: its end

    async def dry(target: ResetTarget) -> dict[tuple[str, int], int]:
        moves = await operations.reset_positions(runtime, GROUP, target)
        return {m.tp: m.after for m in moves}

    assert await dry(ResetTarget(ResetTo.DATETIME, timestamp_ms=1)) == {TPS[0]: 300, TPS[1]: 1200}
    assert await dry(ResetTarget(ResetTo.LATEST)) == {TPS[0]: 1000, TPS[1]: 1200}
    with pytest.raises(ResetTargetMissing, match="no Kafka offset committed under 'g' for t:1"):
        log.committed = {TPS[0]: 700}
        await dry(ResetTarget(ResetTo.COMMITTED))
    log.committed = {TPS[0]: 700, TPS[1]: 5000}  # past the end: the end
    assert await dry(ResetTarget(ResetTo.COMMITTED)) == {TPS[0]: 700, TPS[1]: 1200}


async def test_refused_while_a_member_owns_the_slots() -> None:
    log = TearingLog()
    runtime = runtime_on(log)
    await group_done_to(runtime, [900])
    state = runtime._group(GROUP)
    replay(state, MemberJoined("live", "live", 1, 6000, (TOPIC,), TPS, NOW))
    replay(state, RangesGranted("live", HIGH, 1, NOW))
    with pytest.raises(operations.ResetRefusedError, match="live") as refused:
        await operations.reset_positions(runtime, GROUP, ResetTarget(ResetTo.EARLIEST))
    assert refused.value.owners == {"live": HIGH}
    low = RangeSet.from_pairs([(0, 32767)])
    moves = await operations.reset_positions(
        runtime, GROUP, ResetTarget(ResetTo.EARLIEST), slots=low, execute=True
    )
    assert {m.tp for m in moves} == set(TPS)
    assert state.positions[TPS[0]].get(0) == Position(0)
    assert state.positions[TPS[0]].get(MAX_SLOT) == Position(900)
