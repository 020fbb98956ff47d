"""Thin helpers over aiokafka shared by the coordinator, the consumer and Spark.

Whatever talks to the Kafka cluster the same way on every side lives here once: the
client settings users paste in Kafka's own names (`settings`), why a connection failed
(`connect`), and partitions from a fresh metadata answer, never a client's cache
(`metadata`).

Layer: above `keyshard.core.model` and `keyshard.core.security` (the only keyshard packages it
may import); beside `keyshard.core.protocol`, independent of it.
"""
