"""Unit tests for `ConsumerHooks`: the order of the steps around the hooks.

Both kinds of consumer rely on it: a stopped range is drained before its final positions
are taken (else a record in flight would be skipped by the next owner), and fetching
resumes after a lost session only once everything of the old session is gone."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from keyshard.consumer_client._datapath.dispatch import Dispatcher
from keyshard.consumer_client._datapath.fetcher import Fetcher
from keyshard.consumer_client._datapath.hooks import ConsumerHooks
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.reach import FetchReach
from keyshard.core.model.positions import PositionUpdate
from keyshard.core.model.ranges import RangeSet, SlotRange

SLOTS = RangeSet([SlotRange(0, 99)])


class _Room:
    def __init__(self, steps: list[str]) -> None:
        self._steps = steps

    def set(self) -> None:
        self._steps.append("fetching resumes")


class _Fetcher:
    def __init__(self, steps: list[str]) -> None:
        self._steps = steps
        self.room = _Room(steps)
        self.reach = FetchReach()

    def grant(self, slots: RangeSet, positions: PositionUpdate) -> None:
        self._steps.append("granted")

    def high_watermarks(self) -> dict[Any, int]:
        return {}

    def pause_idle(self) -> None:
        self._steps.append("idle partitions paused")

    def forget(self) -> None:
        self._steps.append("fetcher forgets")


class _Lanes:
    def __init__(self, steps: list[str], busy: asyncio.Event) -> None:
        self._steps = steps
        self._busy = busy

    def drop(self, slots: RangeSet) -> None:
        self._steps.append("queued records dropped")

    async def wait_idle(self, slots: RangeSet) -> None:
        await self._busy.wait()
        self._steps.append("in-flight records done")

    async def abort(self) -> None:
        self._steps.append("lanes aborted")


class _Dispatcher:
    def __init__(self, lanes: _Lanes) -> None:
        self.lanes = lanes

    def take_load(self) -> list[Any]:
        return []

    def take_busy(self) -> tuple[int, int]:
        return 40, 250


class _Recording(ConsumerHooks):
    def __init__(self, steps: list[str], busy: asyncio.Event) -> None:
        fetcher, dispatcher = _Fetcher(steps), _Dispatcher(_Lanes(steps, busy))
        super().__init__(ConsumerProgress(), cast(Fetcher, fetcher), cast(Dispatcher, dispatcher))
        self.steps = steps

    def _settle_before_stop(self, slots: RangeSet) -> list[asyncio.Task[None]]:
        self.steps.append("settle")

        async def take_over() -> None:
            self.steps.append("take-over finished")

        return [asyncio.create_task(take_over())]

    async def _after_drain(self, slots: RangeSet) -> None:
        self.steps.append("after drain")

    async def _forget_session(self) -> None:
        self.steps.append("session forgotten")


async def test_a_stop_drains_before_it_reports_final_positions() -> None:
    busy = asyncio.Event()
    callbacks = _Recording([], busy)
    stopping = asyncio.ensure_future(callbacks.stop_fetcher(SLOTS))
    await asyncio.sleep(0)
    # A record is still in flight: nothing after the drain has happened.
    assert not stopping.done()
    assert "after drain" not in callbacks.steps
    busy.set()
    assert await stopping == {}
    assert callbacks.steps == [
        "settle",
        "queued records dropped",
        "take-over finished",
        "in-flight records done",
        "after drain",
        "idle partitions paused",
    ]


async def test_a_lost_session_resumes_fetching_last() -> None:
    callbacks = _Recording([], asyncio.Event())
    await callbacks.session_lost()
    assert callbacks.steps == [
        "fetcher forgets",
        "lanes aborted",
        "session forgotten",
        "fetching resumes",
    ]


def test_a_plain_consumer_reports_its_own_positions() -> None:
    steps: list[str] = []
    callbacks = ConsumerHooks(
        ConsumerProgress(),
        cast(Fetcher, _Fetcher(steps)),
        cast(Dispatcher, _Dispatcher(_Lanes(steps, asyncio.Event()))),
    )
    callbacks.start_fetcher(SLOTS, {})
    assert steps == ["granted"]
    reply = callbacks.ping_reply()
    assert reply.positions == {} and (reply.busy_records, reply.busy_ms) == (40, 250)
    assert reply.fetch_silences == {}  # nothing asked of Kafka yet
    assert callbacks.held() == (RangeSet([]), {})
