"""Kafka's own failovers under keyed traffic: a rolling restart and a crash of the nodes
of a 3-node cluster (`harness.brokers.kafka_cluster`) while a coordinated group consumes.

Shared by the integration test (short gaps) and `bench.kafka_failover` (the timings an
operator sees). The scenario: a 2-partition topic at the cluster's replication factor,
coordinator replicas on a state topic at the cluster's default, consumers given every
replica's address, an idempotent acks=all producer at a steady rate over a fixed key set,
and a plain reader of the topic (no group: Kafka's own availability, the floor under any
consumer's stops); meanwhile broker steps (stop, crash, start a node) at fixed times, each
aimed at a node by a rule (a fixed id, or whichever node leads a partition then).

The measures: the contract check of the integration tests (lost, duplicates, per-key
order), and the longest *group-wide stop*: the longest time in which no consumer of the
group started a record, from the first step to the end of the traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP

from harness._processes import CoordinatorProcess, ReplicaSet, Workers
from harness._topics import create_topic
from harness._waiting import wait_for
from keyshard.local.demo import TOPIC

if TYPE_CHECKING:  # imported where a node is wanted (harness.brokers)
    from harness.brokers.kafka_cluster import KafkaCluster

Action = Literal["stop", "kill", "start"]
#: Which node a step acts on, decided when the step comes: a node id, a rule, or (for a
#: start) None: the node the latest stop or crash took down.
Target = int | Callable[[], Awaitable[int]] | None


@dataclass(frozen=True, slots=True)
class BrokerStep:
    at_s: float  # after the traffic started
    action: Action  # stop: SIGTERM (controlled); kill: SIGKILL (a crash); start: back up
    target: Target
    label: str = ""  # what the target is, for the report (e.g. "the state partition's leader")


@dataclass(slots=True)
class StepDone:
    step: BrokerStep
    node: int
    at_ns: int  # CLOCK_MONOTONIC, as handler logs have it
    took_s: float  # until the action returned (a start: until the node serves)


class KeyedGroup:
    """The group of the scenario: coordinator replicas r0, r1, ... and consumer processes
    given every replica's address, on a 2-partition `TOPIC` at the cluster's replication
    factor. `stop` ends every process, whatever `start` got to."""

    def __init__(self, bootstrap: str, work: Path, replicas: int) -> None:
        self.bootstrap = bootstrap
        self.replicas = ReplicaSet(bootstrap, work, extra=["--drain-timeout-ms", "2000"])
        self.ids = [f"r{i}" for i in range(replicas)]
        for replica_id in self.ids:
            self.replicas.add(replica_id)
        self.consumers = Workers(CoordinatorProcess(bootstrap, work), work)

    async def start(self, consumers: int, *consumer_args: str, timeout: float = 90) -> None:
        """Replicas up, the topic made, `consumers` members settled."""
        await self.replicas.start(*self.ids)
        await create_topic(self.bootstrap, TOPIC, partitions=2, replication_factor=-1)
        self.consumers.addresses = self.replicas.addresses
        for i in range(consumers):
            self.consumers.spawn(f"c{i}", *consumer_args)
        await wait_for(
            lambda: self.replicas.settled(consumers), timeout, f"{consumers} settled members"
        )

    def stop(self) -> None:
        self.consumers.stop_all()
        self.replicas.stop_all()


def issue_schedule(gap_s: float = 10.0, first_s: float = 15.0) -> list[BrokerStep]:
    """Node 1 SIGTERM and back `gap_s` later, node 2 the same, node 3 `kill -9` and back,
    one node every 2 * `gap_s` from `first_s` (defaults: 15/25, 35/45, 55/65 s)."""
    steps = []
    for i, (node, action) in enumerate(((1, "stop"), (2, "stop"), (3, "kill"))):
        down = first_s + 2 * gap_s * i
        steps.append(BrokerStep(down, action, node, f"node {node}"))  # type: ignore[arg-type]
        steps.append(BrokerStep(down + gap_s, "start", None, f"node {node}"))
    return steps


def leader(cluster: KafkaCluster, topic: str, partition: int) -> Callable[[], Awaitable[int]]:
    """A step target: the node leading `partition` of `topic` when the step comes."""

    async def find() -> int:
        node = await cluster.leader_of(topic, partition)
        if node is None:
            raise AssertionError(f"{topic}/{partition} has no leader to stop")
        return node

    return find


async def run_steps(
    cluster: KafkaCluster, steps: Sequence[BrokerStep], began: float
) -> list[StepDone]:
    """Each step at `began` (loop time) + its `at_s`; a node is started again on the node
    the matching earlier step took down. Before taking a node down, waits until every
    partition is in sync again, as an operator does between two nodes."""
    loop = asyncio.get_running_loop()
    done: list[StepDone] = []
    down: list[int] = []
    act = {"stop": cluster.stop_node, "kill": cluster.kill_node, "start": cluster.start_node}
    for step in steps:
        await asyncio.sleep(max(0.0, began + step.at_s - loop.time()))
        if step.action == "start":
            node = step.target if isinstance(step.target, int) else down[-1]
            down.remove(node)
        elif step.target is None:
            raise ValueError(f"a {step.action} step needs a target")
        else:
            await cluster.wait_in_sync()
            node = await step.target() if callable(step.target) else step.target
            down.append(node)
        at = time.monotonic_ns()
        await asyncio.to_thread(act[step.action], node)
        done.append(StepDone(step, node, at, (time.monotonic_ns() - at) / 1e9))
    return done


class PlainReader:
    """A plain consumer of every partition of a topic (assigned, no group): when records
    become readable, whatever any group does. Its longest stop is Kafka's own."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = [KafkaTP(topic, p) for p in range(partitions)]
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50
        )
        self.received_ns: list[int] = []  # one entry per record, when it was read
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.partitions)
        await self.consumer.seek_to_beginning(*self.partitions)
        self._task = asyncio.create_task(self._read(), name="plain-reader")

    async def _read(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            now = time.monotonic_ns()
            self.received_ns += [now] * sum(len(records) for records in batches.values())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()


def longest_stop(starts_ns: Iterable[int], since_ns: int, until_ns: int | None = None) -> float:
    """The longest time (s) in [since, until] in which nothing started: the largest gap
    between consecutive starts, `since` counting as one. `until` defaults to the last
    start: under steady traffic, up to the last record everything is a stop."""
    inside = sorted(t for t in starts_ns if t >= since_ns and (until_ns is None or t <= until_ns))
    edges = [since_ns, *inside, *([until_ns] if until_ns is not None else [])]
    return max((b - a for a, b in itertools.pairwise(edges)), default=0) / 1e9
