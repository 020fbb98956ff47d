"""The runtime shell with a fake log and fake channels: ordering guarantees that do not
need a broker to show, and that a real broker shows only by chance."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from keyshard.coordinator.group.records import PositionsAdvanced
from keyshard.coordinator.group.state import GroupConfig
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.partition_counts import CoalescedPartitionCounts
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.storage.base import Fenced
from keyshard.coordinator.storage.log_format import decode, encode_positions
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange
from keyshard.core.protocol.messages import (
    MemberClaim,
    Message,
    PartitionPositions,
    PositionModel,
    RangePosition,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from keyshard.core.protocol.wire import ranges_from_wire, ranges_to_wire
from tests.coordinator.runtime.memory import MemoryLog, serving_runtime

TIMEOUT = 5.0


class HeldLog(MemoryLog):
    """A state log whose writes wait until `released` is set; counts them."""


def advance(runtime: CoordinatorRuntime, group: str = "g") -> None:
    """Progress a ping would report: the group's positions move on by one offset."""
    state = runtime.group_states()[group]
    done = state.position_map(("t", 0)).minimum_offset() + 1
    update = ((("t", 0), ((SlotRange(0, 65535), Position(done)),)),)
    runtime.apply_records(group, [PositionsAdvanced(update)], reconcile=False)


def runtime_on(config: RuntimeConfig, log: HeldLog) -> CoordinatorRuntime:
    """A runtime serving every group, its log also answering the metadata calls."""
    return serving_runtime(config, log)


class RecordingChannel:
    """Records requests in wire order; the test answers them."""

    def __init__(self) -> None:
        self.sent: list[tuple[Message, asyncio.Future[Message]]] = []
        self.is_closed = False
        self.peer = "test"
        self.peer_host = "test"

    def submit(self, message: Message) -> asyncio.Future[Message]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.sent.append((message, future))
        return future

    async def response(self, future: asyncio.Future[Message], *, timeout: float | None) -> Message:
        return await future

    async def request(self, message: Message, *, timeout: float | None = None) -> Message:
        return await asyncio.Future()  # pings stay unanswered: irrelevant here

    def fail(self, *args: Any) -> None:
        self.is_closed = True

    def has_unread_input(self) -> bool:
        return False

    def close(self, reason: str = "") -> None:
        self.is_closed = True

    def kinds(self) -> list[str]:
        return [m.type for m, _ in self.sent if not m.type.startswith("ping")]


async def eventually(predicate: Any, what: str) -> None:
    """Let the runtime's tasks run until `predicate` holds (bounded)."""
    async with asyncio.timeout(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - yielding to the loop is the point
            await asyncio.sleep(0)
    assert predicate(), what


def register(name: str) -> RegisterRequest:
    return RegisterRequest(
        correlation_id=1, group="g", topics=["t"], consumer_name=name, session_timeout_ms=10_000
    )


def answer(channel: RecordingChannel) -> None:
    """Answer every unanswered Start/Stop; a stop reports progress (dirty positions)."""
    for message, future in channel.sent:
        if future.done():
            continue
        if isinstance(message, StartFetcherRequest):
            future.set_result(
                StartFetcherResponse(correlation_id=0, member_epoch=message.member_epoch)
            )
        elif isinstance(message, StopFetcherRequest):
            done = [
                RangePosition(range=r, position=PositionModel(next_offset=5))
                for r in message.ranges
            ]
            positions = [PartitionPositions(topic="t", partition=0, ranges=done)]
            future.set_result(
                StopFetcherResponse(
                    correlation_id=0, member_epoch=message.member_epoch, positions=positions
                )
            )


async def test_stop_never_overtakes_an_earlier_start_held_by_a_slow_write() -> None:
    log = HeldLog()
    runtime = runtime_on(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a, b, c = RecordingChannel(), RecordingChannel(), RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts everything")
        answer(a)

        log.released.clear()  # position writes now hang, as a slow broker would
        await runtime.register(b, register("b"))  # type: ignore[arg-type]
        await eventually(lambda: len(a.kinds()) == 2, "a is asked to stop half")
        answer(a)  # a hands over: b's StartFetcher now waits for the held write
        await asyncio.sleep(0.01)
        await runtime.register(c, register("c"))  # type: ignore[arg-type]
        # c's arrival takes slots back from b, whose StartFetcher is still unsent.
        await eventually(
            lambda: any(
                st.members[m].draining for st in runtime.group_states().values() for m in st.members
            ),
            "a revoke from b",
        )
        await asyncio.sleep(0.01)
        assert b.kinds() == [], "nothing may reach b before its StartFetcher"

        log.released.set()
        await eventually(lambda: len(b.kinds()) == 2, "b gets its start, then its stop")
        assert b.kinds() == ["start_fetcher_request", "stop_fetcher_request"]
    finally:
        log.released.set()
        await runtime.stop()


class CountingMetadata:
    """Metadata fetches that wait until released, counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.release = asyncio.Event()

    async def partition_counts(self, topics: tuple[str, ...]) -> dict[str, int]:
        self.calls.append(topics)
        await self.release.wait()
        return dict.fromkeys(topics, 3)


async def test_concurrent_registrations_share_one_metadata_fetch() -> None:
    """Callers arriving together share a fetch; one arriving while it runs gets the next
    (it must see topics created after the first fetch started), never a third."""
    metadata = CountingMetadata()
    counts = CoalescedPartitionCounts(metadata)  # type: ignore[arg-type]
    first = [asyncio.ensure_future(counts.get(("a",))) for _ in range(50)]
    first.append(asyncio.ensure_future(counts.get(("b",))))
    await eventually(lambda: len(metadata.calls) == 1, "the first fetch")
    later = [asyncio.ensure_future(counts.get(("c",))) for _ in range(50)]
    await asyncio.sleep(0.01)
    assert metadata.calls == [("a", "b")], "callers of one moment share one fetch"
    metadata.release.set()
    assert await first[0] == {"a": 3} and await first[-1] == {"b": 3}
    assert await asyncio.gather(*later) == [{"c": 3}] * 50
    assert metadata.calls == [("a", "b"), ("c",)]


class LogWithOldGroup(HeldLog):
    """A log that already holds positions of a group `old` (nobody in it any more)."""

    def __init__(self) -> None:
        super().__init__()
        ((key, value),) = encode_positions("old", ("t", 0), RangePositionMap(), 1)
        self.images[0].apply(0, decode(key, value))


async def test_a_group_replayed_without_members_schedules_no_recompute() -> None:
    """A group known only from the state topic has no members: nothing to recompute,
    so nothing may be scheduled for it (rescheduling it would spin the event loop)."""
    runtime = runtime_on(RuntimeConfig("unused:1"), LogWithOldGroup())
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts everything")
        runtime.apply_records("old", [])  # e.g. its balance timer: a reconcile
        for _ in range(10):
            await asyncio.sleep(0)
        assert runtime._recomputer.scheduled == set()
    finally:
        await runtime.stop()


class BusyLog(HeldLog):
    """Positions keep moving while a write is in flight, as pings do under load."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0
        self.on_write = self._entered

    def _entered(self) -> None:
        self.entered += 1
        if self.during_write is not None:
            self.during_write()

    during_write: Any = None


async def test_flushes_waiting_behind_a_write_share_the_next_one() -> None:
    """Group commit: ten StartFetchers waiting for durable positions cost two writes, not
    ten, even though positions change during every write (otherwise a burst of grants
    under load queues one write each and stalls every StartFetcher behind them)."""
    log = BusyLog()
    runtime = runtime_on(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts everything")

        def moved() -> None:
            advance(runtime)

        log.during_write = moved
        log.released.clear()
        moved()
        before, entered = log.writes, log.entered
        first = asyncio.create_task(runtime.writer.flush("g"))
        await eventually(lambda: log.entered > entered, "a write in flight")
        waiting = [asyncio.create_task(runtime.writer.flush("g")) for _ in range(10)]
        for _ in range(5):
            await asyncio.sleep(0)
        log.released.set()
        await asyncio.wait_for(asyncio.gather(first, *waiting), TIMEOUT)
        assert log.writes - before == 2
    finally:
        log.released.set()
        await runtime.stop()


async def test_writers_waiting_for_a_flush_all_resume_in_the_same_loop_turn() -> None:
    """A thousand StartFetchers waiting for one position write are released together when
    it lands. Queued on a lock they would resume one per loop turn: in a 5,000-member join
    storm each turn is long, and StartFetchers would wait seconds after their positions
    were durable."""
    log = HeldLog()
    runtime = runtime_on(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts everything")
        log.released.clear()
        advance(runtime)
        writes = log.writes
        waiting = [asyncio.create_task(runtime.writer.flush("g")) for _ in range(1000)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert not any(t.done() for t in waiting), "the write is held"
        log.released.set()
        turns = 0
        while not all(t.done() for t in waiting):
            await asyncio.sleep(0)
            turns += 1
            assert turns <= 10, f"{sum(t.done() for t in waiting)} of 1000 resumed in 10 turns"
        assert log.writes == writes + 1
    finally:
        log.released.set()
        await runtime.stop()


class PingClock(RecordingChannel):
    """Notes when each ping is sent; never answers it."""

    def __init__(self) -> None:
        super().__init__()
        self.pinged: list[float] = []

    def submit(self, message: Message) -> asyncio.Future[Message]:
        if message.type == "ping_request":
            self.pinged.append(asyncio.get_running_loop().time())
        return super().submit(message)


async def test_members_registering_together_are_not_pinged_together() -> None:
    """First pings are spread over the interval: 5,000 members pinged in one burst every
    interval stall the loop for ~1 s each time, delaying every reply and timer."""
    config = RuntimeConfig("unused:1", group_defaults=GroupConfig(ping_interval_ms=200))
    runtime = runtime_on(config, HeldLog())
    await runtime.start()
    try:
        channels = [PingClock() for _ in range(30)]
        began = asyncio.get_running_loop().time()
        await asyncio.gather(
            *(runtime.register(c, register(f"m{i}")) for i, c in enumerate(channels))  # type: ignore[arg-type]
        )
        await eventually(lambda: all(c.pinged for c in channels), "everyone pinged once")
        first = sorted(c.pinged[0] - began for c in channels)
        assert first[0] >= 0.1 and first[-1] <= 0.3 + 0.1, "within half an interval of it"
        assert first[-1] - first[0] > 0.06, f"first pings not spread: {first}"
        # ...but in batches, on 10 ms ticks (a twentieth of the interval): one loop turn
        # serves several, which halves the CPU of steady pings against one per turn.
        late = [c.pinged[0] % 0.01 for c in channels]  # after the tick they were sent on
        on_tick = [t for t in late if t < 0.004]
        assert len(on_tick) >= 20, f"first pings not sent on ticks: {sorted(late)}"
    finally:
        await runtime.stop()


async def test_a_grant_leaves_only_once_the_log_has_it() -> None:
    """A StartFetcher waits until the member's record (what it now owns) is in the state
    log: a replica taking the group over right after must know who runs what."""
    log = HeldLog()
    log.released.clear()
    runtime = runtime_on(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        for _ in range(20):
            await asyncio.sleep(0)
        assert a.kinds() == [], "held: the grant is not in the log yet"
        log.released.set()
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts")
        members = log.images[0].groups()["g"].members
        assert set(members) == {a_id(runtime)} and members[a_id(runtime)].owned.size == 65536
    finally:
        log.released.set()
        await runtime.stop()


def a_id(runtime: CoordinatorRuntime) -> str:
    (member_id,) = runtime.group_states()["g"].members
    return member_id


async def test_a_reply_after_the_partition_was_let_go_of_is_dropped_quietly(
    caplog: Any,
) -> None:
    """A StopFetcher answered after the replica let the group's partition go (handed over,
    fenced, cut off): the group is gone here, and the reply changes nothing (no KeyError
    in the sender: that would be one traceback per member, thousands at 15,000 members)."""
    log = HeldLog()
    runtime = runtime_on(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a, _, _ = await b_joins_a(runtime)
        owner = runtime.owner_of("g")
        assert owner is not None
        runtime.release_partition(owner[0], "handed over (test)")
        answer(a)
        for _ in range(100):
            await asyncio.sleep(0)
        assert "g" not in runtime.group_states()
        assert [r for r in caplog.records if r.levelname == "ERROR"] == []
    finally:
        await runtime.stop()


async def b_joins_a(
    runtime: CoordinatorRuntime,
) -> tuple[RecordingChannel, RecordingChannel, RegisterResponse]:
    """Member a runs everything, then b registers and a is asked to stop half: their
    channels, and b's answer."""
    a, b = RecordingChannel(), RecordingChannel()
    await runtime.register(a, register("a"))  # type: ignore[arg-type]
    await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts everything")
    answer(a)
    joined = await runtime.register(b, register("b"))  # type: ignore[arg-type]
    await eventually(lambda: len(a.kinds()) == 2, "a is asked to stop half")
    return a, b, joined


class EpochLog(HeldLog):
    """A held state log that refuses a write under an epoch older than `epoch` (as Kafka
    refuses a fenced transactional producer's) once the write is let through."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0

    def admit(self, partition: int, epoch: int) -> None:
        if epoch < self.epoch:
            raise Fenced(f"state partition {partition} is at epoch {self.epoch}")


@pytest.mark.parametrize("old_write", ["lands", "refused"])
async def test_a_grant_of_a_group_let_go_of_during_its_write_never_leaves(
    old_write: str,
) -> None:
    """A grant waits for its group's write; the replica lets the partition go meanwhile
    and takes it back (a new epoch, the group adopted from the log), and the member comes
    back with its claim. The old grant belongs to a group state that is gone: it must not
    leave on the member's new channel (the slots it names are another member's pending
    claim now). The old write, landing late, must not count as storing the group served
    now (its grants would leave unstored); refused for its old epoch, it must not make
    the replica let go of the partition it serves at the new one."""
    log = EpochLog()
    runtime = runtime_on(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a, b, joined = await b_joins_a(runtime)
        answer(a)
        await eventually(lambda: b.kinds() == ["start_fetcher_request"], "b starts its half")
        answer(b)
        state = runtime.group_states()["g"]
        a_member = next(m for m in state.members.values() if m.name == "a")
        kept = a_member.owned
        entered: list[int] = []
        log.on_write = lambda: entered.append(1)
        log.released.clear()
        writes = log.writes
        assert await runtime.leave("g", joined.member_id, []) is None
        await eventually(lambda: bool(entered), "a's grant of b's half waits for its write")
        assert len(a.kinds()) == 2

        runtime.release_partition(0, "handed over (test)")
        runtime.adopt_partition(0, 2, log.images[0])
        log.epoch = 2 if old_write == "refused" else 0
        adopted_at = runtime.group_states()["g"].log_version
        back = RecordingChannel()
        claim = MemberClaim(
            member_id=a_member.member_id, member_epoch=a_member.epoch,
            owned=ranges_to_wire(kept), positions=[], coordinator_epoch=1,
        )  # fmt: skip
        request = register("a").model_copy(update={"claim": claim})
        response = await runtime.register(back, request)  # type: ignore[arg-type]
        assert response.member_id == a_member.member_id and response.adopted, "claim kept"

        log.released.set()
        if old_write == "lands":
            await eventually(lambda: log.writes > writes, "the old write lands")
        for _ in range(100):
            await asyncio.sleep(0)
        granted = RangeSet()
        for message, _ in back.sent:
            if isinstance(message, StartFetcherRequest):
                granted |= ranges_from_wire(message.ranges)
        assert not granted - kept, "b's half went to a while b's claim is pending"
        assert runtime.owned_partitions() == {0: 2}, "the partition is still served"
        flushed = runtime.writer.flushed.get("g", -1)
        assert adopted_at <= flushed <= runtime.group_states()["g"].log_version
    finally:
        log.released.set()
        await runtime.stop()


class LeaderlessLog(MemoryLog):
    """A state log whose partition can lose its leader: writes fail then, as a producer's
    do while Kafka elects a new one, and land again once it has one."""

    def __init__(self) -> None:
        super().__init__()
        self.leaderless = False
        self.refused = 0

    async def write(
        self, partition: int, epoch: int, records: Sequence[tuple[bytes, bytes | None]]
    ) -> None:
        if self.leaderless:
            self.refused += 1
            raise KafkaTimeoutError("the state partition has no leader")
        await super().write(partition, epoch, records)


def stored_offset(log: MemoryLog) -> int | None:
    """Where group g's stored positions of t/0 start, if any are stored."""
    image = log.images[0].groups().get("g")
    stored = (
        [pmap for tp, pmap in image.positions.items() if tuple(tp) == ("t", 0)] if image else []
    )
    return stored[0].minimum_offset() if stored else None


async def test_positions_kafka_could_not_take_are_written_once_it_can() -> None:
    """Progress reported while the state partition has no leader stays in the group and
    is written by the next periodic flush that gets through: the partition is kept, so a
    failover after Kafka's resumes from recent positions."""
    log = LeaderlessLog()
    runtime = serving_runtime(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "a starts everything")
        answer(a)
        log.leaderless = True
        for _ in range(3):
            advance(runtime)
        reported = runtime.group_states()["g"].position_map(("t", 0)).minimum_offset()
        await eventually(lambda: log.refused >= 2, "periodic flushes refused")
        assert stored_offset(log) != reported
        assert runtime.owned_partitions() == {0: 1}
        log.leaderless = False
        await eventually(lambda: stored_offset(log) == reported, "the positions stored")
    finally:
        await runtime.stop()


async def test_a_grant_waits_out_a_leaderless_state_partition() -> None:
    """A StartFetcher leaves only once the grant is stored: while Kafka cannot take the
    write it is tried again, neither sent unstored nor dropped."""
    log = LeaderlessLog()
    log.leaderless = True
    runtime = serving_runtime(RuntimeConfig("unused:1"), log)
    await runtime.start()
    try:
        a = RecordingChannel()
        await runtime.register(a, register("a"))  # type: ignore[arg-type]
        await eventually(lambda: log.refused >= 2, "the grant's write tried again")
        assert a.kinds() == []
        log.leaderless = False
        await eventually(lambda: a.kinds() == ["start_fetcher_request"], "the grant leaves")
        assert runtime.owned_partitions() == {0: 1}
    finally:
        await runtime.stop()
