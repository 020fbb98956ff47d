"""Records whose handler failed `RetryPolicy.max_attempts` times, sent to a topic.

The original record's key, value and headers go as they were, plus why it failed
(`keyshard-error`) and where it came from (`keyshard-source`); the lane then moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import AIOKafkaProducer

STOP_TIMEOUT_S = 10.0


class DeadLetters:
    """A producer for one dead-letter topic, started and stopped with the consumer."""

    def __init__(self, bootstrap_servers: str, topic: str, options: dict[str, Any]) -> None:
        self.topic = topic
        self._bootstrap_servers = bootstrap_servers
        self._options = options  # the consumer's Kafka client settings (security, client id)
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap_servers, **self._options
        )
        await self._producer.start()

    async def send(self, record: Any, error: BaseException) -> None:
        assert self._producer is not None, "started with the consumer"
        headers = [
            *(record.headers or ()),
            ("keyshard-error", repr(error)[:1000].encode()),
            ("keyshard-source", f"{record.topic}/{record.partition}@{record.offset}".encode()),
        ]
        await self._producer.send_and_wait(
            self.topic, key=record.key, value=record.value, headers=headers
        )

    async def stop(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.stop(), STOP_TIMEOUT_S)
