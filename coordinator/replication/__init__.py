"""Coordinator replicas: placement of state partitions, takeover and handover.

Several `keyshard coordinator` processes share one state topic. Each state partition has
exactly one active owner, chosen through a Kafka consumer group on the state topic (Kafka
is the election, as it places groups on `__consumer_offsets`), taken over at once when
its owner's heartbeats stop, and fenced through Kafka: a coordinator epoch per partition
in every state record and request, and on brokers with transactions a transactional
producer per partition, so the broker itself refuses a zombie's writes.

- `placement`: which replica owns which state partition (pure functions).
- `manager`: one replica's part: claiming, taking over, handing over, and where a group
  is served.

Its place among the packages: the import contracts in pyproject.toml.
"""
