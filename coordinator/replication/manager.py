"""One replica's part in sharing the state partitions: who owns what, taking over and
handing over (the design: coordinator/replication/__init__.py).

Three inputs decide which partitions this replica serves, and they agree by construction:
- the Kafka consumer group of the replicas on the state topic: its leader runs
  `placement.assign` over every member's claim and hands everyone the whole answer (the
  directory), as Kafka's own group coordinator places groups on `__consumer_offsets`;
- the replicas' beats in the state log: a replica whose beats stopped (`kill -9`, a frozen
  process, a network cut) loses its partitions to the survivors at once
  (`placement.take_orphans`), long before Kafka's session timeout would notice;
- the coordinator epoch of each partition: claiming fences the previous owner, and a
  replica whose partition shows a newer epoch than its own has been fenced and lets go.

Where another replica is (its consumer address, its admin URL) is believed only from its
beats; with a replica secret they are signed (`coordinator.storage.signing`), and only
then is an address *verified*: the admin API forwards nothing, and no credential, to one
that is not. Without a secret a lone replica works as it always did, and several warn
that the state topic is unauthenticated (`warn_if_unauthenticated`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from keyshard.coordinator.replication.liveness import (
    DEFAULT_LEADER_FAILOVER_MS,
    HELD_PATIENCE,
    BeatPartitionView,
    Standing,
    Verdict,
    standing,
)
from keyshard.coordinator.replication.placement import (
    Owners,
    ReplicaClaim,
    assign,
    next_version,
    take_orphans,
)
from keyshard.coordinator.runtime.location import Location
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.storage.base import partition_of
from keyshard.coordinator.storage.image import PartitionImage
from keyshard.coordinator.storage.kafka_log import KafkaStateLog, ReplicaIdentity
from keyshard.coordinator.storage.leaders import LeaderProbe
from keyshard.coordinator.storage.log_format import ReplicaBeat
from keyshard.core.kafka.connect import start_client
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.security.log_safety import printable

log = logging.getLogger(__name__)
ASSIGNOR_NAME = "keyshard-replicas"
#: Where replicas beat (coordinator.storage.kafka_log): the partition whose leader decides
#: whether beats get through.
BEAT_PARTITION = 0
# A claim fences, reads a partition to its end and writes a marker: bounded as a whole,
# in state log timeouts, so one stuck on a broker that went away is tried afresh.
CLAIM_TIMEOUTS = 8


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    group_id: str
    beat_interval_s: float = 0.5
    # Beats silent this long: the replica is gone and its partitions are taken over.
    replica_timeout_s: float = 2.0
    # Kafka's own failure detection for the group (brokers refuse less than 6 s).
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 1_000
    # The longest Kafka failover of the beat partition a replica rides through holding
    # (coordinator.replication.liveness).
    leader_failover_s: float = DEFAULT_LEADER_FAILOVER_MS / 1000


@dataclass(frozen=True, slots=True)
class Directory:
    """The group leader's answer: every partition's replica, and where replicas are."""

    owners: Owners
    replicas: Mapping[str, ReplicaClaim]
    version: int = 0  # `placement.next_version`: newer placements have higher ones


def _claim_bytes(claim: ReplicaClaim) -> bytes:
    return json.dumps(
        {"id": claim.replica_id, "address": claim.address, "admin": claim.admin_url,
         "holds": {str(p): e for p, e in claim.holds.items()}, "version": claim.version}
    ).encode()  # fmt: skip


def _claim_of(data: bytes) -> ReplicaClaim:
    raw = json.loads(data)
    holds = {int(p): int(e) for p, e in raw.get("holds", {}).items()}
    return ReplicaClaim(
        str(raw["id"]), str(raw["address"]), str(raw["admin"]), holds, int(raw.get("version", 0))
    )


def _directory_bytes(owner: Owners, claims: Iterable[ReplicaClaim], version: int) -> bytes:
    return json.dumps(
        {"assignment": {str(p): r for p, r in owner.items()},
         "replicas": {c.replica_id: {"address": c.address, "admin": c.admin_url}
                      for c in claims},
         "version": version}
    ).encode()  # fmt: skip


def _directory_of(data: bytes) -> Directory:
    raw = json.loads(data)
    replicas = {
        rid: ReplicaClaim(rid, str(r["address"]), str(r["admin"]))
        for rid, r in raw["replicas"].items()
    }
    owners = {int(p): str(r) for p, r in raw["assignment"].items()}
    return Directory(owners, replicas, int(raw.get("version", 0)))


def _assignor_for(manager: ReplicaManager) -> type[AbstractPartitionAssignor]:
    """Kafka's client asks assignors through class methods: one class per manager. They
    run on the liveness thread, beside the group's consumer: they read the manager's
    values that are replaced whole (the owned partitions' copy, the beat view, the
    directory) and hand the group's answer to the main loop (`placed`)."""

    class ReplicaAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = ASSIGNOR_NAME

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(0, sorted(topics), _claim_bytes(manager.claim()))

        @classmethod
        def assign(
            cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            claims = {member_id: _claim_of(meta.user_data) for member_id, meta in members.items()}
            owner = assign(manager.partitions, claims.values())
            version = next_version(claims.values(), manager.versions_seen())
            directory = _directory_bytes(owner, claims.values(), version)
            topic = manager.topic
            return {
                member_id: ConsumerProtocolMemberAssignment(
                    0,
                    [(topic, sorted(p for p, r in owner.items() if r == claim.replica_id))],
                    directory,
                )
                for member_id, claim in claims.items()
            }

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            manager.placed(_directory_of(assignment.user_data))

    return ReplicaAssignor


class _PauseAll(ConsumerRebalanceListener):  # type: ignore[misc]
    """The group consumer only places replicas; the log is read by the tailer."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, _revoked: Any) -> None:
        pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.consumer.pause(*assigned)


class ReplicaManager:
    def __init__(
        self,
        log: KafkaStateLog,
        runtime: CoordinatorRuntime,
        *,
        bootstrap: str,
        kafka: KafkaSettings,
        settings: ReplicationSettings,
    ) -> None:
        self.log = log
        self.runtime = runtime
        self.identity: ReplicaIdentity = log.identity
        self.bootstrap = bootstrap
        self.kafka = kafka
        self.settings = settings
        self.topic = log.topic
        self.directory: Directory | None = None
        self.desired: Owners = {}
        self.started_at = 0.0
        self._group: AIOKafkaConsumer | None = None  # on the liveness thread
        self._polling: concurrent.futures.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._stopping = False
        # Liveness is counted in our own beats (coordinator.storage.kafka_log): a replica
        # silent for this many of them is gone.
        self._timeout_beats = max(
            2, math.ceil(settings.replica_timeout_s / settings.beat_interval_s)
        )
        # When we first saw a partition we should own held by a live replica acting on an
        # older placement: it gets that long to hand over before we take it.
        self._behind_since: dict[int, float] = {}
        self._fenced_producers: set[int] = set()
        # Handed over, at this epoch, but the released marker is not written yet.
        self._unreleased: dict[int, int | None] = {}
        self._warned_unauthenticated = False
        # What the cluster last said of the beat partition, for `liveness.standing`.
        self._beat_partition = BeatPartitionView()
        self._probe = LeaderProbe(
            bootstrap, kafka, log.topic, BEAT_PARTITION, settings.replica_timeout_s / 4
        )
        self._standing = Standing.SERVING
        runtime.on_fenced = self._on_fenced

    def _on_fenced(self, partition: int) -> None:
        self._fenced_producers.add(partition)
        self._changed.set()

    @property
    def partitions(self) -> int:
        return self.log.partitions

    @property
    def ready(self) -> bool:
        """Caught up on every partition (a hot standby) and placed by the group."""
        return self.log.caught_up and self.directory is not None

    def not_ready_reason(self) -> str | None:
        """Why this replica should not get traffic yet (readiness), or None."""
        if not self.log.caught_up:
            return "catching up on the state log (a hot standby reads every partition)"
        if self.directory is None and not self.desired:
            return "not placed yet by the replicas' group"
        me = self.identity.replica_id
        owned = self.runtime.owned_partitions()
        taking = sorted(p for p, r in self.desired.items() if r == me and p not in owned)
        if taking:
            return f"taking over state partition(s) {taking}"
        return None

    def claim(self) -> ReplicaClaim:
        """What this replica says of itself when the group assigns."""
        return ReplicaClaim(
            self.identity.replica_id, self.identity.address, self.identity.admin_url,
            self.runtime.owned_partitions(), self.placement_version,
        )  # fmt: skip

    @property
    def placement_version(self) -> int:
        return self.directory.version if self.directory is not None else 0

    def versions_seen(self) -> list[int]:
        """Placement versions the live replicas' beats and the partitions' claims name
        (the group leader goes above them all)."""
        beats = [beat.placement_version for beat in self._alive().values()]
        claims = [i.owner.placement_version for i in self.log.images.values() if i.owner]
        return beats + claims

    def _alive(self) -> dict[str, ReplicaBeat]:
        return self.log.alive(self._timeout_beats)

    def directory_arrived(self, directory: Directory) -> None:
        self.directory = directory
        self.log.act_on(directory.version)
        log.info(
            "replica placement: %s",
            ", ".join(f"{p}->{r}" for p, r in sorted(directory.owners.items())),
        )
        self._changed.set()

    # ---- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self.started_at = loop.time()
        # The group's heartbeats, like the beats, go on while this loop is busy: a member
        # silent for its session timeout is dropped, and the group places its partitions
        # on the others (`coordinator.storage.loop_thread`).
        await self.log.liveness.run(self._join_group())
        self._polling = self.log.liveness.spawn(self._poll_group())
        self.log.beat_every(self.settings.beat_interval_s, self.placement_version)
        self._tasks = [
            asyncio.create_task(self._look_again(), name="replica-placement-tick"),
            asyncio.create_task(self._place(), name="replica-placement"),
            asyncio.create_task(self._watch_own_beats(), name="replica-cut-off-watch"),
            asyncio.create_task(self._watch_beat_partition(), name="replica-kafka-watch"),
        ]

    async def stop(self) -> None:
        """Hand every partition over before exiting: store each group, tell its members
        to find the new owner, say so in a last beat, and leave the group (which makes
        Kafka rebalance at once)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for partition in list(self.runtime.owned_partitions()):
            try:
                await self._hand_over(partition, "the coordinator replica is shutting down")
            except Exception as err:  # the others take it after the replica timeout
                log.warning("handing over state partition %d failed: %s", partition, err)
        with contextlib.suppress(Exception):
            await self.log.beat(leaving=True)
        if self._polling is not None:
            self._polling.cancel()
        if self._group is not None:
            with contextlib.suppress(Exception):
                await self.log.liveness.run(asyncio.wait_for(self._group.stop(), 10))
        await self._probe.stop()

    def placed(self, directory: Directory) -> None:
        """The group's answer, on the liveness thread: the main loop takes it in."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.directory_arrived, directory)

    # ---- on the liveness thread -----------------------------------------------------------

    async def _join_group(self) -> None:
        group = self._group = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.settings.group_id,
            enable_auto_commit=False,
            partition_assignment_strategy=(_assignor_for(self),),
            session_timeout_ms=self.settings.session_timeout_ms,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms,
            max_poll_interval_ms=300_000,
            **self.kafka.consumer_options(),
        )
        await start_client(group, self.bootstrap, self.kafka, "replica group", 30.0)
        group.subscribe([self.topic], listener=_PauseAll(group))

    async def _poll_group(self) -> None:
        """Keep the group membership alive (its partitions are paused: nothing is read)."""
        assert self._group is not None
        while True:
            try:
                await self._group.getmany(timeout_ms=1000)
            except Exception as err:  # the beats still place partitions meanwhile
                log.warning("the replicas' Kafka group failed (retrying): %s", err)
                await asyncio.sleep(self.settings.beat_interval_s)

    async def _look_again(self) -> None:
        """Place again every beat interval: what the beats say changes without telling
        (the beat thread writes and reads them, `coordinator.storage.beats`)."""
        while True:
            self._changed.set()
            await asyncio.sleep(self.settings.beat_interval_s)

    async def _watch_own_beats(self) -> None:
        """Apart from `_beat`: a beat to a cut-off Kafka blocks for the write timeout."""
        while True:
            await asyncio.sleep(self.settings.beat_interval_s / 4)
            self._stop_serving_if_cut_off()

    async def _watch_beat_partition(self) -> None:
        """Ask the cluster, twice a beat interval, who leads the beat partition and
        whether that leader answers: what tells Kafka's own failover from isolation, from
        an answer given since the beats stopped getting through."""
        loop = asyncio.get_running_loop()
        started = False
        while True:
            try:
                if not started:
                    await self._probe.start()
                    started = True
                sight = await self._probe.look()
            except Exception as err:  # a dead watch would make every silence isolation
                log.debug("asking Kafka for the beat partition's leader failed: %s", err)
                sight = None
            if sight is not None:
                self._beat_partition = self._beat_partition.seen(
                    loop.time(), sight.leader, sight.leader_answers, sight.silent_follower
                )
            await asyncio.sleep(self.settings.beat_interval_s / 2)

    def _stop_serving_if_cut_off(self) -> None:
        """A replica whose own beats stop coming back from the log may be cut off from
        Kafka while its consumers still reach it: the others take its partitions over
        after the replica timeout, so it must stop commanding (and pinging, which renews
        their leases) well before that. It lets go of every partition at half the
        timeout; consumers ride through to the new owner, or back to it. Unless Kafka's
        own failover explains the silence (`liveness.standing`): then it holds."""
        verdict = self._verdict()
        self._note(verdict)
        owned = self.runtime.owned_partitions()
        if owned and verdict.standing is Standing.CUT_OFF:
            for partition in list(owned):
                self.runtime.release_partition(partition, f"cut off: {verdict.reason}")
                self._fenced_producers.add(partition)

    def _note(self, verdict: Verdict) -> None:
        """Say once when this replica starts holding, lets go, or serves again."""
        if verdict.standing is self._standing:
            return
        if verdict.standing is Standing.HOLDING:
            log.warning("holding every state partition: %s", verdict.reason)
        elif verdict.standing is Standing.SERVING:
            log.info("beats reach Kafka again (was %s)", self._standing.value)
        self._standing = verdict.standing

    # ---- placement ----------------------------------------------------------------------

    def desired_owners(self) -> Owners:
        """Every partition's owner as this replica sees it now (see the module docstring).

        The group's placement, with the partitions of replicas whose beats stopped given
        to live ones (`take_orphans`); and a live replica that claimed a partition under
        this placement or a newer one keeps it (a takeover sticks until the group places
        again, so a replica back from a freeze does not take its old partitions back).
        Before the group has placed anyone, this replica takes everything only once it
        has listened to beats long enough to know that no other replica is alive (two
        beat intervals): a lone coordinator starts at once, and one of several waits for
        the group's answer. A partition still held by a replica it has not heard from
        since it started (killed, frozen, or cut off from Kafka) it takes only after
        `HELD_PATIENCE` replica timeouts: a lone holder that lost Kafka lets go after
        `LONE_CUT_OFF` (`cut_off`), so the two never serve it at once.

        A partition last claimed under this replica's own id (it was restarted in place:
        the same name, `keyshard.daemon.default_replica_id`) is its own from the start:
        the process that held it is gone, since the id is never shared by live
        processes, so there is nobody to listen for or be patient with, and its
        consumers' leases are running out. The claim takes the next epoch, as any claim
        does: a write of the old process still in flight carries the older one and is
        ignored.
        """
        me = self.identity.replica_id
        alive = set(self._alive()) | {me}
        if self.directory is not None:
            members = set(self.directory.replicas) | {me}
            owners = take_orphans(self.directory.owners, self.partitions, alive & members)
        elif alive == {me} and self._listened() >= 2 * self.settings.beat_interval_s:
            owners = take_orphans({}, self.partitions, [me])
        else:
            return {p: me for p, image in self.log.images.items() if image.holder == me}
        patience = HELD_PATIENCE * self.settings.replica_timeout_s
        patient = self.directory is None and self._listened() < patience
        for partition, image in self.log.images.items():
            claim = image.owner
            if claim is None or claim.released:
                continue
            sticks = claim.replica_id in alive and claim.placement_version >= self.placement_version
            if sticks or (patient and claim.replica_id != me):
                owners[partition] = claim.replica_id
        return owners

    def _verdict(self) -> Verdict:
        """Serve, hold or let go, from what this replica observed (`liveness.standing`).
        A lone coordinator waits longer before letting go (see `cut_off`). Our last beat
        is the last one Kafka acknowledged or we read back, whichever is later: the beat
        thread's reader may lag behind its producer on a busy machine."""
        settings = self.settings
        beats = self.log.beat_view
        return standing(
            now=asyncio.get_running_loop().time(),
            last_beat_at=max(beats.own_beat_seen_at, beats.own_beat_acked_at, self.started_at),
            view=self._beat_partition,
            others_alive=bool(set(beats.alive(self._timeout_beats)) - {self.identity.replica_id}),
            others_heard_at=beats.other_beat_seen_at,
            replica_timeout_s=settings.replica_timeout_s,
            hold_limit_s=settings.leader_failover_s,
        )

    def _listened(self) -> float:
        return asyncio.get_running_loop().time() - self.started_at

    async def _place(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            if not self.log.caught_up:
                await asyncio.sleep(0.05)
                self._changed.set()
                continue
            self.warn_if_unauthenticated()
            try:
                await self.reconcile_ownership()
            except Exception as err:  # a dead placement task never takes over again
                log.warning("taking over or handing over a state partition failed: %s", err)
                await asyncio.sleep(self.settings.beat_interval_s)
                self._changed.set()

    async def reconcile_ownership(self) -> None:
        me = self.identity.replica_id
        self.desired = desired = self.desired_owners()
        owned = self.runtime.owned_partitions()
        for partition in sorted(set(self._unreleased) - set(owned)):
            await self._say_released(partition)
        # Partitions let go of without a hand-over (fenced, cut off): their producer goes.
        for partition in sorted(self._fenced_producers - set(owned)):
            await self.log.release(partition)
            self._fenced_producers.discard(partition)
        for partition, epoch in owned.items():
            newer = self.log.images[partition].epoch > epoch
            if newer:
                self.runtime.release_partition(partition, "fenced: another coordinator has it")
                await self.log.release(partition)
            elif desired.get(partition, me) != me:
                await self._hand_over(partition, f"the group moved to {desired[partition]}")
        if self._verdict().standing is not Standing.SERVING:
            return  # no claim while our own beats do not get through (`_watch_own_beats`)
        wanted = [
            p for p, r in sorted(desired.items())
            if r == me and p not in self.runtime.owned_partitions() and self._may_claim(p)
        ]  # fmt: skip
        claims = await asyncio.gather(*map(self._claim, wanted), return_exceptions=True)
        failed: BaseException | None = None
        for partition, claimed in zip(wanted, claims, strict=True):
            if isinstance(claimed, BaseException):
                failed = claimed
            else:
                self.runtime.adopt_partition(partition, *claimed)
        if failed is not None:
            raise failed

    async def _claim(self, partition: int) -> tuple[int, PartitionImage]:
        """Claim `partition`, bounded: one stuck on a broker that went away gives way to a
        fresh one at the next reconcile (its writer goes; a claim may fence anyway)."""
        try:
            return await asyncio.wait_for(
                self.log.claim(partition, self.placement_version),
                CLAIM_TIMEOUTS * self.log.timeout,
            )
        except TimeoutError:
            await self.log.release(partition)
            raise

    def _may_claim(self, partition: int) -> bool:
        """Whether to claim a partition the placement gives us now. Claiming fences the
        holder, so not while a live holder may still hand it over in order (stored, its
        members told, a released marker written): only once nobody holds it, its holder
        is gone, or its holder acts on an older placement and has had a replica timeout
        to catch up. A holder on a placement as new as ours or newer is never fenced by
        us: either it hands over, or ours is the stale view (a replica back from a
        freeze)."""
        holder = self.log.images[partition].holder
        alive = self._alive()
        if holder is None or holder == self.identity.replica_id or holder not in alive:
            self._behind_since.pop(partition, None)
            return True
        if alive[holder].placement_version >= self.placement_version:
            self._behind_since.pop(partition, None)
            return False
        now = asyncio.get_running_loop().time()
        since = self._behind_since.setdefault(partition, now)
        return now - since >= self.settings.replica_timeout_s

    async def _hand_over(self, partition: int, reason: str) -> None:
        epoch = self.runtime.owned_partitions().get(partition)
        for group in self.runtime.groups_in(partition):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.runtime.writer.flush(group), 5)
        self.runtime.release_partition(partition, reason)
        self._unreleased[partition] = epoch
        await self._say_released(partition)

    async def _say_released(self, partition: int) -> None:
        """Write the released marker of a partition we stopped serving. Until it is in the
        log the others see us holding the partition and wait; a failed write is tried
        again at every reconcile."""
        await self.log.release(partition, handed_over_at=self._unreleased[partition])
        del self._unreleased[partition]

    def warn_if_unauthenticated(self) -> None:
        """Once, when another replica shares the state topic and there is no replica
        secret: anyone who can write to the topic can pose as a replica. (Refusing to run
        instead would take down every replica of a deployment the moment it upgrades,
        all at once; meanwhile nothing is forwarded to an address that cannot be
        verified, so no credential goes to a forger.)"""
        if self.log.secret is not None or self._warned_unauthenticated:
            return
        others = sorted(set(self._alive()) - {self.identity.replica_id})
        if not others:
            return
        self._warned_unauthenticated = True
        log.warning(
            "the state topic %s is unauthenticated: replica(s) %s share it and no "
            "--replica-secret-file is set, so anyone who can write to it can pose as a "
            "replica; the admin API forwards no request to another replica until every "
            "replica has the same secret (docs/operations/high-availability.md)",
            self.topic, ", ".join(printable(r) for r in others),
        )  # fmt: skip

    # ---- where groups are ---------------------------------------------------------------

    def locate(self, group: str) -> Location:
        """Who serves `group`: this replica if it does; else the replica the log says
        holds its partition, if alive; else (a takeover under way) whom the placement
        names, as not serving yet."""
        partition = partition_of(group, self.partitions)
        me = self.identity
        image = self.log.images.get(partition)
        epoch = image.epoch if image is not None else 0
        if partition in self.runtime.owned_partitions():
            return Location(me.replica_id, me.address, me.admin_url, epoch, True, True, True)
        holder = image.holder if image is not None else None
        if holder is not None and holder != me.replica_id and holder in self._alive():
            where = self._where(holder)
            if where is not None:
                return Location(holder, *where[:2], epoch, True, False, where[2])
        owner = self.desired.get(partition)
        if owner == me.replica_id:
            return Location(me.replica_id, me.address, me.admin_url, epoch, False, True, True)
        where = self._where(owner)
        if owner is None or where is None:
            return Location(None, None, None, epoch, False, False)
        return Location(owner, *where[:2], epoch, False, False, where[2])

    def peers(self) -> dict[str, str]:
        if self.log.secret is None:
            return {}
        return {rid: beat.admin_url for rid, beat in self._others().items()}

    def unverified_peers(self) -> list[str]:
        return [] if self.log.secret is not None else sorted(self._others())

    def _others(self) -> dict[str, ReplicaBeat]:
        alive = self._alive()
        return {rid: beat for rid, beat in alive.items() if rid != self.identity.replica_id}

    def _where(self, replica: str | None) -> tuple[str, str, bool] | None:
        """A replica's consumer address and admin URL, and whether they are verified:
        from its beat (verified with a replica secret), else from the placement (the
        replicas' Kafka group, which any member of that group can write: never)."""
        if replica is None:
            return None
        seen = self.log.beat_view.beats.get(replica)
        if seen is not None:
            return seen.beat.address, seen.beat.admin_url, self.log.secret is not None
        if self.directory is not None and replica in self.directory.replicas:
            claim = self.directory.replicas[replica]
            return claim.address, claim.admin_url, False
        return None
