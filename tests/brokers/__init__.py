"""The brokers tests and benchmarks run against: Tansu (`keyshard.local.broker`, embedded)
and Apache Kafka 4.x assembled from Maven Central (`tests.brokers.kafka`)."""

from __future__ import annotations

from typing import Protocol


class Broker(Protocol):
    """What a test needs of a broker, whichever kind."""

    @property
    def bootstrap_servers(self) -> str: ...
