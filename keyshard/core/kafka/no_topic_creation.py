"""Clients of ours never create a topic by asking about it.

aiokafka asks for metadata with `allow_auto_topic_creation` true (the request's default)
and has no setting to turn that off, where Java's consumer has `allow.auto.create.topics`.
On a broker that creates topics on demand (Kafka with `auto.create.topics.enable`, its
default; Tansu always) a fetcher still assigned a deleted topic's partitions asks about the
topic and so creates it again at once, empty: the group never sees it gone, the positions
it keeps point past the new partitions' ends, and a mistyped topic name becomes a topic.

`never_create_topics` makes the metadata requests of one client say false. Every other
client in the process (a user's producer that relies on topics created on demand) keeps
aiokafka's default: the flag is a context variable set only while that client's own
metadata update builds its request.
"""

from __future__ import annotations

import contextvars
from typing import Any, TypeVar

import aiokafka.client
from aiokafka import AIOKafkaClient, AIOKafkaConsumer
from aiokafka.protocol.metadata import MetadataRequest

_NO_CREATION: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "keyshard_no_topic_creation", default=False
)
KafkaClientT = TypeVar("KafkaClientT", AIOKafkaClient, AIOKafkaConsumer)


def _metadata_request(
    topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None
) -> MetadataRequest:
    """aiokafka's `MetadataRequest`, saying "do not create" inside `never_create_topics`."""
    if _NO_CREATION.get():
        allow_auto_topic_creation = False
    return MetadataRequest(topics, allow_auto_topic_creation)


def never_create_topics(kafka: KafkaClientT) -> KafkaClientT:
    """`kafka` (a consumer, or a bare client), whose metadata requests never create a
    topic; returned for use in an expression."""
    client: Any = kafka._client if isinstance(kafka, AIOKafkaConsumer) else kafka
    update = client._metadata_update

    async def update_without_creation(cluster_metadata: Any, topics: Any) -> Any:
        token = _NO_CREATION.set(True)
        try:
            return await update(cluster_metadata, topics)
        finally:
            _NO_CREATION.reset(token)

    client._metadata_update = update_without_creation
    aiokafka.client.MetadataRequest = _metadata_request
    return kafka
