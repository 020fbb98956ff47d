"""Exactly-once read-process-write on Apache Kafka (Tansu has no transactions: Kafka only,
except the test that exactly-once on Tansu fails with a clear error).

An app (`harness.eos_app`) reads `input`, and for each record writes one output
record (same key, the input's key and sequence in the value) through the transaction the
consumer owns. While inputs arrive, consumers join, leave gracefully, are killed with
SIGKILL or frozen with SIGSTOP (their slots move and their transactional ids are fenced),
and the coordinator is killed with SIGKILL and restarted, or the serving replica of two is
killed, or (on a 3-node cluster) the Kafka node leading the group's state partition is
crashed; a read_committed reader of the output must then see every input exactly once, in
per-key order."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from harness import CoordinatorProcess, ReplicaSet, create_topic, wait_for
from harness.brokers.kafka_cluster import KafkaCluster
from keyshard.consumer_client import ConsumerError, CoordinatedConsumer, Outputs
from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, partition_of
from keyshard.local.processes import stop_process

pytestmark = [pytest.mark.integration, pytest.mark.brokers("kafka")]

INPUT = "eos.input"
OUTPUT = "eos.output"
GROUP = "eos-app"
OUTPUT_PARTITIONS = 3


@dataclass
class Apps:
    """eos_app processes, stopped by pid whatever the outcome."""

    address: str  # the coordinator(s) given to the apps
    bootstrap: str
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, name: str, *extra: str) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [
                sys.executable, "-m", "harness.eos_app", "--group", GROUP,
                "--input", INPUT, "--output", OUTPUT, "--coordinator",
                self.address, "--bootstrap", self.bootstrap,
                "--name", name, *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

    def kill(self, name: str) -> None:
        stop_process(self.procs[name], signal.SIGKILL)

    def stop(self, name: str) -> None:
        stop_process(self.procs[name])

    def freeze(self, name: str) -> None:
        """SIGSTOP: a member cut off from everyone, whose transaction stays open."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        if self.alive(name):
            self.procs[name].send_signal(signal.SIGCONT)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.log_dir.glob("*.log")
        )

    def stop_all(self) -> None:
        for name in self.procs:
            self.thaw(name)
        for proc in self.procs.values():
            stop_process(proc)


@pytest.fixture
def apps(coordinator: CoordinatorProcess, tmp_path: Path) -> object:
    a = Apps(coordinator.address, coordinator.bootstrap, tmp_path)
    try:
        yield a
    finally:
        a.stop_all()


async def produce_sequenced(
    bootstrap: str,
    count: int,
    keys: int,
    *,
    start: int = 0,
    rate: float | None = None,
    idempotent: bool = False,
) -> None:
    """Record i has key `key-{i % keys}` and sequence i // keys within its key.
    `idempotent`: acks=all and no duplicate from retries, to ride through a node's crash."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=2, enable_idempotence=idempotent
    )
    await producer.start()
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        futures = []
        for i in range(start, start + count):
            key = f"key-{i % keys}"
            value = f"{key}:{i // keys}".encode()
            futures.append(await producer.send(INPUT, value, key=key.encode()))
            if rate is not None and i % 50 == 0:
                await asyncio.sleep(max(0.0, began + (i - start) / rate - loop.time()))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


class OutputReader:
    """A read_committed reader of the output topic, kept open across polls."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.latest = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.outputs: list[tuple[int, int, dict[str, Any]]] = []  # partition, offset, value

    async def start(self) -> None:
        await self.consumer.start()
        await self.latest.start()
        # A fresh client's metadata knows no topic on Kafka: name the partitions.
        self.consumer.assign([TopicPartition(OUTPUT, p) for p in range(OUTPUT_PARTITIONS)])

    async def poll(self) -> int:
        batches = await self.consumer.getmany(timeout_ms=200)
        for tp, messages in batches.items():
            for m in messages:
                self.outputs.append((tp.partition, m.offset, json.loads(m.value)))
        return len({(o["k"], o["seq"]) for _, _, o in self.outputs})

    async def at_end(self) -> bool:
        """Read to the high watermark: every transaction written so far is decided (a
        killed app's open one was aborted by the fencing of whoever took its slots)."""
        await self.poll()
        tps = sorted(self.consumer.assignment())
        ends = await self.latest.end_offsets(tps)  # read_uncommitted: high watermarks
        return all([await self.consumer.position(tp) >= ends[tp] for tp in tps])

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.latest.stop()


async def _above(reader: OutputReader, n: int) -> bool:
    return await reader.poll() >= n


async def outputs_reach(reader: OutputReader, apps: Apps, n: int, timeout: float = 120) -> None:
    await wait_for(lambda: _above(reader, n), timeout, f"{n} distinct outputs\n{apps.logs()}")


def check(outputs: list[tuple[int, int, dict[str, Any]]], count: int, keys: int) -> None:
    """Every input exactly once; per key, sequences in output order are 0, 1, 2, ..."""
    seen: dict[tuple[str, int], int] = defaultdict(int)
    per_key: dict[str, list[int]] = defaultdict(list)
    for _, _, value in sorted(outputs, key=lambda o: (o[0], o[1])):
        seen[value["k"], value["seq"]] += 1
        per_key[value["k"]].append(value["seq"])
    expected = {(f"key-{i % keys}", i // keys) for i in range(count)}
    missing = expected - seen.keys()
    duplicates = {k: n for k, n in seen.items() if n > 1}
    disorder = {k: s for k, s in per_key.items() if s != sorted(s)}
    assert not missing, f"{len(missing)} inputs without output, e.g. {sorted(missing)[:5]}"
    assert not duplicates, (
        f"{len(duplicates)} inputs output twice or more: {list(duplicates.items())[:5]}"
    )
    assert not disorder, f"per-key order broken for {len(disorder)} keys"
    assert len(outputs) == count


async def finish(
    reader: OutputReader, apps: Apps, survivors: tuple[str, ...], count: int, keys: int
) -> None:
    """Every input in: every output there, the surviving apps alive and stopped, and the
    output, read to its end, has every input exactly once in per-key order."""
    await outputs_reach(reader, apps, count, 180)
    for name in survivors:
        assert apps.alive(name), apps.logs()
        apps.stop(name)
    await wait_for(reader.at_end, 60, "the output read to its end")
    check(reader.outputs, count, keys)


async def make_topics(bootstrap: str, replication_factor: int = 1) -> None:
    await create_topic(bootstrap, INPUT, 2, replication_factor=replication_factor)
    await create_topic(bootstrap, OUTPUT, OUTPUT_PARTITIONS, replication_factor=replication_factor)


async def test_exactly_once_output_through_churn_and_crashes(
    coordinator: CoordinatorProcess, apps: Apps
) -> None:
    count, keys = 6000, 60
    await make_topics(coordinator.bootstrap)
    reader = OutputReader(coordinator.bootstrap)
    await reader.start()
    try:
        for name in ("a", "b", "c"):
            apps.spawn(name)
        producing = asyncio.create_task(
            produce_sequenced(coordinator.bootstrap, count, keys, rate=400)
        )

        await outputs_reach(reader, apps, 800)
        apps.kill("a")  # mid-transaction, most likely
        apps.spawn("d")
        await outputs_reach(reader, apps, 1800)
        apps.stop("b")  # graceful leave
        await outputs_reach(reader, apps, 2600)
        coordinator.kill()  # consumers ride through; the new one adopts their claims
        await coordinator.start()
        apps.spawn("e")
        await outputs_reach(reader, apps, 3600)
        apps.kill("c")
        apps.kill("d")
        apps.spawn("f")
        await producing
        await finish(reader, apps, ("e", "f"), count, keys)
    finally:
        await reader.stop()


async def test_a_frozen_member_commits_nothing_for_slots_it_lost(
    coordinator: CoordinatorProcess, apps: Apps
) -> None:
    """A member frozen mid-stream (SIGSTOP) with an open transaction loses its slots after
    its session; their new owner fences it. Thawed, it cannot commit what it had: it is
    refused by Kafka or drops it on noticing the lost session."""
    count, keys = 3000, 30
    await make_topics(coordinator.bootstrap)
    reader = OutputReader(coordinator.bootstrap)
    await reader.start()
    try:
        apps.spawn("a")
        apps.spawn("b")
        producing = asyncio.create_task(
            produce_sequenced(coordinator.bootstrap, count, keys, rate=300)
        )
        await wait_for(lambda: coordinator.settled(2, GROUP), 60, "two members")
        await outputs_reach(reader, apps, 600)
        apps.freeze("a")
        await wait_for(lambda: coordinator.settled(1, GROUP), 60, "a's slots given to b")
        await outputs_reach(reader, apps, 1500)
        apps.thaw("a")
        await producing
        await outputs_reach(reader, apps, count, 180)
        assert apps.alive("b"), apps.logs()
        for name in ("a", "b"):
            apps.stop(name)
        await wait_for(reader.at_end, 60, "the output read to its end")
        check(reader.outputs, count, keys)
    finally:
        await reader.stop()


async def test_graceful_restart_writes_nothing_twice(
    coordinator: CoordinatorProcess, apps: Apps
) -> None:
    """One app processes everything; a restarted one finds every position committed."""
    count, keys = 1000, 20
    await make_topics(coordinator.bootstrap)
    await produce_sequenced(coordinator.bootstrap, count, keys)
    reader = OutputReader(coordinator.bootstrap)
    await reader.start()
    try:
        apps.spawn("a")
        await wait_for(lambda: _above(reader, count), 40, f"every output\n{apps.logs()}")
        apps.stop("a")
        apps.spawn("b")
        await produce_sequenced(coordinator.bootstrap, 100, keys, start=count)
        await wait_for(lambda: _above(reader, count + 100), 90, f"new outputs\n{apps.logs()}")
        apps.stop("b")
        await wait_for(reader.at_end, 60, "the output read to its end")
        check(reader.outputs, count + 100, keys)
    finally:
        await reader.stop()


async def test_exactly_once_through_a_replica_failover(broker: Any, tmp_path: Path) -> None:
    """Two coordinator replicas; the one serving the group is killed with SIGKILL while
    three apps run: they ride through to the other replica, and a consumer is killed
    during the failover too."""
    count, keys = 4000, 40
    replicas = ReplicaSet(broker.bootstrap_servers, tmp_path, extra=["--drain-timeout-ms", "2000"])
    apps = Apps(replicas.addresses, broker.bootstrap_servers, tmp_path)
    reader = OutputReader(broker.bootstrap_servers)
    try:
        replicas.add("r0")
        replicas.add("r1")
        await replicas.start("r0", "r1")
        apps.address = replicas.addresses
        await make_topics(broker.bootstrap_servers)
        await reader.start()
        for name in ("a", "b", "c"):
            apps.spawn(name)
        producing = asyncio.create_task(
            produce_sequenced(broker.bootstrap_servers, count, keys, rate=400)
        )
        await outputs_reach(reader, apps, 1000)
        owner = await wait_for(lambda: replicas.owner(GROUP), 30, "the group's replica")
        owner.kill()
        apps.kill("a")
        await outputs_reach(reader, apps, 2500)
        apps.spawn("d")
        await producing
        await finish(reader, apps, ("b", "c", "d"), count, keys)
    finally:
        apps.stop_all()
        await reader.stop()
        replicas.stop_all()


async def test_exactly_once_through_churn_and_a_kafka_node_crash(
    kafka3: KafkaCluster, tmp_path: Path
) -> None:
    """Churn on a 3-node cluster with the node leading the group's state partition
    crashed (`kill -9`) and started again while inputs arrive: Kafka moves the leaders of
    every input, output, state and transaction partition that node led, after its
    broker.session.timeout.ms, and the group rides through."""
    count, keys = 4000, 40
    bootstrap = kafka3.bootstrap_servers
    coordinator = CoordinatorProcess(bootstrap, tmp_path, extra=["--drain-timeout-ms", "2000"])
    apps = Apps(coordinator.address, bootstrap, tmp_path)
    reader = OutputReader(bootstrap)
    try:
        await coordinator.start()
        await make_topics(bootstrap, replication_factor=-1)
        await reader.start()
        for name in ("a", "b", "c"):
            apps.spawn(name)
        producing = asyncio.create_task(
            produce_sequenced(bootstrap, count, keys, rate=400, idempotent=True)
        )
        await outputs_reach(reader, apps, 800)
        apps.kill("a")
        apps.spawn("d")
        await outputs_reach(reader, apps, 1400)
        state = partition_of(GROUP, DEFAULT_STATE_PARTITIONS)
        node = await kafka3.leader_of(coordinator.state_topic, state)
        assert node is not None
        kafka3.kill_node(node)
        await outputs_reach(reader, apps, 2400)
        await asyncio.to_thread(kafka3.start_node, node)
        await producing
        await finish(reader, apps, ("b", "c", "d"), count, keys)
    finally:
        apps.stop_all()
        await reader.stop()
        coordinator.stop()


@pytest.mark.brokers("tansu")
async def test_exactly_once_on_a_broker_without_transactions_says_so(broker: Any) -> None:
    await create_topic(broker.bootstrap_servers, INPUT)
    consumer = CoordinatedConsumer(
        group=GROUP,
        topics=[INPUT],
        coordinator="127.0.0.1:1",  # never reached: the writer fails first
        bootstrap_servers=broker.bootstrap_servers,
        transactional_id_prefix="app",
    )

    async def handler(record: Any, outputs: Outputs) -> None:
        raise AssertionError("nothing is consumed")

    with pytest.raises(ConsumerError, match="needs Kafka transactions") as err:
        await asyncio.wait_for(consumer.run_exactly_once(handler), 120)
    assert "Tansu has none" in str(err.value), err.value
