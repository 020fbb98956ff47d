"""Thin helpers over aiokafka shared by the coordinator, the consumer and Spark.

Whatever talks to the Kafka cluster the same way on every side lives here once: fresh
partition metadata (never the client's cache); later the Kafka client settings.
"""
