"""The keyshard consumer library: `CoordinatedConsumer`."""

from consumer_client.consumer import ConsumerError, ConsumerStats, CoordinatedConsumer
from consumer_client.lanes import RetryPolicy

__all__ = ["ConsumerError", "ConsumerStats", "CoordinatedConsumer", "RetryPolicy"]
