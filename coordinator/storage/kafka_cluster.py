"""What the coordinator needs of the Kafka cluster besides its state log.

The state topic made right (created compacted, refused when it deletes by age), partition
counts from a fresh metadata answer, a readiness probe, and each group's lowest position
committed as an ordinary Kafka offset so lag tooling sees the group. Every client uses the
coordinator's Kafka settings; a missing permission names the ACL to grant. Every broker
call is bounded by a timeout: after a broker restart some calls retry forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaClient, AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidReplicationFactorError,
    KafkaError,
    NoError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)

from keyshard.coordinator.storage.base import Positions, StoreError
from keyshard.coordinator.storage.kafka_acls import describe_acls
from keyshard.core.kafka.connect import quiet_bootstrap, start_client, unreachable
from keyshard.core.kafka.ends import fetched_ends, partition_ends
from keyshard.core.kafka.metadata import fetch_partitions
from keyshard.core.kafka.no_topic_creation import never_create_topics
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.positions import TopicPartition
from keyshard.core.security.acl import AclBinding, ResourceType

log = logging.getLogger(__name__)
T = TypeVar("T")
#: What the state topic must be, and what a new one is created with.
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact"}
# How replicas read the state topic: a short fetch wait (a takeover waits for its own
# marker to come back, and the default of half a second is that much more for every one),
# polls of a tenth of a second, and a pause after a failure before trying again.
FETCH_WAIT_MS = 20
TAIL_POLL_MS = 100
RETRY_S = 0.5
#: The ends reader's fetches: short waits (a fetch at the end of a partition answers once
#: this is up) and little data (it only needs the answer's high watermark).
ENDS_FETCH_WAIT_MS = 50
ENDS_FETCH_BYTES = 64 * 1024


def denied(settings: KafkaSettings, topic: str, operation: str, err: BaseException) -> StoreError:
    """The error for a refused `operation` on `topic`: the ACL to grant, in full."""
    user, _ = settings.credentials()
    principal = f"User:{user}" if user else "the coordinator's principal"
    return StoreError(
        f"Kafka refused {operation} on topic {topic!r} ({type(err).__name__}): grant "
        f"{principal} the ACL (kafka-acls --add --allow-principal {principal} "
        f"--operation {operation} --topic {topic}); README 'Running on Apache Kafka' lists "
        "every ACL the coordinator needs"
    )


async def ensure_state_topic(
    bootstrap: str, settings: KafkaSettings, topic: str, partitions: int, timeout: float
) -> int:
    """Create the state topic compacted with `partitions` partitions, or check an existing
    one (compacted, or refused: a topic that deletes by age would lose the positions of
    every quiet group). Returns the partition count the topic has."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **settings.admin_options())
    try:
        await start_client(admin, bootstrap, settings, "admin client", timeout)
        existing = await asyncio.wait_for(admin.list_topics(), timeout)
        if topic not in existing:
            await _create(admin, topic, partitions, timeout)
        else:
            await _check_compacted(admin, topic, timeout)
        # A topic just created shows its partitions once the metadata has spread.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            described = await asyncio.wait_for(admin.describe_topics([topic]), timeout)
            count = len(described[0]["partitions"]) if described else 0
            if count >= 1:
                return count
            if loop.time() > deadline:
                raise StoreError(f"state topic {topic!r} shows no partitions after {timeout:g} s")
            await asyncio.sleep(0.1)
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _create(admin: AIOKafkaAdminClient, topic: str, partitions: int, timeout: float) -> None:
    # Replication factor -1: the cluster's default.replication.factor (KIP-464).
    # aiokafka's NewTopic wants replica assignments with a -1; none are given here.
    new = NewTopic(topic, partitions, -1, {}, topic_configs=dict(STATE_TOPIC_CONFIG))
    response = await asyncio.wait_for(admin.create_topics([new]), timeout)
    for _, code, *_ in response.topic_errors:
        error = for_code(code)
        if error is NoError or error is TopicAlreadyExistsError:
            continue
        if error in (TopicAuthorizationFailedError, ClusterAuthorizationFailedError):
            raise StoreError(
                f"Kafka refused to create the state topic {topic!r}: create it yourself "
                f"({partitions} partitions, cleanup.policy=compact) or grant the "
                "coordinator's principal Create on it"
            )
        if error is InvalidReplicationFactorError:  # brokers before 2.4 need a number
            retry = NewTopic(topic, partitions, 1, topic_configs=dict(STATE_TOPIC_CONFIG))
            await asyncio.wait_for(admin.create_topics([retry]), timeout)
            continue
        raise StoreError(f"cannot create the state topic {topic!r}: {error.__name__}")


async def _check_compacted(admin: AIOKafkaAdminClient, topic: str, timeout: float) -> None:
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})
    try:
        (response,) = await asyncio.wait_for(admin.describe_configs([resource]), timeout)
    except (KafkaError, ValueError) as err:  # a broker without DescribeConfigs
        log.warning(
            "cannot check that state topic %r is compacted (%s): make sure its "
            "cleanup.policy is compact", topic, err,
        )  # fmt: skip
        return
    for _code, _message, _type, _name, entries, *_ in response.resources:
        values = {entry[0]: entry[1] for entry in entries}
        policy = values.get("cleanup.policy") or ""
        if "compact" not in policy.split(","):
            raise StoreError(
                f"state topic {topic!r} exists with cleanup.policy={policy or 'delete'}; "
                "keyshard needs compact (it keeps the latest record of every group for as "
                "long as the group exists): kafka-configs --alter --entity-type topics "
                f"--entity-name {topic} --add-config cleanup.policy=compact"
            )


class KafkaCluster:
    """`ClusterMetadata` (coordinator.storage.base), and the offset commits for tooling."""

    def __init__(self, bootstrap: str, settings: KafkaSettings, timeout: float = 10.0) -> None:
        self.bootstrap = bootstrap
        self.settings = settings
        self.timeout = timeout
        self._metadata: AIOKafkaClient | None = None
        self._committers: dict[str, AIOKafkaConsumer] = {}
        self._commit_locks: dict[str, asyncio.Lock] = {}
        # One reader, in no group, for where partitions end: one question at a time
        # (each replaces its assignment).
        self._reader: AIOKafkaConsumer | None = None
        self._reader_lock = asyncio.Lock()
        # And one reading committed data, for the partition watcher's regular question:
        # its own, so a slow check of a member's report does not hold the watcher up.
        self._committed_reader: AIOKafkaConsumer | None = None
        self._committed_reader_lock = asyncio.Lock()

    async def start(self) -> None:
        self._metadata = never_create_topics(
            AIOKafkaClient(bootstrap_servers=self.bootstrap, **self.settings.client_options())
        )
        try:
            with quiet_bootstrap():
                await asyncio.wait_for(self._metadata.bootstrap(), self.timeout)
        except (KafkaError, OSError, TimeoutError) as err:
            # The first client of the daemon: its failure is the one line a wrong password,
            # an untrusted certificate or a wrong address gets, naming what to check.
            await self.stop()
            raise await unreachable(
                err, self.bootstrap, self.settings, "cluster metadata", self.timeout
            ) from err

    async def stop(self) -> None:
        readers = (self._reader, self._committed_reader)
        self._reader = self._committed_reader = None
        for client in (*readers, *self._committers.values()):
            await self._stop(client)
        self._committers.clear()
        if self._metadata is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._metadata.close(), self.timeout)
            self._metadata = None

    async def partition_counts(self, topics: tuple[str, ...]) -> dict[str, int]:
        """Partition count of every topic that exists (missing topics are left out)."""
        if self._metadata is None:
            raise StoreError("cluster metadata is not started")
        # A fresh metadata fetch each time: topics created after start-up must be seen.
        answer = await fetch_partitions(self._metadata, topics, self.timeout)
        return {topic: len(parts) for topic, parts in answer.partitions.items()}

    async def topic_counts(self) -> dict[str, int]:
        """Partition count of every topic on the cluster, internal ones included."""
        if self._metadata is None:
            raise StoreError("cluster metadata is not started")
        cluster = await asyncio.wait_for(self._metadata.fetch_all_metadata(), self.timeout)
        return {
            topic: len(cluster.partitions_for_topic(topic) or ())
            for topic in cluster.topics(exclude_internal_topics=False)
        }

    async def partition_ends(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Where each partition ends for a reader of committed data (a fetch answer's last
        stable offset: keyshard.core.kafka.ends), read by a consumer kept for it (the
        partition watcher asks every few seconds); one read at a time."""
        async with self._committed_reader_lock:
            try:
                if self._committed_reader is None:
                    reader = AIOKafkaConsumer(
                        bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                        isolation_level="read_committed", **self.settings.client_options(),
                    )  # fmt: skip
                    self._committed_reader = await self._started(never_create_topics(reader))
                return await partition_ends(self._committed_reader, partitions, self.timeout)
            except BaseException:
                # One stuck on a partition or a broker: a fresh one next time.
                reader, self._committed_reader = self._committed_reader, None
                await self._stop(reader)
                raise

    async def high_watermarks(
        self, partitions: Sequence[TopicPartition], needed: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each partition's high watermark: ListOffsets, and where that answers less than
        `needed`, a fetch's answer (right on brokers whose ListOffsets under-reports,
        keyshard.core.kafka.ends) from the listed offset on."""

        async def read(reader: AIOKafkaConsumer) -> dict[TopicPartition, int]:
            ktps = [KafkaTP(*tp) for tp in partitions]
            listed = await asyncio.wait_for(reader.end_offsets(ktps), self.timeout)
            ends = {tp: int(listed[KafkaTP(*tp)]) for tp in partitions}
            short = [tp for tp in partitions if ends[tp] < needed.get(tp, 0)]
            if short:
                seek = {KafkaTP(*tp): ends[tp] for tp in short}
                fetched = await fetched_ends(reader, short, seek, self.timeout)
                for tp in short:
                    ends[tp] = max(ends[tp], fetched[tp])
            return ends

        return await self._with_reader(read)

    async def earliest_offsets(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Each partition's log start offset (ListOffsets earliest)."""
        ktps = [KafkaTP(*tp) for tp in partitions]
        found = await self._with_reader(
            lambda reader: asyncio.wait_for(reader.beginning_offsets(ktps), self.timeout)
        )
        return {tp: int(found[KafkaTP(*tp)]) for tp in partitions}

    async def offsets_for_times(
        self, partitions: Sequence[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """Each partition's first offset at or after `timestamp_ms`, None past its last
        record (ListOffsets by timestamp). Kafka answers that with no offset; Tansu with
        offset 0 and timestamp -1, which names no record either."""
        ktps = [KafkaTP(*tp) for tp in partitions]
        asked = dict.fromkeys(ktps, timestamp_ms)
        found = await self._with_reader(
            lambda reader: asyncio.wait_for(reader.offsets_for_times(asked), self.timeout)
        )
        answers = {tp: found.get(KafkaTP(*tp)) for tp in partitions}
        return {
            tp: None if a is None or a.timestamp < 0 else int(a.offset) for tp, a in answers.items()
        }

    async def committed_offsets(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed Kafka offsets, asked partition by partition (a broker
        may not answer a request for every partition of a group: DESIGN.md §3)."""
        async with self._commit_locks.setdefault(group, asyncio.Lock()):
            committer = await self._committer(group)
            found: dict[TopicPartition, int | None] = {}
            for tp in partitions:
                offset = await asyncio.wait_for(committer.committed(KafkaTP(*tp)), self.timeout)
                found[tp] = None if offset is None else int(offset)
            return found

    async def _with_reader(self, use: Callable[[AIOKafkaConsumer], Awaitable[T]]) -> T:
        """`use` the ends reader, one caller at a time; a fresh reader next time when it
        failed (one stuck on a partition or a broker)."""
        async with self._reader_lock:
            reader = await self._open_reader()
            try:
                return await use(reader)
            except BaseException:
                reader, self._reader = self._reader, None
                await self._stop(reader)
                raise

    async def _open_reader(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                fetch_max_wait_ms=ENDS_FETCH_WAIT_MS, max_partition_fetch_bytes=ENDS_FETCH_BYTES,
                **self.settings.client_options(),
            )  # fmt: skip
            self._reader = await self._started(never_create_topics(reader))
        return self._reader

    async def _started(self, client: AIOKafkaConsumer) -> AIOKafkaConsumer:
        """`client` started within the timeout; stopped again if it could not start, so a
        half-started client holds no connection."""
        try:
            await asyncio.wait_for(client.start(), self.timeout)
        except BaseException:
            await self._stop(client)
            raise
        return client

    async def _stop(self, client: AIOKafkaConsumer | None) -> None:
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.stop(), self.timeout)

    async def probe(self) -> None:
        """One metadata round trip to the cluster: raises when Kafka is unreachable (the
        readiness check; the caller bounds it with a short timeout)."""
        if self._metadata is None:
            raise StoreError("cluster metadata is not started")
        await self._metadata.fetch_all_metadata()

    async def describe_acls(self, resource: ResourceType) -> tuple[AclBinding, ...]:
        """Every ACL of `resource`'s type on the cluster (coordinator.storage.kafka_acls)."""
        if self._metadata is None:
            raise StoreError("cluster metadata is not started")
        user, _ = self.settings.credentials()
        principal = f"User:{user}" if user else "the coordinator's principal"
        return await describe_acls(self._metadata, resource, self.timeout, principal)

    async def commit_low_watermarks(self, group: str, positions: Positions) -> None:
        """Best effort: tooling visibility only, never the source of truth.

        One commit per group at a time: every position write sets one off, and two that
        overlap must not each start a committer (one of them would leak)."""
        offsets = {
            KafkaTP(topic, partition): pmap.minimum_offset()
            for (topic, partition), pmap in positions.items()
        }
        if not offsets:
            return
        async with self._commit_locks.setdefault(group, asyncio.Lock()):
            try:
                committer = await self._committer(group)
                assigned = set(committer.assignment())
                if not set(offsets) <= assigned:
                    committer.assign(sorted(assigned | set(offsets)))
                    committer.pause(*committer.assignment())  # commit only, never fetch
                await asyncio.wait_for(committer.commit(offsets), self.timeout)
            except (KafkaError, TimeoutError, OSError) as err:
                log.warning("could not commit low watermarks of group %r: %s", group, err)

    async def _committer(self, group: str) -> AIOKafkaConsumer:
        committer = self._committers.get(group)
        if committer is None:
            options: dict[str, Any] = self.settings.consumer_options()
            committer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False,
                **options,
            )  # fmt: skip
            self._committers[group] = await self._started(never_create_topics(committer))
        return committer
