"""One run's data path, built whole once Kafka is reached: lanes, dispatcher, fetcher.

The three are made together because each needs the others' parts: the lanes report
completions to the dispatcher, the dispatcher's acknowledgements make room for the
fetcher, and the fetcher hands records to the dispatcher. Building them here, complete,
is what lets none of them carry an attribute filled in later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer

from keyshard.consumer_client._datapath.budget import BufferBudget
from keyshard.consumer_client._datapath.dispatch import Dispatcher
from keyshard.consumer_client._datapath.fetcher import Fetcher
from keyshard.consumer_client._datapath.lanes import (
    DEFAULT_RETRY,
    DeadLetter,
    Handler,
    KeyLanes,
    RetryPolicy,
    WorkItem,
)
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.stats import ConsumerStats
from keyshard.core.kafka.fetch_sizes import DEFAULT_MAX_BUFFER_BYTES
from keyshard.core.model.hashing import ORDERING_KEY_HEADER


@dataclass(frozen=True, slots=True)
class DataPathSettings:
    """The consumer's settings that shape its data path (see `CoordinatedConsumer`)."""

    name: str = "consumer"
    max_concurrency: int = 64
    max_pending: int = 1024
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    replay_window: int = 10_000
    ordering_header: str = ORDERING_KEY_HEADER
    retry: RetryPolicy = DEFAULT_RETRY
    read_committed: bool = True


@dataclass(frozen=True, slots=True)
class DataPath:
    dispatcher: Dispatcher
    fetcher: Fetcher

    @property
    def lanes(self) -> KeyLanes:
        return self.dispatcher.lanes

    @classmethod
    def build(
        cls,
        handler: Handler,
        kafka: AIOKafkaConsumer,
        progress: ConsumerProgress,
        stats: ConsumerStats,
        settings: DataPathSettings,
        *,
        session: Callable[[], int],
        dead_letter: DeadLetter | None = None,
    ) -> DataPath:
        """`handler` run in lanes on what `kafka` (started) fetches; `session` is the
        member's current registration (work of an older one is stale)."""
        room = asyncio.Event()
        budget = BufferBudget(settings.max_buffer_bytes)

        def lanes(on_done: Callable[[WorkItem], None]) -> KeyLanes:
            return KeyLanes(
                handler,
                max_concurrency=settings.max_concurrency,
                on_done=on_done,
                retry=settings.retry,
                dead_letter=dead_letter,
                budget=budget,
                released=room.set,
            )

        dispatcher = Dispatcher(
            progress,
            stats,
            lanes,
            ordering_header=settings.ordering_header,
            session=session,
            acked=room.set,
        )
        fetcher = Fetcher(
            progress,
            stats,
            dispatcher,
            kafka,
            name=settings.name,
            max_pending=settings.max_pending,
            budget=budget,
            replay_window=settings.replay_window,
            read_committed=settings.read_committed,
            session=session,
            room=room,
        )
        return cls(dispatcher, fetcher)
