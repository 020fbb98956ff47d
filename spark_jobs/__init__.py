"""PySpark jobs that run as coordinated consumers.

- `session`: the environment Spark needs on a plain machine (Java, Python, loopback)
  and a local session builder shared by the jobs, the tests and the benchmarks; `launch`:
  a job's session under spark-submit or plain `python -m`.
- `source`: the `keyshard` data source (`register(spark)`): batch reads up to the high
  watermark, and streaming reads (`stream`) where the query is a member of a coordinated
  group. Pure planning in `planning` and `offsets`, Kafka I/O in `kafka_io`,
  executor-side rows in `reading`, the member's bookkeeping in `stream_state`.
- `executors`: N Spark tasks, each a `CoordinatedConsumer`.
- `clickstream`, `sessionize`, `pipeline`: the sessionization job over the batch read,
  its rules and its test data.

Its place among the packages: the import contracts in pyproject.toml.
"""
