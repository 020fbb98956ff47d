"""Durable storage: the `StateLog` protocol and its implementation on a Kafka topic.

The runtime sees storage only through the protocols in `base` (`StateLog`,
`ClusterMetadata`), so its tests run on in-memory ones.

- `base`: the protocols, and which state partition a group lives in.
- `log_format`: the state log's records and their JSON (pure).
- `image`: one state partition as replayed from its log (pure).
- `kafka_log`: the state log on a compacted Kafka topic: claims, fencing, replica beats.
- `beats`: replica beats, written and read on the replica's liveness thread, and the
  view of them the main loop reads (`BeatView`, pure).
- `loop_thread`: an event loop on a thread of its own, for what says a replica is alive.
- `signing`: the replica secret, which signs beats and epoch markers (pure).
- `record_reader`: what a replica believes of what it reads: record by record, signed
  records verified (pure).
- `kafka_cluster`: the state topic, partition counts, readiness and offset commits.

Its place among the packages: the import contracts in pyproject.toml.
"""
