"""Kafka's own failovers on a 3-node cluster: a controlled shutdown of the node leading
the data partition and a crash (`kill -9`) of the node leading the group's state
partition, each restarted, under steady keyed traffic from an idempotent acks=all
producer, with one and with three coordinator replicas. Kafka moves those partitions'
leaders (after a crash only once `broker.session.timeout.ms` has passed); the group must
ride through: nothing lost or run twice, key order kept, and no longer a stop than
Kafka's own (a plain reader of the topic beside it) plus an allowance.

The issue's full timings (every node in turn, 10 s down each) and a KIP-848 consumer as
the reference are the benchmark's: `bash scripts/bench.sh kafka-failover`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness import (
    GROUP,
    TOPIC,
    BrokerStep,
    KeyedGroup,
    PlainReader,
    leader,
    longest_stop,
    produce,
    run_steps,
    wait_for,
)
from harness.brokers.kafka_cluster import KafkaCluster
from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, partition_of
from keyshard.local.verify import check

pytestmark = pytest.mark.integration
SESSION = ("--session-timeout-ms", "10000")
CONSUMERS = 3
RATE = 200  # records per second
KEYS = 300
TRAFFIC_S = 30.0
#: How much longer than Kafka's own stop (the plain reader's) the group may stop. Over
#: five runs with one replica on the 2-core machine (load 2-7) the group stopped -0.1,
#: 1.2, 1.9, 2.0 and 2.8 s longer than the reader, depending on which nodes led the data
#: and the state partitions; a group left unserved stops for a session or more.
ALLOWANCE_S = 3.0


@pytest.mark.parametrize("replicas", [1, 3])
async def test_a_rolling_restart_and_a_crash_of_kafka_nodes_go_unnoticed(
    kafka3: KafkaCluster, tmp_path: Path, replicas: int
) -> None:
    bootstrap = kafka3.bootstrap_servers
    group = KeyedGroup(bootstrap, tmp_path, replicas)
    consumers, replica_set = group.consumers, group.replicas
    reader = PlainReader(bootstrap, TOPIC, 2)
    try:
        await group.start(CONSUMERS, *SESSION)
        await reader.start()
        state_partition = partition_of(GROUP, DEFAULT_STATE_PARTITIONS)
        state_leader = leader(kafka3, replica_set.state_topic, state_partition)
        steps = [
            BrokerStep(3, "stop", leader(kafka3, TOPIC, 0), "leader of data partition 0"),
            BrokerStep(10, "start", None),
            BrokerStep(15, "kill", state_leader, "leader of the group's state partition"),
            BrokerStep(24, "start", None),
        ]
        began = asyncio.get_running_loop().time()
        producing = asyncio.ensure_future(
            produce(bootstrap, int(RATE * TRAFFIC_S), KEYS, rate=RATE, idempotent=True)
        )
        done = await run_steps(kafka3, steps, began)
        produced = await producing
        await wait_for(lambda: consumers.unique() >= len(produced), 90, "every record processed")
        await wait_for(lambda: len(reader.received_ns) >= len(produced), 30, "the plain reader")
        processed = consumers.processed()
        report = check(produced, processed)
        first_step = done[0].at_ns
        group_stop = longest_stop([e.t0 for e in processed], first_step)
        kafka_stop = longest_stop(reader.received_ns, first_step)
        print(
            f"{replicas} replica(s): longest group-wide stop {group_stop:.1f} s, plain reader "
            f"{kafka_stop:.1f} s; steps: "
            + "; ".join(
                f"{d.step.action} node {d.node} ({d.step.label or 'back'}, {d.took_s:.1f} s)"
                for d in done
            )
        )
        assert report.lost == []
        assert report.duplicates == 0
        assert report.order_violations == []
        assert group_stop <= kafka_stop + ALLOWANCE_S, (group_stop, kafka_stop)
    finally:
        await reader.stop()
        group.stop()
