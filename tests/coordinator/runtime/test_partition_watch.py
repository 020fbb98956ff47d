"""The partition watcher with a fake cluster (MemoryLog.counts): growth reaches running
members as an extension, deleted topics leave after being seen gone twice, and what a
replica taking over needs is in the state log."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.state import GroupState
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.errors import CoordinatorError
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.runtime.takeover import takeover_result
from keyshard.core.protocol.messages import ErrorCode, RegisterRequest, StartFetcherRequest
from tests.coordinator.runtime.memory import MemoryLog, serving_runtime
from tests.coordinator.runtime.test_runtime import RecordingChannel, answer, eventually

CONFIG = RuntimeConfig("unused:1", metadata_refresh_ms=0)  # refreshed by hand


def register(name: str, *, topics: list[str] | None = None, pattern: str | None = None) -> Any:
    return RegisterRequest(
        correlation_id=1, group="g", topics=topics or [], topic_pattern=pattern,
        consumer_name=name, session_timeout_ms=10_000,
    )  # fmt: skip


def starts(channel: RecordingChannel) -> list[StartFetcherRequest]:
    return [m for m, _ in channel.sent if isinstance(m, StartFetcherRequest)]


async def granted(runtime: CoordinatorRuntime, log: MemoryLog, request: Any) -> RecordingChannel:
    channel = RecordingChannel()
    await runtime.register(channel, request)  # type: ignore[arg-type]
    await eventually(lambda: len(starts(channel)) == 1, "granted")
    answer(channel)
    return channel


async def test_growth_extends_running_members_and_starts_a_transition(caplog: Any) -> None:
    log = MemoryLog()
    log.topic_partitions = 2
    runtime = serving_runtime(CONFIG, log, wall_clock=lambda: 1_000.0)
    await runtime.start()
    try:
        a = await granted(runtime, log, register("a", topics=["t"]))
        log.counts["t"] = 4
        with caplog.at_level(logging.INFO):
            await runtime.watcher.refresh()
        await eventually(lambda: len(starts(a)) == 2, "the extension")
        extension = starts(a)[1]
        assert extension.member_epoch == starts(a)[0].member_epoch
        assert {(p.topic, p.partition) for p in extension.positions} == {("t", 2), ("t", 3)}
        assert [(t.topic, t.counts, t.until_ms) for t in extension.transitions] == [
            ("t", [2, 4], 1_000_000 + 300_000)
        ]
        assert "topic t grew from 2 to 4 partitions" in caplog.text
        state = runtime.group_states()["g"]
        assert len(state.partitions) == 4
        # Every partition has an end and a lag from now on (none was reported yet).
        assert set(state.high_watermarks) == set(state.partitions)
    finally:
        await runtime.stop()


async def test_a_deleted_topic_leaves_after_two_refreshes(caplog: Any) -> None:
    log = MemoryLog()
    log.counts.update({"t1": 1, "t2": 2, "__internal": 1, "other": 1})
    runtime = serving_runtime(CONFIG, log)
    await runtime.start()
    try:
        a = await granted(runtime, log, register("a", pattern="t.*|__internal"))
        state = runtime.group_states()["g"]
        assert state.topics == ("t1", "t2")  # internal topics never match
        log.counts["t3"] = 1
        await runtime.watcher.refresh()
        await eventually(lambda: len(starts(a)) == 2, "t3 joins")
        assert {(p.topic, p.partition) for p in starts(a)[1].positions} == {("t3", 0)}
        del log.counts["t2"]
        await runtime.watcher.refresh()
        assert "t2" in state.topics, "one answer without the topic is not enough"
        with caplog.at_level(logging.WARNING):
            await runtime.watcher.refresh()
        assert state.topics == ("t1", "t3")
        await eventually(lambda: len(starts(a)) == 3, "t2 dropped")
        assert {(d.topic, d.partition) for d in starts(a)[2].dropped} == {("t2", 0), ("t2", 1)}
        assert "topic t2 is gone" in caplog.text
    finally:
        await runtime.stop()


async def test_a_register_with_another_pattern_is_refused() -> None:
    log = MemoryLog()
    log.counts.update({"t1": 1})
    runtime = serving_runtime(CONFIG, log)
    await runtime.start()
    try:
        await granted(runtime, log, register("a", pattern="t.*"))
        with pytest.raises(CoordinatorError) as refused:
            await runtime.register(RecordingChannel(), register("b", topics=["t1"]))  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.INCONSISTENT_TOPICS
    finally:
        await runtime.stop()


async def test_a_replica_taking_over_knows_the_growth_and_its_transition() -> None:
    log = MemoryLog()
    log.topic_partitions = 2
    runtime = serving_runtime(CONFIG, log)
    await runtime.start()
    try:
        await granted(runtime, log, register("a", topics=["t"]))
        log.counts["t"] = 3
        await runtime.watcher.refresh()
        state = runtime.group_states()["g"]
        await eventually(lambda: runtime.writer.flushed.get("g") == state.log_version, "flush")
    finally:
        await runtime.stop()
    image = log.images[0].groups()["g"]
    taken = GroupState("g")
    for record in takeover_result(image, now=0.0, margin_s=0.5).records:
        replay(taken, record)
    assert taken.partitions == state.partitions
    assert taken.transitions == state.transitions and "t" in taken.transitions
