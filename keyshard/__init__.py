"""keyshard: many consumers per Kafka partition, every key on one of them, in order.

The one import name of the distribution. What users import:

- `keyshard.consumer_client`: the consumer library (`CoordinatedConsumer`).
- `keyshard.spark_jobs`: the PySpark data source and jobs that run as consumers.

What the `keyshard` command runs: `keyshard.cli` (the command), `keyshard.daemon` (the
coordinator process: `keyshard.coordinator` behind its socket and `keyshard.api`),
`keyshard.local` (the embedded broker and the demo). `keyshard.core` is what the
coordinator and its consumers share: slots, ranges, positions, the wire protocol, Kafka
settings and TLS. docs/architecture.md shows how they depend on each other.

coordinator, consumer_client, api and spark_jobs are folders at the top of the
repository, linked in here; installed, they are ordinary subpackages.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("keyshard")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
