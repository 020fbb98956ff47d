"""The keyshard consumer library: `CoordinatedConsumer`.

Layer: may import only `coordinator.model`, `coordinator.protocol` and `coordinator.kafka`
(import contracts in pyproject.toml), so a consumer-only install needs no server part.
"""

from consumer_client.consumer import (
    ConsumerAborted,
    ConsumerError,
    ConsumerStats,
    CoordinatedConsumer,
)
from consumer_client.endpoints import ConsumerEndpoints
from consumer_client.lanes import RetryPolicy
from consumer_client.transactions import Outputs
from coordinator.security.tls import ClientTls

__all__ = [
    "ClientTls",
    "ConsumerAborted",
    "ConsumerEndpoints",
    "ConsumerError",
    "ConsumerStats",
    "CoordinatedConsumer",
    "Outputs",
    "RetryPolicy",
]
