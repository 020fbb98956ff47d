"""The keyshard consumer library: `CoordinatedConsumer`."""

from consumer_client.consumer import ConsumerError, CoordinatedConsumer
from consumer_client.lanes import RetryPolicy

__all__ = ["ConsumerError", "CoordinatedConsumer", "RetryPolicy"]
