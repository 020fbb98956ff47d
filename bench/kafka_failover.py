"""Kafka's own failovers: a rolling restart and a crash of the nodes of a 3-node Apache
Kafka cluster under keyed traffic, keyshard's group beside a KIP-848 consumer group.

    bash scripts/bench.sh kafka-failover                 # 3 runs each of 1 and 3 replicas
    .venv/bin/python -m bench.kafka_failover --runs 1    # one run each

The scenario of the issue an operator would try (harness/_kafka_failover.py): a 3-node
KRaft cluster (replication factor 3, min ISR 2, harness.brokers.kafka_cluster), a
2-partition topic at the cluster's replication factor, the coordinator's state topic at
the cluster's default, 3 consumers (session timeout 10 s) given every replica's address,
an idempotent acks=all producer at 200 records/s over 300 keys, and beside them a
KIP-848 consumer group (confluent-kafka, `group.protocol=consumer`) as the reference,
and a plain reader of the topic (no group: Kafka's own availability). Node 1 SIGTERM at
15 s and back at 25 s, node 2 the same at 35/45 s, node 3 `kill -9` at 55 s and back at
65 s, each once the one before is done and every partition is in sync again (a node
takes long to start on a busy machine); the traffic lasts until 10 s after the last step,
75 s at least.

Per run: lost, duplicates and per-key order violations (the integration tests' contract
check), and the longest group-wide stop (the longest time in which no consumer of the
group started a record, from the first step to the end of the traffic) of keyshard's
group, of the KIP-848 group and of the plain reader. Writes bench/results/kafka_failover.md
and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import RESULTS
from bench._common import cleanup, machine, peer_missing, peer_python, workdir
from harness import (
    TOPIC,
    KeyedGroup,
    PlainReader,
    issue_schedule,
    longest_stop,
    markdown_table,
    produce,
    run_steps,
    wait_for,
)
from harness.brokers.kafka_cluster import KafkaCluster
from keyshard.local.verify import Produced, check

CONSUMERS = 3
RATE = 200  # records per second
KEYS = 300
TRAFFIC_S = 75.0  # at least; until TAIL_S after the last step
CHUNK_S = 10.0
TAIL_S = 10.0
SESSION = ("--session-timeout-ms", "10000")
REFERENCE_GROUP = "kip848-reference"
BUCKET_S = 0.01  # the KIP-848 worker counts completions in 10 ms buckets (bench._worker)


@dataclass
class Outcome:
    replicas: int
    run: int
    produced: int
    lost: int
    duplicates: int
    order_violations: int
    longest_stop_s: float  # keyshard's group
    kip848_stop_s: float | None  # the KIP-848 group's (None: it did not run)
    plain_stop_s: float  # the plain reader's
    steps: list[str]


async def traffic(
    bootstrap: str, began: float, steps_over: asyncio.Future[float]
) -> list[Produced]:
    """Records at `RATE` from `began` until `TAIL_S` after the last broker step (a node
    starting again takes long on a busy machine, and every step must come under traffic),
    at least `TRAFFIC_S`: one producer per `CHUNK_S`, each started as the last one ends
    its sends, so the traffic goes on while one waits for acknowledgements."""
    loop = asyncio.get_running_loop()
    per_chunk = int(RATE * CHUNK_S)
    chunks: list[asyncio.Future[list[Produced]]] = []
    while True:
        due = began + len(chunks) * CHUNK_S
        last = steps_over.result() + TAIL_S if steps_over.done() else None
        if due >= began + TRAFFIC_S and last is not None and due >= last:
            break
        await asyncio.sleep(max(0.0, due - loop.time()))
        start = len(chunks) * per_chunk
        chunks.append(
            asyncio.ensure_future(
                produce(bootstrap, per_chunk, KEYS, start=start, rate=RATE, idempotent=True)
            )
        )
    return [record for chunk in await asyncio.gather(*chunks) for record in chunk]


class Kip848Group:
    """One KIP-848 consumer (bench._worker in the confluent-kafka virtualenv); when its
    records were done, from its 10 ms completion buckets (CLOCK_MONOTONIC)."""

    def __init__(self, bootstrap: str, work: Path) -> None:
        go, self.status = work / "kip848.go", work / "kip848.json"
        go.touch()
        self.log = open(work / "kip848.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                str(peer_python("kip848")), "-m", "bench._worker", "--system", "kip848",
                "--handler", "noop", "--bootstrap", bootstrap, "--topic", TOPIC,
                "--group", REFERENCE_GROUP, "--go", str(go), "--status", str(self.status),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def count(self) -> int:
        try:
            return int(json.loads(self.status.read_text())["count"])
        except (OSError, ValueError, KeyError):
            return 0

    def stop(self) -> list[int]:
        """Stop it; the completion times (ns), one per non-empty bucket."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        try:
            buckets = json.loads(self.status.read_text()).get("buckets", {})
        except (OSError, ValueError):
            return []
        return [int(int(b) * BUCKET_S * 1e9) for b in buckets]


async def one_run(cluster: KafkaCluster, replicas: int, run: int, work: Path) -> Outcome:
    await asyncio.to_thread(cluster.reset)
    await cluster.wait_in_sync()
    bootstrap = cluster.bootstrap_servers
    group = KeyedGroup(bootstrap, work, replicas)
    consumers = group.consumers
    reader = PlainReader(bootstrap, TOPIC, 2)
    reference: Kip848Group | None = None
    try:
        await group.start(CONSUMERS, *SESSION, timeout=120)
        if not peer_missing("kip848"):
            reference = Kip848Group(bootstrap, work)
        await reader.start()
        loop = asyncio.get_running_loop()
        began = loop.time()
        steps_over: asyncio.Future[float] = loop.create_future()
        producing = asyncio.ensure_future(traffic(bootstrap, began, steps_over))
        done = await run_steps(cluster, issue_schedule(), began)
        steps_over.set_result(loop.time())
        produced = await producing
        ended = time.monotonic_ns()
        total = len(produced)
        await wait_for(lambda: consumers.unique() >= total, 180, "every record processed")
        await wait_for(lambda: len(reader.received_ns) >= total, 60, "the plain reader")
        if reference is not None:
            ref = reference
            await wait_for(lambda: ref.count() >= total, 120, "the KIP-848 group")
        processed = consumers.processed()
        report = check(produced, processed)
        first = done[0].at_ns
        kip848 = reference.stop() if reference is not None else None
        reference = None
        return Outcome(
            replicas=replicas,
            run=run,
            produced=total,
            lost=len(report.lost),
            duplicates=report.duplicates,
            order_violations=len(report.order_violations),
            longest_stop_s=longest_stop([e.t0 for e in processed], first, ended),
            kip848_stop_s=longest_stop(kip848, first, ended) if kip848 is not None else None,
            plain_stop_s=longest_stop(reader.received_ns, first, ended),
            steps=[
                f"{(d.at_ns - first) / 1e9:+.1f} s {d.step.action} node {d.node} ({d.took_s:.1f} s)"
                for d in done
            ],
        )
    finally:
        if reference is not None:
            reference.stop()
        await reader.stop()
        group.stop()


def table(outcomes: list[Outcome]) -> str:
    rows = [
        [
            f"{o.replicas} replica{'s' if o.replicas > 1 else ''}, run {o.run}",
            str(o.lost),
            str(o.duplicates),
            "kept" if o.order_violations == 0 else f"{o.order_violations} broken",
            f"{o.longest_stop_s:.1f} s",
            f"{o.kip848_stop_s:.1f} s" if o.kip848_stop_s is not None else "n/a",
            f"{o.plain_stop_s:.1f} s",
        ]
        for o in outcomes
    ]
    header = [
        "coordinator, run", "lost", "duplicates", "key order", "longest group-wide stop",
        "KIP-848 consumer's longest stop", "plain reader's longest stop",
    ]  # fmt: skip
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per replica count")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    work = workdir()
    outcomes: list[Outcome] = []
    try:
        with KafkaCluster() as cluster:
            for replicas in args.replicas:
                for run in range(1, args.runs + 1):
                    run_dir = work / f"r{replicas}-{run}"
                    run_dir.mkdir()
                    outcome = asyncio.run(one_run(cluster, replicas, run, run_dir))
                    print(json.dumps(asdict(outcome)), flush=True)
                    outcomes.append(outcome)
    finally:
        cleanup(work)
    md = (
        "# Kafka's own failovers (bench/kafka_failover.py)\n\n"
        f"{machine()}\n\nNode 1 SIGTERM at 15 s and back at 25 s, node 2 the same at "
        "35/45 s, node 3 `kill -9` at 55 s and back at 65 s, a step coming later when the "
        "one before (a node's start: 30-50 s here) and the cluster's catching up take "
        "longer; 200 records/s over 300 keys until 10 s after the last step; stops from "
        "the first step to the end of the traffic.\n\n" + table(outcomes)
    )
    (RESULTS / "kafka_failover.md").write_text(md + "\n")
    (RESULTS / "kafka_failover.json").write_text(
        json.dumps([asdict(o) for o in outcomes], indent=1) + "\n"
    )
    print(md)


if __name__ == "__main__":
    main()
