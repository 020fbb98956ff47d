"""PySpark jobs that run as coordinated consumers.

Layer: beside `consumer_client`, which it may import, with `keyshard.core.model`,
`keyshard.core.protocol` and `keyshard.core.kafka` (import contracts in pyproject.toml).

- `spark_jobs.session`: the environment Spark needs on a plain machine (Java, Python, loopback)
  and a local session builder shared by the jobs, the tests and the benchmarks.
- `spark_jobs.source`: the `keyshard` data source (`register(spark)`): batch reads up to the
  high watermark, and streaming reads (`spark_jobs.stream`) where the query is a member of
  a coordinated group. Pure planning in `planning` and `offsets`, Kafka I/O in `kafka_io`,
  executor-side rows in `reading`, the member's bookkeeping in `stream_state`.
"""
