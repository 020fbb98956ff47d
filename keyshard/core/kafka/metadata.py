"""Partitions from a fresh metadata answer, never from a client's cache.

An aiokafka client caches cluster metadata only for the topics it subscribed to or was
asked about; `partitions_for_topic()` on a fresh consumer answers None for a topic that
exists, on Apache Kafka (Tansu happens to send every topic). Treating that None as "no
partitions" would make Spark read nothing and report success. Every caller that needs a
topic's partitions asks the cluster here instead, and an existing topic whose partitions
cannot be seen is an error, never an empty answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.protocol.metadata import MetadataRequest

from keyshard.core.kafka.no_topic_creation import never_create_topics


class TopicMetadataError(RuntimeError):
    """A topic is missing, not visible to us, or shows no partitions."""


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    """What one metadata answer says about the topics asked for."""

    partitions: dict[str, tuple[int, ...]]  # topics that exist, with their partition ids
    # Not on the cluster, or not visible to this principal: a metadata request for all
    # topics leaves out the ones it may not describe.
    missing: tuple[str, ...]

    def require(self, where: str) -> dict[str, tuple[int, ...]]:
        """The partitions of every topic asked for; any topic missing is an error."""
        if self.missing:
            raise TopicMetadataError(
                f"unknown topic(s) {list(self.missing)}: not on {where} "
                "(or not visible to this client's principal)"
            )
        return self.partitions


async def fetch_partitions(
    client: AIOKafkaClient, topics: Sequence[str], timeout: float
) -> TopicPartitions:
    """Partition ids of `topics` from a metadata request made now.

    A topic listed without partitions is asked about again until `timeout`: it exists,
    so "no partitions" would be a lie that plans an empty read.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        cluster = await asyncio.wait_for(
            client.fetch_all_metadata(), max(0.1, deadline - loop.time())
        )
        known = cluster.topics(exclude_internal_topics=False)
        found = {t: tuple(sorted(cluster.partitions_for_topic(t) or ())) for t in topics}
        empty = [t for t in topics if t in known and not found[t]]
        if not empty:
            return TopicPartitions(
                {t: parts for t, parts in found.items() if parts},
                tuple(t for t in topics if t not in known),
            )
        if loop.time() >= deadline:
            raise TopicMetadataError(
                f"topic(s) {empty} exist but show no partitions after {timeout:g} s"
            )
        await asyncio.sleep(0.1)


async def partitions_of(
    bootstrap_servers: str, topics: Sequence[str], timeout: float, **client_options: Any
) -> TopicPartitions:
    """`fetch_partitions` over a client of its own, closed before returning."""
    client = never_create_topics(
        AIOKafkaClient(bootstrap_servers=bootstrap_servers, **client_options)
    )
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        return await fetch_partitions(client, topics, timeout)
    finally:
        await client.close()


async def cluster_id(client: AIOKafkaClient, timeout: float) -> str | None:
    """The id the cluster gives itself in a metadata answer made now (None: the broker is
    too old to say). It tells a broker that is known to lack something (Tansu's default
    id, say) from one that should have it."""
    request = MetadataRequest([])  # no topics: only the brokers and the cluster's id
    response = await asyncio.wait_for(client.send(client.get_random_node(), request), timeout)
    found = getattr(response, "cluster_id", None)
    return found if isinstance(found, str) else None
