"""The default memory budget of a consumer and the Kafka fetch sizes that follow from it.

Here, in the kernel, because the command line, the Spark jobs and the consumer all take
the budget (`max_buffer_bytes`), and the command line must not import the consumer to
show its default. What the budget bounds, and how, is `consumer_client._datapath.budget`.
"""

from __future__ import annotations

#: The default budget: records of 64 MiB. A consumer process then stays near 150 MiB
#: resident (interpreter, libraries, aiokafka's fetch buffer), within a 256 MiB request.
DEFAULT_MAX_BUFFER_BYTES = 64 * 1024 * 1024
#: The smallest budget accepted: below it every batch would be a record or two.
MIN_BUFFER_BYTES = 64 * 1024
#: Kafka's own default per-partition fetch size: the most a budget makes it.
KAFKA_PARTITION_FETCH_BYTES = 1024 * 1024


def fetch_sizes(max_buffer_bytes: int) -> dict[str, int]:
    """aiokafka's fetch sizes for a budget: what the Kafka client buffers besides it.

    aiokafka keeps at most one fetched response per partition until it is consumed, each
    up to `max_partition_fetch_bytes` (Kafka's default 1 MiB, less for a small budget),
    and a response up to `fetch_max_bytes` per broker (a quarter of the budget, not
    Kafka's 50 MiB default). A first record larger than both still comes whole: brokers
    return at least one record batch."""
    per_partition = min(KAFKA_PARTITION_FETCH_BYTES, max_buffer_bytes // 16)
    return {
        "fetch_max_bytes": max(1, max_buffer_bytes // 4),
        "max_partition_fetch_bytes": max(1, per_partition),
    }
