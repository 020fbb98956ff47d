"""The keyshard coordinator daemon, one package per layer.

A package imports only the layers below it (checked in CI by import-linter; the
contracts are in pyproject.toml):

    cli | local            the `keyshard` command; local tooling (embedded broker, demo)
    daemon                 start-up, serve, shutdown; the only importer of `api`
    server | replication   the listening socket: one session per consumer connection |
                           the replicas: placement of state partitions, takeover, handover
    runtime                the I/O shell: applies handler results, timers, durability
    storage                the state log (partitioned, fenced, tailed) and the cluster
    group                  the pure group state machine: state, records, replay, handlers
    strategies             assignors: interface, registry, every strategy
    protocol | kafka       wire messages, codec and channel | thin aiokafka helpers
    security               TLS contexts from PEM files
    model                  slots, ranges, positions, addresses: values every side shares

`consumer_client` and `spark_jobs` may import only `model`, `protocol` and `kafka`;
`cli` and `local` may import `consumer_client` (they run consumer apps).
"""
