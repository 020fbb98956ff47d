"""Durable storage: the `StateStore` protocol and its implementation on a Kafka topic.

Layer: above `keyshard.core.model` and `keyshard.core.kafka`; below `coordinator.runtime`,
which sees storage only through the protocols in `coordinator.storage.base`.
"""
