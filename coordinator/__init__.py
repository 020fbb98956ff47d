"""The keyshard coordinator: the group core and the I/O around it.

- `strategies`: the assignors, pure functions from members and measured load to slot
  ranges.
- `group`: the pure group state machine: state, records, `replay`, handlers and effects.
- `storage`: the state log (partitioned, fenced, tailed by every replica) and what the
  coordinator needs of the Kafka cluster besides it.
- `runtime`: the I/O shell that carries out handler results: timers, pings, durable
  writes, recomputes, operator actions.
- `server`: the listening socket and one session per consumer connection.
- `replication`: the replicas: placement of state partitions, takeover and handover.

`keyshard.daemon` starts them; `keyshard.core` holds what they share with the consumers.
Which package may import which is set by the import contracts in pyproject.toml.
"""
