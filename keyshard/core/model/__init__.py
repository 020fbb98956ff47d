"""Values every side shares: key -> slot hashing, slot ranges, positions, addresses.

The coordinator, the consumer and Spark all build on these, which is what keeps their
slot numbers and positions identical.

- `hashing`: key -> slot, as Pulsar computes it.
- `ranges`: inclusive slot ranges and normalized sets of them.
- `positions`: range position maps, what "committed" means for a shared partition.
- `addresses`: `host:port` as every side parses it.
- `durations`: every duration in milliseconds; the names that were in seconds, for one
  release.

Its place among the packages: the import contracts in pyproject.toml.
"""
