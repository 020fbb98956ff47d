"""Where a new group starts, through the runtime: the partition ends are read from the
cluster once per new group, before its first grant, and stored with the group; a group
the state log already has, or one that starts at the first offsets, asks nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from keyshard.coordinator.group.state import GroupConfig, OffsetReset
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.errors import CoordinatorError
from keyshard.core.model.positions import TopicPartition
from keyshard.core.protocol.messages import ErrorCode, StartFetcherRequest
from tests.coordinator.runtime.memory import MemoryLog, serving_runtime
from tests.coordinator.runtime.test_runtime import RecordingChannel, eventually, register

LATEST = GroupConfig(auto_offset_reset=OffsetReset.LATEST)
ENDS = {("t", 0): 40, ("t", 1): 7}


class SlowEnds(MemoryLog):
    """Partition ends that wait until released, and fail while `failing` is set."""

    def __init__(self) -> None:
        super().__init__(topic_partitions=2)
        self.ends = dict(ENDS)
        self.release = asyncio.Event()
        self.failing = False
        self.reads_started = 0

    async def partition_ends(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        self.reads_started += 1
        await self.release.wait()
        if self.failing:
            raise TimeoutError("no fetch answer")
        return await super().partition_ends(partitions)


def start_offsets(channel: RecordingChannel) -> dict[TopicPartition, set[int]]:
    starts = [m for m, _ in channel.sent if isinstance(m, StartFetcherRequest)]
    return {
        (p.topic, p.partition): {r.position.next_offset for r in p.ranges}
        for start in starts
        for p in start.positions
    }


async def test_registrations_of_a_new_latest_group_share_one_read_and_start_at_the_ends() -> None:
    log = SlowEnds()
    runtime = serving_runtime(RuntimeConfig("unused:1", group_defaults=LATEST), log)
    await runtime.start()
    try:
        channels = [RecordingChannel() for _ in range(3)]
        joining = [
            asyncio.ensure_future(runtime.register(c, register(f"m{i}")))  # type: ignore[arg-type]
            for i, c in enumerate(channels)
        ]
        await eventually(lambda: log.reads_started == 1, "the first read")
        assert not runtime.group_states(), "no group before its start is known"
        assert not any(j.done() for j in joining)
        log.release.set()
        await asyncio.gather(*joining)
        assert log.ends_asked == 1, "one read for the registrations that came together"
        state = runtime.group_states()["g"]
        assert {tp: state.position_map(tp).minimum_offset() for tp in ENDS} == ENDS
        await eventually(lambda: all(start_offsets(c) for c in channels), "every member starts")
        for channel in channels:
            assert all(offsets == {ENDS[tp]} for tp, offsets in start_offsets(channel).items())
        stored = log.images[0].groups()["g"].positions
        assert {tp: pmap.minimum_offset() for tp, pmap in stored.items()} == ENDS
    finally:
        await runtime.stop()


async def test_a_failed_read_refuses_the_register_to_be_tried_again() -> None:
    log = SlowEnds()
    log.failing = True
    log.release.set()
    runtime = serving_runtime(
        RuntimeConfig("unused:1", group_offset_resets={"g": OffsetReset.LATEST}), log
    )
    await runtime.start()
    try:
        with pytest.raises(CoordinatorError) as refused:
            await runtime.register(RecordingChannel(), register("m0"))  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.INTERNAL  # not fatal: the consumer retries
        assert "latest" in refused.value.message and "g" not in runtime.group_states()
        log.failing = False
        await runtime.register(RecordingChannel(), register("m0"))  # type: ignore[arg-type]
        assert runtime.group_states()["g"].position_map(("t", 0)).minimum_offset() == 40
    finally:
        await runtime.stop()


async def test_groups_that_exist_or_start_at_the_first_offsets_ask_nothing() -> None:
    # An earliest group (the default) reads nothing, and neither does a group the log has:
    # here the latest group created first, served again by a runtime that adopted it.
    log = SlowEnds()
    log.release.set()
    settings = RuntimeConfig("unused:1", group_offset_resets={"g": OffsetReset.LATEST})
    first = serving_runtime(settings, log)
    await first.start()
    try:
        await first.register(RecordingChannel(), register("m0"))  # type: ignore[arg-type]
        other = register("m0").model_copy(update={"group": "early"})
        await first.register(RecordingChannel(), other)  # type: ignore[arg-type]
        assert log.ends_asked == 1
        assert first.group_states()["early"].position_map(("t", 0)).minimum_offset() == 0
    finally:
        await first.stop()
    log.ends = {("t", 0): 900, ("t", 1): 900}
    again = serving_runtime(settings, log)
    await again.start()
    try:
        await again.register(RecordingChannel(), register("m1"))  # type: ignore[arg-type]
        assert log.ends_asked == 1, "the adopted group is known: nothing to read"
        assert again.group_states()["g"].position_map(("t", 0)).minimum_offset() == 40
    finally:
        await again.stop()
