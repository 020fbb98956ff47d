"""A 3-node Apache Kafka cluster for tests and benchmarks: what production runs, and the
only place a test sees a partition's leader move.

The nodes run from the same Maven jars as the single test broker (`harness.brokers.kafka`),
each a KRaft node (broker and controller in one process) in a directory of its own, on
free loopback ports, with a static quorum (`controller.quorum.voters`) and one cluster id
shared at format time. Topics get 3 replicas and need 2 in sync, internal ones alike, as
a production cluster is set up. A node can be stopped (SIGTERM: a controlled shutdown,
its leaders moved away first), crashed (SIGKILL: the controller notices only after
`broker.session.timeout.ms`, 9 s by default, and the node's partitions are leaderless
meanwhile) and started again on its own data; `leader_of` says which node leads a
partition, so a test can stop exactly that one.

Starting, stopping and restarting block (a JVM takes seconds): from async code, run them
in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.brokers.kafka import (
    KafkaBrokerError,
    empty_cluster,
    ensure_jars,
    format_node,
    internal_topics,
    kill_node,
    launch_node,
    new_cluster_id,
    terminate_node,
    wait_serving,
    write_node_files,
)
from keyshard.local.processes import free_port

#: How a 3-node cluster keeps data: every partition on 3 nodes, 2 of them in sync for an
#: acks=all write (one node may be down, as in a rolling restart).
REPLICAS = 3
MIN_INSYNC = 2


@dataclass
class _Node:
    node_id: int
    workdir: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KafkaCluster:
    """`nodes` KRaft nodes (ids 1..nodes) forming one cluster; see the module docstring."""

    def __init__(
        self,
        nodes: int = 3,
        *,
        host: str = "127.0.0.1",
        workdir: Path | None = None,
        heap: str = "512m",
        log_level: str = "WARN",
        extra_config: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.heap = heap
        self.log_level = log_level
        self.extra_config = dict(extra_config or {})
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="keyshard-kafka-cluster-"))
        self.nodes = {
            i: _Node(i, self.workdir / f"node-{i}") for i in range(1, nodes + 1)
        }  # fmt: skip

    # ---- addresses ----------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address, as a client is configured for a cluster."""
        return ",".join(self.address(i) for i in self.nodes)

    def address(self, node_id: int) -> str:
        return f"{self.host}:{self.nodes[node_id].port}"

    @property
    def running(self) -> bool:
        """Every node is up."""
        return all(node.running for node in self.nodes.values())

    def is_running(self, node_id: int) -> bool:
        return self.nodes[node_id].running

    def log_path(self, node_id: int) -> Path:
        return self.nodes[node_id].workdir / "broker.log"

    def config(self, node_id: int) -> dict[str, str]:
        node = self.nodes[node_id]
        voters = ",".join(
            f"{n.node_id}@{self.host}:{n.controller_port}" for n in self.nodes.values()
        )
        replicas = min(REPLICAS, len(self.nodes))
        min_isr = min(MIN_INSYNC, replicas)
        return {
            "process.roles": "broker,controller",
            "node.id": str(node_id),
            "listeners": (
                f"PLAINTEXT://{self.host}:{node.port},CONTROLLER://{self.host}:{node.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{node.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.voters": voters,
            "log.dirs": str(node.workdir / "data"),
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(min_isr),
            **internal_topics(replicas=replicas, min_isr=min_isr),
            **self.extra_config,
        }

    # ---- life cycle ---------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Format every node with one cluster id, start them all, and return once each
        answers metadata listing every node."""
        if any(node.running for node in self.nodes.values()):
            raise KafkaBrokerError("the cluster is running already")
        jars = ensure_jars()
        cluster_id = new_cluster_id()
        for node_id, node in self.nodes.items():
            shutil.rmtree(node.workdir, ignore_errors=True)
            node.workdir.mkdir(parents=True)
            write_node_files(node.workdir, self.config(node_id), self.log_level)
        # Formatting is a JVM start each: in parallel, as the nodes start.
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            formatted = [
                pool.submit(format_node, jars, node.workdir, cluster_id, (), (), timeout)
                for node in self.nodes.values()
            ]
            for done in formatted:
                done.result()
        for node in self.nodes.values():
            node.proc = launch_node(jars, node.workdir, self.heap, ())
        try:
            for node_id in self.nodes:
                self._wait_serving(node_id, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 20.0) -> None:
        """Every node at once (SIGTERM, SIGKILL after `timeout`): one by one, the last
        would wait for a controller quorum that is gone. Removes a directory we made."""
        running = [node.proc for node in self.nodes.values() if node.proc is not None]
        for proc in running:
            if proc.poll() is None:
                proc.terminate()  # the JVM's own pid; terminate_node reaps the group below
        for proc in running:
            terminate_node(proc, timeout)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_node(self, node_id: int, timeout: float = 30.0) -> None:
        """A controlled shutdown of one node (SIGTERM), as a rolling restart does it."""
        proc = self.nodes[node_id].proc
        if proc is not None:
            terminate_node(proc, timeout)

    def kill_node(self, node_id: int) -> None:
        """A crash of one node (SIGKILL)."""
        proc = self.nodes[node_id].proc
        if proc is not None:
            kill_node(proc)

    def start_node(self, node_id: int, timeout: float = 90.0) -> None:
        """Start a stopped or crashed node again on its own data, and return once it
        answers metadata listing every node."""
        node = self.nodes[node_id]
        if node.running:
            raise KafkaBrokerError(f"node {node_id} is running already")
        node.proc = launch_node(ensure_jars(), node.workdir, self.heap, ())
        self._wait_serving(node_id, timeout)

    def _wait_serving(self, node_id: int, timeout: float) -> None:
        node = self.nodes[node_id]
        assert node.proc is not None
        wait_serving(node.proc, node.workdir, self.address(node_id), timeout, len(self.nodes))

    def reset(self, timeout: float = 60.0) -> None:
        """Every node up, and every topic a test made deleted (internal ones stay)."""
        for node_id in self.nodes:
            if not self.is_running(node_id):
                self.start_node(node_id)
        empty_cluster(self.bootstrap_servers, timeout)

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- partitions -----------------------------------------------------------------------

    async def partitions(self, topics: Iterable[str] | None = None) -> list[PartitionState]:
        """Leader, replicas and in-sync replicas of every partition of `topics` (default:
        every topic, internal ones included), as the cluster describes them now."""
        return await _describe(self.bootstrap_servers, None if topics is None else list(topics))

    async def leader_of(self, topic: str, partition: int) -> int | None:
        """The node leading `partition` of `topic` now (None: leaderless)."""
        for state in await self.partitions([topic]):
            if state.partition == partition:
                return state.leader
        raise KafkaBrokerError(f"{topic} has no partition {partition}")

    async def in_sync(self, topics: Iterable[str] | None = None) -> bool:
        """Every partition led and fully replicated: what an operator waits for between
        two nodes of a rolling restart (no under-replicated partition)."""
        states = await self.partitions(topics)
        return all(s.leader is not None and s.fully_in_sync for s in states)

    async def wait_in_sync(self, topics: Iterable[str] | None = None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        wanted = None if topics is None else list(topics)
        while not await self.in_sync(wanted):
            if time.monotonic() > deadline:
                raise KafkaBrokerError(f"partitions not back in sync after {timeout:g} s")
            await asyncio.sleep(0.2)


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    leader: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def fully_in_sync(self) -> bool:
        return set(self.replicas) <= set(self.isr)


async def _describe(
    bootstrap: str, topics: list[str] | None, timeout: float = 20.0
) -> list[PartitionState]:
    """The admin client asks a node at random, which may be the one just stopped: asked
    again until one answers within `timeout`."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        try:
            await asyncio.wait_for(admin.start(), 5)
            described: list[dict[str, Any]] = await asyncio.wait_for(
                admin.describe_topics(topics), 5
            )
            break
        except (KafkaError, OSError, TimeoutError) as err:
            if time.monotonic() > deadline:
                raise KafkaBrokerError(f"no node described the topics: {err!r}") from err
            await asyncio.sleep(0.1)
        finally:
            await admin.close()
    out = []
    for topic in described:
        for p in topic["partitions"]:
            leader = int(p["leader"])
            replicas, isr = tuple(p["replicas"]), tuple(p["isr"])
            number = int(p["partition"])
            led_by = leader if leader >= 0 else None
            out.append(PartitionState(topic["topic"], number, led_by, replicas, isr))
    return sorted(out, key=lambda s: (s.topic, s.partition))
