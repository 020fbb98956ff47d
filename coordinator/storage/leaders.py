"""Who leads one partition of the state topic, as the cluster says it now, and whether
that leader answers us: what a replica whose beats stop needs to tell Kafka's own
failover from its own isolation (`coordinator.replication.liveness`).

A client of its own, asking every broker it knows at once and taking the first answer:
the producers' clients retry on their own schedule, and what is wanted here is the
cluster's answer now.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka import TopicPartition as KafkaTP
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from keyshard.core.kafka.connect import quiet_bootstrap
from keyshard.core.kafka.settings import KafkaSettings


@dataclass(frozen=True, slots=True)
class LeaderSight:
    leader: int | None  # None: the partition has no leader now
    leader_answers: bool  # a connection to the leader could be made
    silent_follower: int | None = None  # an in-sync follower no connection could be made to


class LeaderProbe:
    def __init__(
        self,
        bootstrap: str,
        settings: KafkaSettings,
        topic: str,
        partition: int,
        timeout: float,
    ) -> None:
        self.bootstrap = bootstrap
        self.settings = settings
        self.partition = KafkaTP(topic, partition)
        self.timeout = timeout
        self._client: AIOKafkaClient | None = None

    async def start(self) -> None:
        client = AIOKafkaClient(bootstrap_servers=self.bootstrap, **self.settings.client_options())
        with quiet_bootstrap():
            await asyncio.wait_for(client.bootstrap(), self.timeout)
        self._client = client

    async def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._client.close(), self.timeout)
            self._client = None

    async def look(self) -> LeaderSight | None:
        """The partition's leader as the first broker to answer says it (None: none
        answered within the timeout). Every broker known is asked at once: one that went
        away must not make the answer late, since a late answer is no answer."""
        client = self._client
        if client is None:
            return None
        request = MetadataRequest([self.partition.topic])
        asks = [
            asyncio.ensure_future(client.send(broker.nodeId, request))
            for broker in client.cluster.brokers()
        ]
        try:
            for next_answer in asyncio.as_completed(asks, timeout=self.timeout):
                try:
                    response = await next_answer
                except (KafkaError, OSError):
                    continue
                return await self._sight(client, response)
        except TimeoutError:
            pass
        finally:
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        return None

    async def _sight(self, client: AIOKafkaClient, response: Any) -> LeaderSight:
        answer = ClusterMetadata()
        answer.update_metadata(response)
        if answer.brokers():
            client.cluster.update_metadata(response)  # brokers that came back
        leader = answer.leader_for_partition(self.partition)
        if leader is None or leader < 0:
            return LeaderSight(None, False)
        followers = [node for node in _in_sync(response, self.partition) if node != leader]
        answers = await asyncio.gather(
            *(self._answers(client, node) for node in [leader, *followers])
        )
        silent = [node for node, ok in zip(followers, answers[1:], strict=True) if not ok]
        return LeaderSight(leader, answers[0], silent[0] if silent else None)

    async def _answers(self, client: AIOKafkaClient, node: int) -> bool:
        try:
            return bool(await asyncio.wait_for(client.ready(node), self.timeout))
        except (KafkaError, OSError, TimeoutError):
            return False


def _in_sync(response: Any, partition: KafkaTP) -> list[int]:
    """The in-sync replicas of `partition` in a MetadataResponse (a topic is (error, name,
    [is_internal,] partitions), a partition (error, index, leader, replicas, isr, ...))."""
    for topic in response.topics:
        if topic[1] == partition.topic:
            for entry in topic[-1]:
                if entry[1] == partition.partition:
                    return list(entry[4])
    return []
