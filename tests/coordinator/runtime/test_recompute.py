"""When and where targets are recomputed (coordinator/runtime/recompute.py), through the runtime."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from keyshard.api.models import ServedByView, group_view
from keyshard.coordinator.group.records import (
    ClaimAwaited,
    MemberJoined,
    MemberRemoved,
    RangesGranted,
    TargetComputed,
)
from keyshard.coordinator.group.replay import replay
from keyshard.coordinator.group.state import (
    GroupConfig,
    GroupState,
    HandoffKind,
    PendingClaim,
)
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.recompute import (
    FORMING_MAX_DEFER_S,
    Pacing,
    Schedule,
    TargetRecomputer,
)
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.strategies import registry
from keyshard.coordinator.strategies.balanced import BalancedAssignor
from keyshard.coordinator.strategies.base import Assignment, AssignmentSpec, Strategy
from keyshard.core.model.ranges import RangeSet
from tests.coordinator.runtime.test_runtime import (
    HeldLog,
    RecordingChannel,
    answer,
    eventually,
    register,
    runtime_on,
)


class SlowAssignor:
    """Balanced, after burning `seconds` of CPU in Python (holding the GIL as a large
    load-aware recompute does)."""

    name = "test-slow-balanced"
    seconds = 0.5

    def assign(self, spec: AssignmentSpec) -> Assignment:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return BalancedAssignor().assign(spec)


@pytest.fixture(autouse=True)
def slow_assignor() -> Iterator[None]:
    """Registered only while this module's tests run: the registry is global, and other
    tests (tests/deploy/test_parity.py) hold the chart's list equal to it."""
    registry.register(Strategy(SlowAssignor()))
    yield
    registry.STRATEGIES.pop(SlowAssignor.name, None)


def runtime_with(
    assignor: str = "balanced", quiet_ms: int = 100, idle_quiet_ms: int = 1_500
) -> CoordinatorRuntime:
    config = RuntimeConfig(
        "unused:1",
        group_defaults=GroupConfig(assignor=assignor),
        recompute_quiet_ms=quiet_ms,
        recompute_idle_quiet_ms=idle_quiet_ms,
    )
    return runtime_on(config, HeldLog())


async def test_a_storm_of_joins_shares_one_recompute() -> None:
    """Twenty joins 10 ms apart: the first is assigned at once (a lone join waits for
    nothing), the other nineteen share one recompute after they stop, not one per wave
    (each wave would move what the previous one placed: thousands of StopFetchers at
    5,000 members). Only the first member gives slots back. A stall of this machine
    longer than the quiet time could split the storm: one more of each is tolerated (and
    a stall before m0's target lands holds its grants: then nobody gives any back)."""
    runtime = runtime_with(quiet_ms=300)
    await runtime.start()
    try:
        channels = [RecordingChannel() for _ in range(20)]
        for i, channel in enumerate(channels):
            await runtime.register(channel, register(f"m{i}"))  # type: ignore[arg-type]
            await asyncio.sleep(0.01)

        def granted() -> bool:
            for c in channels:
                answer(c)  # StopFetchers too, so m0's slots can move on
            return all("start_fetcher_request" in c.kinds() for c in channels)

        await eventually(granted, "everyone granted")
        assert 1 <= runtime.activity.totals["recompute"] <= 3
        stopped = [i for i, c in enumerate(channels) if "stop_fetcher_request" in c.kinds()]
        assert stopped[:1] in ([], [0]) and len(stopped) <= 2, stopped
    finally:
        await runtime.stop()


async def test_a_pause_in_a_storm_does_not_grant_under_a_target_that_misses_joiners() -> None:
    """Ten joins at once, a pause longer than the quiet time (the recompute for them
    starts), ten more while it runs. Its target gives the second ten nothing: granted,
    the first ten would own every slot and the next target would revoke a piece from
    each of them (at 5,000 members, 4,000+ StopFetchers). The grants wait for
    the target that places everyone: one StartFetcher each, no StopFetcher. (The pause is
    shorter than the quiet time of a new group: shortened here to test the hold.)"""
    runtime = runtime_with(assignor=SlowAssignor.name, quiet_ms=100, idle_quiet_ms=100)
    await runtime.start()
    try:
        channels = [RecordingChannel() for _ in range(20)]
        adopted: list[tuple[int, int]] = []  # (members in the target, members in the group)
        adopt = runtime._recomputer._adopt

        def recording(group: str, state: GroupState, record: TargetComputed) -> None:
            adopted.append((len(record.target), len(state.members)))
            adopt(group, state, record)

        runtime._recomputer._adopt = recording

        async def wave(members: list[RecordingChannel]) -> None:
            await asyncio.gather(*(runtime.register(c, register("m")) for c in members))  # type: ignore[arg-type]

        await wave(channels[:10])
        await asyncio.sleep(0.25)  # the recompute for the first ten is running (0.5 s)
        await wave(channels[10:])

        def granted() -> bool:
            for c in channels:
                answer(c)
            return all("start_fetcher_request" in c.kinds() for c in channels)

        await eventually(granted, "everyone granted")
        assert adopted == [(10, 20), (20, 20)]
        assert [c.kinds() for c in channels] == [["start_fetcher_request"]] * 20
    finally:
        await runtime.stop()


async def test_a_storm_into_a_new_group_waits_for_its_tail() -> None:
    """Ten joins, then ten more 0.5 s later (connections that overflowed the listen
    queue complete a TCP retransmit later): in a group where nothing runs yet, waiting
    costs nothing, so one recompute places all twenty. In a running group a burst still
    waits only the ordinary quiet time."""
    runtime = runtime_with(quiet_ms=100, idle_quiet_ms=1_000)
    await runtime.start()
    try:
        channels = [RecordingChannel() for _ in range(22)]

        async def wave(members: list[RecordingChannel]) -> None:
            await asyncio.gather(*(runtime.register(c, register("m")) for c in members))  # type: ignore[arg-type]

        await wave(channels[:10])
        await asyncio.sleep(0.5)
        await wave(channels[10:20])

        def granted(members: list[RecordingChannel]) -> bool:
            for c in members:
                answer(c)
            return all("start_fetcher_request" in c.kinds() for c in members)

        await eventually(lambda: granted(channels[:20]), "everyone granted")
        assert runtime.activity.totals["recompute"] == 1
        assert [c.kinds() for c in channels[:20]] == [["start_fetcher_request"]] * 20
        began = time.perf_counter()
        await wave(channels[20:])  # a burst of two into the running group
        await eventually(lambda: granted(channels), "the two granted")
        assert time.perf_counter() - began < 0.9
    finally:
        await runtime.stop()


async def test_the_loop_keeps_running_during_a_recompute() -> None:
    """A 0.5 s recompute runs beside the loop, not on it: replies, timers and new
    connections are not held up for its whole duration."""
    runtime = runtime_with(assignor=SlowAssignor.name, quiet_ms=0)
    await runtime.start()
    try:
        a = RecordingChannel()
        longest, last = 0.0, time.perf_counter()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        while not a.kinds():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        assert runtime.activity.totals["recompute"] == 1
        assert longest < 0.25, f"the loop stood still for {longest * 1000:.0f} ms"
    finally:
        await runtime.stop()


async def test_a_lone_join_is_assigned_without_waiting_for_quiet() -> None:
    """Nothing else changed recently: the recompute starts at once, not after the quiet
    time a storm would wait for."""
    runtime = runtime_with(quiet_ms=1_000)
    await runtime.start()
    try:
        a, b = RecordingChannel(), RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a granted")
        answer(a)
        await asyncio.sleep(1.1)  # quiet for longer than the quiet time
        began = time.perf_counter()
        await runtime.register(b, register("b"))  # type: ignore[arg-type]
        await eventually(lambda: "stop_fetcher_request" in a.kinds(), "a asked to give half")
        assert time.perf_counter() - began < 0.5
    finally:
        await runtime.stop()


async def test_the_admin_view_says_a_recompute_is_pending() -> None:
    """While a join waits for its recompute, every slot is owned and nothing drains, yet
    slots are about to move: tools waiting for a settled group must be able to tell."""
    runtime = runtime_with(assignor=SlowAssignor.name, quiet_ms=0)
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        state = runtime.group_states()["g"]
        here = ServedByView(replica_id="r", state_partition=0, coordinator_epoch=1)
        assert group_view(state, runtime.clock(), here).target_pending
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a granted")
        assert not group_view(state, runtime.clock(), here).target_pending
    finally:
        await runtime.stop()


class FakeTimer:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _join(state: GroupState, member_id: str, at: float) -> None:
    replay(state, MemberJoined(member_id, member_id, 1, 10_000, ("t",), (("t", 0),), at))


async def _paced(timer: FakeTimer, arriving: list[int] | None = None) -> TargetRecomputer:
    """A recomputer on a fake timer, with the daemon's pacing; its tasks never get to run
    (the tests do not yield to the loop), so only the schedule is observed. `arriving`
    holds the count of Registers in flight."""
    in_flight = arriving if arriving is not None else [0]
    return TargetRecomputer(
        lambda *_: None, Activity(), timer, Pacing(), timer=timer, arriving=lambda: in_flight[0]
    )


async def test_the_first_member_of_a_new_group_waits_for_quiet() -> None:
    """A lone first member is placed after `idle_quiet_s` (1.5 s) of quiet, not at once:
    the storm it may head gets one target. Each join restarts the quiet."""
    timer = FakeTimer()
    recomputer = await _paced(timer)
    state = GroupState("g")
    try:
        _join(state, "m0", 0.0)
        assert state.forming
        recomputer.stale("g", state)
        assert recomputer.due_in("g", state) == pytest.approx(1.5)
        timer.now = 1.0
        _join(state, "m1", 1.0)
        recomputer.stale("g", state)
        assert recomputer.due_in("g", state) == pytest.approx(1.5)
        timer.now = 2.5
        assert recomputer.due_in("g", state) == pytest.approx(0.0)
    finally:
        recomputer.cancel()


async def test_a_storm_that_keeps_joining_is_placed_at_the_forming_max_defer() -> None:
    """Joins every 0.5 s never leave 1.5 s of quiet: the first target is due
    FORMING_MAX_DEFER_S after the first join, not the 2 s of a running group."""
    timer = FakeTimer()
    recomputer = await _paced(timer)
    state = GroupState("g")
    try:
        for i in range(int(FORMING_MAX_DEFER_S / 0.5)):
            timer.now = i * 0.5
            _join(state, f"m{i}", timer.now)
            recomputer.stale("g", state)
            due = recomputer.due_in("g", state)
            assert due is not None and due > 0, (timer.now, due)
        timer.now = FORMING_MAX_DEFER_S
        assert recomputer.due_in("g", state) == pytest.approx(0.0)
    finally:
        recomputer.cancel()


async def test_registers_in_flight_keep_a_forming_group_from_being_quiet() -> None:
    """Registers received but not answered (waiting for Kafka's partition count under
    load) are joins on their way: no quiet is counted while there are any, and the
    forming max defer still bounds the wait."""
    timer, arriving = FakeTimer(), [0]
    recomputer = await _paced(timer, arriving)
    state = GroupState("g")
    try:
        _join(state, "m0", 0.0)
        recomputer.stale("g", state)
        arriving[0] = 300
        timer.now = 3.0  # no join for 3 s, but 300 Registers on their way
        assert recomputer.due_in("g", state) == pytest.approx(1.5)
        arriving[0] = 0
        timer.now = 4.0
        assert recomputer.due_in("g", state) == pytest.approx(0.5)
        arriving[0] = 1
        timer.now = FORMING_MAX_DEFER_S
        assert recomputer.due_in("g", state) == pytest.approx(0.0)
        replay(state, RangesGranted("m0", RangeSet.full(), 2, 0.0))
        timer.now = 20.0
        _join(state, "m1", 20.0)
        recomputer.stale("g", state)
        due = recomputer.due_in("g", state)
        assert due is not None and due <= 0  # running: Registers in flight hold nothing
    finally:
        recomputer.cancel()


async def test_a_group_granted_once_uses_the_normal_quiet() -> None:
    """Once a slot ran on a member the group is no longer forming: a lone join is placed
    at once, a burst after `quiet_s` (0.1 s), and a storm at the 2 s max defer."""
    timer = FakeTimer()
    recomputer = await _paced(timer)
    state = GroupState("g")
    try:
        _join(state, "m0", 0.0)
        replay(state, RangesGranted("m0", RangeSet.full(), 2, 0.0))
        assert not state.forming
        timer.now = 5.0
        _join(state, "m1", 5.0)
        recomputer.stale("g", state)
        assert recomputer.due_in("g", state) == pytest.approx(0.0)  # lone: at once
        timer.now = 5.05
        _join(state, "m2", 5.05)
        recomputer.stale("g", state)
        assert recomputer.due_in("g", state) == pytest.approx(0.1)  # a burst: quiet_s
        for i in range(3, 40):
            timer.now = 5.0 + i * 0.05
            _join(state, f"m{i}", timer.now)
            recomputer.stale("g", state)
        timer.now = 7.0
        assert recomputer.due_in("g", state) == pytest.approx(0.0)  # max defer, 2 s
    finally:
        recomputer.cancel()


def test_pacing_of_a_forming_group_and_of_a_running_one() -> None:
    """The pure rule, on both sides: quiet and cap of a forming group, quiet of a burst
    and of a lone change in a running one, and the spacing after the last recompute."""
    pacing = Pacing(quiet_s=0.1, max_defer_s=2.0, idle_quiet_s=1.5, forming_max_defer_s=10.0)
    lone, burst = Schedule(0.0, 0.0, 1, False), Schedule(0.0, 9.0, 5, True)
    assert pacing.due_at(lone, forming=True, spaced_until=0.0) == 1.5
    assert pacing.due_at(burst, forming=True, spaced_until=0.0) == 10.0
    assert pacing.due_at(lone, forming=False, spaced_until=0.0) == 0.0
    assert pacing.due_at(Schedule(0.0, 0.5, 2, True), forming=False, spaced_until=0.0) == 0.6
    assert pacing.due_at(burst, forming=False, spaced_until=0.0) == 2.0
    assert pacing.due_at(lone, forming=False, spaced_until=3.0) == 3.0


def test_a_group_forms_again_once_its_last_member_is_gone() -> None:
    """Forming is the group's own state: it ends with the first grant (or a claim taken
    back after a takeover, whose slots ran elsewhere) and starts again when the group
    has no member left."""
    state = GroupState("g")
    _join(state, "m0", 0.0)
    assert state.forming
    replay(state, RangesGranted("m0", RangeSet.full(), 2, 0.0))
    assert not state.forming
    replay(state, MemberRemoved("m0", HandoffKind.LEAVE, None, 1.0))
    assert state.forming
    claim = PendingClaim("m1", "m1", 3, RangeSet.full(), 5.0)
    replay(state, ClaimAwaited(claim))
    assert not state.forming
