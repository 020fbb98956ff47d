"""Register refused by a server bound leaves nothing behind: no group is created, so a
client cannot fill a replica's group cap with refused Registers."""

from __future__ import annotations

import pytest

from keyshard.coordinator.group.bounds import Bounds
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.errors import CoordinatorError
from keyshard.core.protocol.messages import ErrorCode, RegisterRequest
from tests.coordinator.runtime.test_runtime import HeldLog, RecordingChannel, runtime_on


def _register(group: str, session_timeout_ms: int = 10_000) -> RegisterRequest:
    return RegisterRequest(
        correlation_id=1, group=group, topics=["t"], consumer_name="c",
        session_timeout_ms=session_timeout_ms,
    )  # fmt: skip


async def test_a_session_timeout_out_of_bounds_is_refused_before_the_group_exists() -> None:
    bounds = Bounds(min_session_timeout_ms=2_000, max_session_timeout_ms=20_000)
    runtime = runtime_on(RuntimeConfig("unused:1", bounds=bounds), HeldLog())
    await runtime.start()
    try:
        for timeout_ms in (1_000, 20_001, 300_000):
            with pytest.raises(CoordinatorError) as refused:
                await runtime.register(RecordingChannel(), _register("g", timeout_ms))  # type: ignore[arg-type]
            assert refused.value.code is ErrorCode.INVALID_SESSION_TIMEOUT
            assert str(timeout_ms) in refused.value.message
        assert "g" not in runtime.group_states()
        await runtime.register(RecordingChannel(), _register("g", 20_000))  # type: ignore[arg-type]
        assert "g" in runtime.group_states()
    finally:
        await runtime.stop()


async def test_one_group_more_than_max_groups_is_refused_and_existing_ones_still_admit() -> None:
    runtime = runtime_on(RuntimeConfig("unused:1", bounds=Bounds(max_groups=2)), HeldLog())
    await runtime.start()
    try:
        for group in ("a", "b"):
            await runtime.register(RecordingChannel(), _register(group))  # type: ignore[arg-type]
        with pytest.raises(CoordinatorError) as refused:
            await runtime.register(RecordingChannel(), _register("c"))  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.TOO_MANY_GROUPS
        assert "--max-groups" in refused.value.message
        await runtime.register(RecordingChannel(), _register("a"))  # type: ignore[arg-type]
        assert sorted(runtime.group_states()) == ["a", "b"]
    finally:
        await runtime.stop()
