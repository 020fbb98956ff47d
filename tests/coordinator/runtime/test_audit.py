"""The audit trail of admin changes is stored with the group's state: a replica taking the
group over serves the trail and goes on from where it ended."""

from __future__ import annotations

from keyshard.coordinator.group.state import MAX_AUDIT_HISTORY
from keyshard.coordinator.runtime import operations
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from tests.api.fake_runtime import HeldTimers
from tests.coordinator.runtime.memory import MemoryLog, serving_runtime

GROUP = "g"


def replica_on(log: MemoryLog) -> CoordinatorRuntime:
    """A replica taking over every group `log` holds."""
    return serving_runtime(
        RuntimeConfig("unused:1"), log, clock=lambda: 50.0, timers=HeldTimers(),
        wall_clock=lambda: 1_700_000_000.0,
    )  # fmt: skip


def details(runtime: CoordinatorRuntime) -> list[str]:
    return [e.detail for e in runtime.group_states()[GROUP].audit]


async def test_a_replica_taking_the_group_over_serves_its_audit_trail_and_adds_to_it() -> None:
    log = MemoryLog()
    first = replica_on(log)
    first._group(GROUP)
    for n in range(MAX_AUDIT_HISTORY + 5):
        operations.audit(first, GROUP, "User:ops", "rebalance", f"{n} slot(s) moved")
    await first.writer.flush(GROUP)
    second = replica_on(log)
    assert details(second) == details(first)  # the last ones the trail keeps, in order
    assert details(second)[0] == "5 slot(s) moved" and len(details(second)) == MAX_AUDIT_HISTORY
    entry = second.group_states()[GROUP].audit[-1]
    assert (entry.principal, entry.action, entry.at_ms) == ("User:ops", "rebalance", 1.7e12)
    writes = log.writes
    await second.writer.flush(GROUP)
    assert log.writes == writes  # what it took over is stored already
    operations.audit(second, GROUP, "User:ops-b", "fence", "member m-1")
    await second.writer.flush(GROUP)
    third = replica_on(log)
    assert details(third)[-2:] == [f"{MAX_AUDIT_HISTORY + 4} slot(s) moved", "member m-1"]
    assert len(details(third)) == MAX_AUDIT_HISTORY
