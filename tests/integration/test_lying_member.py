"""One member that lies cannot make a group lose records (docs/protocol.md §9.4).

Every consumer holds the same token, so a raw client speaking the protocol
(keyshard.core.protocol.channel) registers in a group of real consumers and reports
numbers no honest member would: positions far past the partition's end, positions for
partitions the group does not read, windows and watermarks past the end, numbers too big
for Kafka's types, a session long enough to squat every slot. The coordinator refuses
each (fencing the member with the field named, or refusing the Register, or clipping
the number) and the honest consumers process every record, in key order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from harness import GROUP, TOPIC, CoordinatorProcess, Workers, create_topic, produce, wait_for
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.channel import Channel, RemoteError
from keyshard.core.protocol.messages import (
    ErrorCode,
    ErrorResponse,
    FetchedWindow,
    HighWatermark,
    Message,
    PartitionPositions,
    PingRequest,
    PingResponse,
    PositionModel,
    RangePosition,
    RegisterRequest,
    RegisterResponse,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from keyshard.local.verify import check

TOKEN = "s3cret"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.brokers("tansu"),
    pytest.mark.coordinator_args("--auth-token", TOKEN),
]

PARTITIONS = 4
PARTS = range(PARTITIONS)
HONEST_SESSION_MS = 6_000
LIAR_SESSION_MS = 3_000
LIE = 2**62

#: What a raw member answers a Ping with, given itself and the Ping.
PingAnswer = Callable[["RawMember", PingRequest], PingResponse]


class RawMember:
    """A member that takes every range it is granted and answers Pings with whatever
    `answer` makes up; StopFetcher replies report nothing (it never processed a thing)."""

    def __init__(self, channel: Channel, answer: PingAnswer) -> None:
        self.channel = channel
        self.answer = answer
        self.owned = RangeSet()
        self.partitions: set[tuple[str, int]] = set()
        self.pings = 0
        self.slots_held = 0  # the most it ever owned
        channel.set_request_handler(self._on_request)

    def _on_request(self, channel: Channel, message: Message) -> None:
        if isinstance(message, StartFetcherRequest):
            self.owned |= RangeSet.from_pairs(message.ranges)
            self.slots_held = max(self.slots_held, self.owned.size)
            self.partitions |= {(p.topic, p.partition) for p in message.positions}
            reply: Message = StartFetcherResponse(
                correlation_id=0, member_epoch=message.member_epoch
            )
        elif isinstance(message, StopFetcherRequest):
            self.owned -= RangeSet.from_pairs(message.ranges)
            reply = StopFetcherResponse(
                correlation_id=0, member_epoch=message.member_epoch, positions=[]
            )
        elif isinstance(message, PingRequest):
            self.pings += 1
            reply = self.answer(self, message)
        else:
            return
        channel.reply(message, reply)

    async def fenced(self, timeout: float) -> ErrorResponse:
        """The error the coordinator closed this member's channel with."""
        await asyncio.wait_for(self.channel.wait_closed(), timeout)
        assert self.channel.peer_error is not None, "closed without an error"
        return self.channel.peer_error


def _ping_answer(**fields: Any) -> PingAnswer:
    def answer(member: RawMember, ping: PingRequest) -> PingResponse:
        return PingResponse(correlation_id=0, member_epoch=ping.member_epoch, **fields)

    return answer


def _positions_at(next_offset: int) -> PingAnswer:
    """Every owned range of every partition 'done' up to `next_offset`."""

    def answer(member: RawMember, ping: PingRequest) -> PingResponse:
        position = PositionModel(next_offset=next_offset)
        positions = [
            PartitionPositions(
                topic=topic,
                partition=partition,
                ranges=[RangePosition(range=r.to_pair(), position=position) for r in member.owned],
            )
            for topic, partition in sorted(member.partitions)
            if member.owned
        ]
        return PingResponse(correlation_id=0, member_epoch=ping.member_epoch, positions=positions)

    return answer


def _register_request(**overrides: Any) -> RegisterRequest:
    fields: dict[str, Any] = {
        "correlation_id": 0,
        "group": GROUP,
        "topics": [TOPIC],
        "consumer_name": "liar",
        "session_timeout_ms": LIAR_SESSION_MS,
        "capacity": 100_000,
        "auth_token": TOKEN,
    }
    fields.update(overrides)
    return RegisterRequest(**fields)


@contextlib.asynccontextmanager
async def raw_member(
    coordinator: CoordinatorProcess, answer: PingAnswer, **register: Any
) -> AsyncIterator[tuple[RawMember, RegisterResponse]]:
    channel = await Channel.connect("127.0.0.1", coordinator.listen_port, name="liar")
    member = RawMember(channel, answer)
    channel.start()
    try:
        response = await channel.request(_register_request(**register), timeout=10)
        assert isinstance(response, RegisterResponse), response
        yield member, response
    finally:
        await channel.aclose()


async def _honest_group(coordinator: CoordinatorProcess, workers: Workers) -> None:
    await create_topic(coordinator.bootstrap, partitions=PARTITIONS)
    for name in ("w0", "w1"):
        workers.spawn_cli(
            name,
            "--session-timeout-ms",
            str(HONEST_SESSION_MS),
            env={"KEYSHARD_AUTH_TOKEN": TOKEN},
        )
    await wait_for(lambda: coordinator.settled(2), 60, "two honest members settled")


def _rate(workers: Workers, names: set[str], since_ns: int, until_ns: int) -> float:
    """Records per second the honest workers finished between two monotonic instants."""
    done = [e for e in workers.processed() if e.worker in names and since_ns <= e.t1 < until_ns]
    return len(done) / ((until_ns - since_ns) / 1e9)


async def _all_processed(
    coordinator: CoordinatorProcess, workers: Workers, produced: list[Any], timeout: float
) -> None:
    await wait_for(
        lambda: workers.unique() >= len(produced), timeout, f"{len(produced)} records processed"
    )
    report = check(produced, workers.processed())
    print(f"lost {len(report.lost)}, order violations {len(report.order_violations)}, "
          f"duplicates {report.duplicates}")  # fmt: skip
    assert report.lost == [], report.lost[:20]
    assert report.order_violations == [], report.order_violations[:5]
    assert "Traceback" not in coordinator.read_log(), coordinator.read_log()[-3000:]


@pytest.mark.brokers("tansu", "kafka")
async def test_a_member_reporting_positions_past_the_end_is_fenced_and_nothing_is_lost(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """The issue's case: capacity 100000, next_offset 2**62 for every range it got."""
    await _honest_group(coordinator, workers)
    producing = asyncio.create_task(produce(coordinator.bootstrap, 3_000, 200, rate=150))
    await wait_for(lambda: workers.unique() >= 300, 60, "300 records processed before the liar")
    liar_at = time.monotonic_ns()
    async with raw_member(coordinator, _positions_at(LIE)) as (liar, registered):
        view = await wait_for(
            lambda: _member_view(coordinator, registered.member_id), 10, "the liar's view"
        )
        print(f"liar registered: capacity asked 100000, counted {view['capacity']}")
        assert view["capacity"] == 1_000, view  # --max-capacity's default
        error = await liar.fenced(60)
    fenced_at = time.monotonic_ns()
    print(f"liar: held up to {liar.slots_held} slots, answered {liar.pings} pings, fenced after "
          f"{(fenced_at - liar_at) / 1e9:.1f} s: {error.code} {error.message!r}")  # fmt: skip
    assert liar.slots_held > 0, "the liar was never granted a range: nothing was tested"
    assert error.code == ErrorCode.FENCED_MEMBER
    assert "positions[" in error.message and ".next_offset" in error.message, error.message
    assert str(LIE) in error.message, error.message

    produced = await producing
    await _all_processed(coordinator, workers, produced, 90)
    honest = {"w0", "w1"}
    first = min(e.t1 for e in workers.processed())
    before = _rate(workers, honest, max(first, liar_at - 5 * 10**9), liar_at)
    after_end = min(e.t1 for e in workers.processed() if e.t1 >= fenced_at) + 5 * 10**9
    after = _rate(workers, honest, fenced_at, after_end)
    print(f"honest rate: {before:.0f}/s in the last 5 s before the liar, {after:.0f}/s in the 5 s "
          "after it was fenced (produced at 150/s)")  # fmt: skip
    assert after >= 0.5 * before, (before, after)
    assert await coordinator.settled(2), "the honest members do not own every slot again"


async def _member_view(coordinator: CoordinatorProcess, member_id: str) -> dict[str, Any] | None:
    view = await coordinator.group()
    if view is None:
        return None
    return next((m for m in view["members"] if m["member_id"] == member_id), None)


async def test_made_up_partitions_fence_the_member_and_the_group_goes_on(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await _honest_group(coordinator, workers)

    def made_up(member: RawMember, ping: PingRequest) -> PingResponse:
        positions = [
            PartitionPositions(
                topic=TOPIC if p % 2 else "not-a-topic",
                partition=1_000 + p,
                ranges=[RangePosition(range=(0, 65535), position=PositionModel(next_offset=1))],
            )
            for p in range(8_000)
        ]
        return PingResponse(correlation_id=0, member_epoch=ping.member_epoch, positions=positions)

    async with raw_member(coordinator, made_up, capacity=1) as (liar, _):
        error = await liar.fenced(30)
    print(f"made-up partitions: {error.code} {error.message!r}")
    assert error.code == ErrorCode.FENCED_MEMBER
    assert "positions[" in error.message and "does not read" in error.message, error.message
    view = await wait_for(lambda: coordinator.settled(2), 30, "the honest pair settled again")
    async with coordinator.client() as client:
        metrics = (await client.get(f"{coordinator.admin_url}/metrics")).text
    assert "not-a-topic" not in metrics and f'partition="{1_001}"' not in metrics
    assert len(view["members"]) == 2
    produced = await produce(coordinator.bootstrap, 500, 50)
    await _all_processed(coordinator, workers, produced, 60)


async def test_windows_and_watermarks_past_the_end_are_clipped(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """A poisoned demand frontier (fetched.end 2**62, counts at int32's top): clipped to
    what the partition holds; the member is not fenced for it, lag stays real."""
    await _honest_group(coordinator, workers)
    produced = await produce(coordinator.bootstrap, 400, 50)
    poisoned = _ping_answer(
        high_watermarks=[
            HighWatermark(topic=TOPIC, partition=p, offset=LIE) for p in range(PARTITIONS)
        ],
        fetched=[
            FetchedWindow(topic=TOPIC, partition=p, start=0, end=LIE, buckets={0: 2**31 - 1})
            for p in range(PARTITIONS)
        ],
        load={b: 2**31 - 1 for b in range(0, 4096, 64)},
        busy_records=2**31 - 1,
        busy_ms=1,
    )
    async with raw_member(coordinator, poisoned, capacity=1) as (member, registered):
        await wait_for(lambda: member.pings >= 3, 30, "three poisoned Ping replies")
        view = await coordinator.group()
        assert view is not None
        mine = next(m for m in view["members"] if m["member_id"] == registered.member_id)
        ends = {p: 1 + max(r.offset for r in produced if r.partition == p) for p in PARTS}
        watermarks = {
            (lag["partition"], lag["high_watermark"], lag["lag"])
            for m in view["members"]
            for lag in m["range_lag"]
        }
        print(
            f"poisoned frontier: member still in ({mine['phase']}), partition ends {ends}, "
            f"(partition, high watermark, lag) seen {sorted(watermarks)}, measured speed "
            f"{mine['measured_speed']}, factor {mine['speed_factor']}"
        )
        assert not member.channel.is_closed, member.channel.peer_error
        assert watermarks, "no high watermark counted: nothing was tested"
        for partition, watermark, lag in watermarks:
            assert watermark <= ends[partition] and lag <= ends[partition], watermarks
        assert mine["speed_factor"] <= 4.0, mine
    await _all_processed(coordinator, workers, produced, 60)


async def test_a_five_minute_session_is_refused_at_register(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """The squat: take every slot with a 300 s session, vanish. Refused by the bound."""
    await create_topic(coordinator.bootstrap, partitions=PARTITIONS)
    channel = await Channel.connect("127.0.0.1", coordinator.listen_port, name="squatter")
    channel.start()
    try:
        with pytest.raises(RemoteError) as refused:
            await channel.request(_register_request(session_timeout_ms=300_000), timeout=10)
    finally:
        await channel.aclose()
    error = refused.value
    print(f"300 s session: {error.code} {error.message!r}")
    assert error.code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert "300000" in error.message and "--max-session-timeout-ms" in error.message
    assert await coordinator.group() is None, "the refused Register created the group"


async def test_numbers_beyond_kafkas_types_are_invalid_messages(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """10**400 in a Ping reply: INVALID_MESSAGE at the wire, never an OverflowError."""
    await _honest_group(coordinator, workers)

    def huge(member: RawMember, ping: PingRequest) -> PingResponse:
        return PingResponse.model_construct(
            correlation_id=0, type="ping_response", member_epoch=ping.member_epoch,
            positions=[], high_watermarks=[], load={0: 10**400}, fetched=[],
            busy_records=10**400, busy_ms=None,
        )  # fmt: skip

    async with raw_member(coordinator, huge, capacity=1) as (member, _):
        error = await member.fenced(30)
    print(f"10**400: {error.code} {error.message[:200]!r}")
    assert error.code == ErrorCode.INVALID_MESSAGE
    await wait_for(lambda: coordinator.settled(2), 30, "the honest pair settled again")
    produced = await produce(coordinator.bootstrap, 300, 50)
    await _all_processed(coordinator, workers, produced, 60)
    assert "OverflowError" not in coordinator.read_log()
