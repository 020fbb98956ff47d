"""An in-memory coordinator runtime with one live-looking group, for app-level tests.

Built by replaying the same records the real handlers emit, so the views see exactly the
state shapes a running daemon has, without sockets, brokers or wall-clock timers.
"""

from __future__ import annotations

from typing import Any

from keyshard.coordinator.group.records import (
    GrantAcknowledged,
    MemberHeard,
    MemberJoined,
    PositionsAdvanced,
    RangesGranted,
    RangesRevoked,
    TargetComputed,
)
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.coordinator.runtime.memory import MemoryLog, serving_runtime

GROUP = "orders"
TOPIC = "orders.events"


NOW = 1000.0


class HeldTimers:
    """Timers that never fire: the views are read at one moment, NOW."""

    def __init__(self) -> None:
        self.armed: dict[Any, float] = {}

    def set(self, key: Any, at: float, callback: Any) -> None:
        self.armed[key] = at

    def cancel(self, key: Any) -> None:
        self.armed.pop(key, None)

    def cancel_all(self) -> None:
        self.armed.clear()


def fake_runtime() -> CoordinatorRuntime:
    log = MemoryLog(topic_partitions=2)
    runtime = serving_runtime(
        RuntimeConfig(bootstrap_servers="127.0.0.1:9"), log, clock=lambda: NOW,
        timers=HeldTimers(),
    )  # fmt: skip
    state = runtime._group(GROUP)
    partitions = ((TOPIC, 0), (TOPIC, 1))
    now = NOW
    low, high = RangeSet.from_pairs([(0, 32767)]), RangeSet.from_pairs([(32768, 65535)])
    for member in ("a-1", "b-2"):
        replay(state, MemberJoined(member, member[0], 64, 6000, (TOPIC,), partitions, now))
    replay(state, TargetComputed((("a-1", low), ("b-2", high)), state.inputs_version))
    for member, ranges in (("a-1", low), ("b-2", high)):
        replay(state, RangesGranted(member, ranges, 2, now))
        replay(state, GrantAcknowledged(member, ranges, now))
    replay(state, MemberHeard("a-1", now, ((0, 40), (1, 2))))
    replay(
        state,
        PositionsAdvanced(
            (
                ((TOPIC, 0), ((SlotRange(0, 65535), Position.from_done([(0, 99)])),)),
                ((TOPIC, 1), ((SlotRange(0, 100), Position.from_done([(0, 9)])),)),
            )
        ),
    )
    replay(state, RangesRevoked("b-2", RangeSet.from_pairs([(60000, 65535)]), 3, now + 5, now))
    runtime.ready = True
    return runtime
