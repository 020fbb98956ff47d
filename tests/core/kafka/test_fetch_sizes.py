"""The Kafka fetch sizes a consumer's memory budget sets (`core.kafka.fetch_sizes`)."""

from __future__ import annotations

from keyshard.core.kafka.fetch_sizes import fetch_sizes


def test_fetch_sizes_follow_the_budget() -> None:
    assert fetch_sizes(64 * 1024 * 1024) == {
        "fetch_max_bytes": 16 * 1024 * 1024,
        "max_partition_fetch_bytes": 1024 * 1024,
    }
    assert fetch_sizes(1024 * 1024) == {
        "fetch_max_bytes": 256 * 1024,
        "max_partition_fetch_bytes": 64 * 1024,
    }
