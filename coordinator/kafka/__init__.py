"""Thin helpers over aiokafka shared by the coordinator, the consumer and Spark: fresh
metadata; later the Kafka client settings.

Layer: above `coordinator.model` (the only keyshard package it may import); beside
`coordinator.protocol`, independent of it.
"""
