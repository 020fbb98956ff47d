"""Durable storage: the `StateStore` protocol and its implementation on a Kafka topic.

Layer: above `coordinator.model` and `coordinator.kafka`; below `coordinator.runtime`,
which sees storage only through the protocols in `coordinator.storage.base`.
"""
