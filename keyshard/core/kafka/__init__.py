"""Thin helpers over aiokafka shared by the coordinator, the consumer and Spark.

Whatever talks to the Kafka cluster the same way on every side lives here once: the
client settings users paste in Kafka's own names (`settings`), why a connection failed
(`connect`), and partitions from a fresh metadata answer, never a client's cache
(`metadata`).

Its place among the packages: the import contracts in pyproject.toml.
"""
