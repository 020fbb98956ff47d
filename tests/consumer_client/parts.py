"""The consumer's data path without a broker: built as `CoordinatedConsumer.run` builds it
(`DataPath.build`), over a stand-in for the aiokafka client that a test provides."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from keyshard.consumer_client._datapath.assembly import DataPath, DataPathSettings
from keyshard.consumer_client._datapath.dispatch import Dispatcher
from keyshard.consumer_client._datapath.fetcher import Fetcher
from keyshard.consumer_client._datapath.hooks import ConsumerHooks
from keyshard.consumer_client._datapath.lanes import Handler, KeyLanes
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.stats import ConsumerStats

SESSION = 0  # a consumer's session before its first registration


def session() -> int:
    return SESSION


@dataclass
class Parts:
    progress: ConsumerProgress
    stats: ConsumerStats
    path: DataPath
    hooks: ConsumerHooks

    @property
    def dispatcher(self) -> Dispatcher:
        return self.path.dispatcher

    @property
    def fetcher(self) -> Fetcher:
        return self.path.fetcher

    @property
    def lanes(self) -> KeyLanes:
        return self.path.lanes


async def _no_handler(record: Any) -> None:
    raise AssertionError(f"no handler expected here, got {record!r}")


class FakeKafka:
    """The aiokafka calls that granting, stopping and dispatching make, recorded; nothing
    assigned, nothing fetched."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def assignment(self) -> set[Any]:
        return set()

    def assign(self, tps: Any) -> None:
        self.calls.append(("assign", tps))

    def seek(self, tp: Any, offset: int) -> None:
        self.calls.append(("seek", tp, offset))

    def resume(self, *tps: Any) -> None:
        self.calls.append(("resume", tps))

    def pause(self, *tps: Any) -> None:
        self.calls.append(("pause", tps))


def build(handler: Handler = _no_handler, kafka: Any = None, **settings: Any) -> Parts:
    """A data path with `settings` (`DataPathSettings` fields) on `kafka` (an object with
    the aiokafka methods the test's path calls; a `FakeKafka` by default)."""
    kafka = FakeKafka() if kafka is None else kafka
    progress, stats = ConsumerProgress(), ConsumerStats()
    path = DataPath.build(
        handler, kafka, progress, stats, replace(DataPathSettings(), **settings), session=session
    )
    return Parts(progress, stats, path, ConsumerHooks(progress, path.fetcher, path.dispatcher))


async def stop_fetching(consumer: Parts, release: asyncio.Event) -> None:
    """End a test's fetch loop: let its held handlers go, then wait for every other task
    (the fetcher's and the lanes') to finish."""
    consumer.fetcher.closing = True
    release.set()
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 5)
