"""Which partitions a replica wants (`ReplicaManager.desired_owners`), with the state log
and the runtime faked: placement only, no Kafka."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from keyshard.coordinator.replication.manager import ReplicaManager, ReplicationSettings
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.kafka_log import ReplicaIdentity
from keyshard.coordinator.storage.log_format import EpochMarker
from keyshard.core.kafka.settings import KafkaSettings


class QuietLog:
    """A state log of two partitions in which no replica beats (all silent)."""

    topic = "state"
    partitions = 2

    def __init__(self) -> None:
        self.identity = ReplicaIdentity("b", "b:1", "http://b:2")
        self.images = {p: PartitionImage(p) for p in range(self.partitions)}

    def alive(self, within_own_beats: int) -> dict[str, Any]:
        return {}


async def test_a_new_replica_waits_for_a_partition_somebody_holds() -> None:
    """Partition 0 is held by replica a, silent since b started (killed, frozen, or cut off
    from Kafka, where it lets go after 1.5 replica timeouts): b takes the free partition at
    once and a's only after 2.5 timeouts (5 s)."""
    log = QuietLog()
    log.images[0].owner = EpochMarker(0, 3, "a", "a:1", "http://a:2")
    manager = ReplicaManager(
        cast(Any, log), cast(Any, SimpleNamespace()), bootstrap="127.0.0.1:1",
        kafka=KafkaSettings.parse(), settings=ReplicationSettings(group_id="replicas"),
    )  # fmt: skip
    now = asyncio.get_running_loop().time()
    manager.started_at = now - 4.9
    assert manager.desired_owners() == {0: "a", 1: "b"}
    manager.started_at = now - 5.1
    assert manager.desired_owners() == {0: "b", 1: "b"}
    released = log.images[0].owner
    log.images[0].owner = EpochMarker(0, 3, "a", "a:1", "http://a:2", released=True)
    manager.started_at = now - 1.5
    assert released is not None and manager.desired_owners() == {0: "b", 1: "b"}


async def test_a_replica_restarted_in_place_takes_its_own_partitions_back_at_once() -> None:
    """Partition 0 was last claimed under b's own id: b was restarted in place (the same
    host and listen address, so the same default id) and the process that held it is
    gone. b wants it back from its first look, before it has listened for other replicas
    and before the group places anyone; partition 1, nobody's, still waits for that."""
    log = QuietLog()
    log.images[0].owner = EpochMarker(0, 3, "b", "b:1", "http://b:2")
    manager = ReplicaManager(
        cast(Any, log), cast(Any, SimpleNamespace()), bootstrap="127.0.0.1:1",
        kafka=KafkaSettings.parse(), settings=ReplicationSettings(group_id="replicas"),
    )  # fmt: skip
    manager.started_at = asyncio.get_running_loop().time()
    assert manager.desired_owners() == {0: "b"}
    manager.started_at -= 1.1
    assert manager.desired_owners() == {0: "b", 1: "b"}
    log.images[0].owner = EpochMarker(0, 3, "b", "b:1", "http://b:2", released=True)
    manager.started_at += 1.1
    assert manager.desired_owners() == {}, "released: nobody holds it, listen first"
