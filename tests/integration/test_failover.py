"""Coordinator replicas on a real broker: the replica serving a group is killed, stopped,
frozen, or joined and left by others, under steady keyed traffic, and its consumers must
not notice. Every case checks the contract on what the handlers actually ran: nothing
lost, no key out of order, no record run twice, the same members keeping their ranges,
and no consumer idle longer than a second beyond what it was before the failover.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import (
    BUSY_COORDINATOR,
    CoordinatorProcess,
    ReplicaSet,
    Workers,
    create_topic,
    produce,
    wait_for,
)
from keyshard.core.model.ranges import RangeSet
from keyshard.local.verify import Processed, Produced, check

pytestmark = pytest.mark.integration
# The product's default session: a member's lease after it last heard from a coordinator.
SESSION = ("--session-timeout-ms", "10000")
CONSUMERS = 4
RATE = 800  # records per second, over 200 keys
# A consumer idle this much longer than the longest pause it had before the failover
# would be a consumer that noticed it.
IDLE_ALLOWANCE_S = 1.0


@pytest.fixture
async def replica_set(broker: Any, tmp_path: Path) -> AsyncIterator[ReplicaSet]:
    # The balanced assignor: these tests check that a failover moves no range, and
    # load-aware moves ranges on its own schedule (a backlog during the failover is one).
    extra = ["--drain-timeout-ms", "2000", "--assignor", "balanced"]
    replicas = ReplicaSet(broker.bootstrap_servers, tmp_path, extra=extra)
    try:
        yield replicas
    finally:
        replicas.stop_all()


@pytest.fixture
def consumers(replica_set: ReplicaSet, tmp_path: Path) -> Iterator[Workers]:
    """Workers given every replica's address (what a headless Service resolves to)."""
    placeholder = CoordinatorProcess(replica_set.bootstrap, tmp_path)
    w = Workers(placeholder, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()


def _longest_pause(processed: list[Processed], worker: str, since: int, until: int) -> float:
    """The longest time (s) between two handler starts of `worker` within [since, until]
    (CLOCK_MONOTONIC ns, as the handlers log them)."""
    starts = sorted(e.t0 for e in processed if e.worker == worker and since <= e.t0 <= until)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return max(gaps, default=until - since) / 1e9


async def _running_group(replicas: ReplicaSet, consumers: Workers) -> dict[str, Any]:
    await create_topic(replicas.bootstrap)
    consumers.addresses = replicas.addresses
    for i in range(CONSUMERS):
        consumers.spawn(f"c{i}", *SESSION)
    return await wait_for(lambda: replicas.settled(CONSUMERS), 60, "4 settled members")


async def _failover_under_traffic(
    replicas: ReplicaSet, consumers: Workers, fail: str
) -> tuple[CoordinatorProcess, CoordinatorProcess]:
    """Four consumers under traffic; the replica serving their group fails (`fail`: kill,
    stop or freeze); another takes the group over. The contract, the members and their
    pauses are checked; returns (failed replica, new owner)."""
    await replicas.start("r0", "r1", "r2")
    before = await _running_group(replicas, consumers)
    owner = await replicas.owner()
    assert owner is not None
    producing = asyncio.ensure_future(produce(replicas.bootstrap, 16 * RATE, 200, rate=RATE))
    await wait_for(lambda: consumers.unique() > 3 * RATE, 30, "traffic to flow")

    failed_at = time.monotonic_ns()
    getattr(owner, fail)()
    replicas_left = [r for r in replicas.replicas.values() if r is not owner]

    async def served_elsewhere() -> CoordinatorProcess | None:
        for replica in replicas_left:
            try:
                view = await replica.group()
            except httpx.HTTPError:  # forwarded to the failed owner, which did not answer
                continue
            if view is not None and view["served_by"]["replica_id"] != owner.replica_id:
                return replicas.replicas[view["served_by"]["replica_id"]]
        return None

    new_owner = await wait_for(served_elsewhere, 20, "another replica to serve the group")
    took_over_s = (time.monotonic_ns() - failed_at) / 1e9
    after = await wait_for(lambda: new_owner.settled(CONSUMERS), 30, "the members back")
    back_s = (time.monotonic_ns() - failed_at) / 1e9

    produced: list[Produced] = await producing
    await wait_for(lambda: consumers.unique() >= len(produced), 60, "every record processed")
    processed = consumers.processed()
    report = check(produced, processed)
    assert report.lost == []
    assert report.order_violations == []
    assert report.duplicates == 0, "adopted members keep their exact positions"

    # Adopted, not replaced: the same members with the same ranges, nothing handed off.
    assert {m["member_id"]: m["ranges"] for m in after["members"]} == {
        m["member_id"]: m["ranges"] for m in before["members"]
    }
    assert not [h for h in after["handoffs"] if h["kind"] == "lost"]

    window = int(10e9)
    pauses = {}
    for i in range(CONSUMERS):
        worker = f"c{i}"
        normal = _longest_pause(processed, worker, failed_at - window, failed_at)
        during = _longest_pause(processed, worker, failed_at, failed_at + window)
        pauses[worker] = (normal, during)
        assert during <= normal + IDLE_ALLOWANCE_S, (worker, normal, during)
    print(
        f"{fail}: another replica served the group after {took_over_s:.2f} s, every member "
        f"was back after {back_s:.2f} s; longest pause per consumer (before, during): "
        + ", ".join(f"{w} {n * 1000:.0f}/{d * 1000:.0f} ms" for w, (n, d) in pauses.items())
    )
    return owner, new_owner


async def test_kill_9_of_the_serving_replica_goes_unnoticed(
    replica_set: ReplicaSet, consumers: Workers
) -> None:
    await _failover_under_traffic(replica_set, consumers, "kill")


async def test_sigterm_of_the_serving_replica_goes_unnoticed(
    replica_set: ReplicaSet, consumers: Workers
) -> None:
    """A rolling update: the replica hands its partitions over before exiting."""
    stopped, _ = await _failover_under_traffic(replica_set, consumers, "stop")
    assert stopped.proc is not None and stopped.proc.returncode == 0
    assert "released: the coordinator replica is shutting down" in stopped.read_log()


async def test_a_frozen_replica_changes_nothing_when_it_wakes(
    replica_set: ReplicaSet, consumers: Workers
) -> None:
    """SIGSTOP past the replicas' timeout: the others take its partitions over and fence
    it. After SIGCONT it finds itself fenced and lets go: its stale view moves nothing,
    and its consumers, already served elsewhere, ignore it. (The replicas' group may then
    place partitions on it again: a handover in order, like any scale-up.)"""
    frozen, new_owner = await _failover_under_traffic(replica_set, consumers, "freeze")
    view = await new_owner.group()
    assert view is not None
    members = {m["member_id"] for m in view["members"]}
    fenced_at = view["served_by"]["coordinator_epoch"]
    frozen.thaw()
    await wait_for(
        lambda: re.search(r"released: (fenced|cut off)", frozen.read_log()),
        20,
        "the thawed replica to let go",
    )
    thawed_at = time.monotonic_ns()
    await produce(replica_set.bootstrap, 4 * RATE, 200, start=16 * RATE, rate=RATE)
    await wait_for(lambda: consumers.unique() >= 20 * RATE, 60, "records after the thaw")
    settled = await wait_for(lambda: replica_set.settled(CONSUMERS), 30, "the group settled")
    assert settled["served_by"]["coordinator_epoch"] >= fenced_at
    assert {m["member_id"] for m in settled["members"]} == members, "nobody was replaced"
    processed = consumers.processed()
    report = check(await _all_produced(replica_set), processed)
    assert report.lost == [] and report.order_violations == [] and report.duplicates == 0
    for i in range(CONSUMERS):
        worker = f"c{i}"
        normal = _longest_pause(processed, worker, thawed_at - int(3e9), thawed_at)
        after = _longest_pause(processed, worker, thawed_at, thawed_at + int(3e9))
        assert after <= normal + IDLE_ALLOWANCE_S, (worker, normal, after)


# How long a replica's event loop is held: three replica timeouts (2 s, the default), and
# more than the replicas' Kafka group session (6 s), so neither its beats nor its group
# heartbeats may wait for the loop. Below the consumers' 10 s session.
HELD_S = 7.0


async def test_a_replica_whose_event_loop_is_held_keeps_its_partitions(
    replica_set: ReplicaSet, consumers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registration storm can hold a replica's event loop for seconds. It is busy, not
    gone: its beats and its group membership go on from a thread of their own, so nobody
    takes its partitions over, and when its loop runs again it serves on at the same
    epoch with the same members, having let go of nothing."""
    monkeypatch.setenv("KEYSHARD_BUSY_S", str(HELD_S))
    for name in ("r0", "r1", "r2"):
        replica_set.add(name).entry = BUSY_COORDINATOR
    await replica_set.start("r0", "r1", "r2")
    before = await _running_group(replica_set, consumers)
    owner = await replica_set.owner()
    assert owner is not None
    logs_before = {name: len(r.read_log()) for name, r in replica_set.replicas.items()}

    owner.hold_loop()
    await wait_for(
        lambda: "the event loop runs again" in owner.read_log(), 3 * HELD_S, "the hold to end"
    )
    after = await wait_for(lambda: owner.settled(CONSUMERS), 30, "the owner to serve again")
    said = {name: r.read_log()[logs_before[name] :] for name, r in replica_set.replicas.items()}
    assert "holding the event loop" in owner.read_log()
    for name, text in said.items():
        assert "taken over" not in text and "released:" not in text, (name, text[-3000:])
    assert after["served_by"]["replica_id"] == owner.replica_id
    assert after["served_by"]["coordinator_epoch"] == before["served_by"]["coordinator_epoch"]
    assert {m["member_id"]: m["ranges"] for m in after["members"]} == {
        m["member_id"]: m["ranges"] for m in before["members"]
    }


async def _all_produced(replicas: ReplicaSet) -> list[Produced]:
    """Every record of the test topic, read back (keys as produced)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as KafkaTP

    from harness import TOPIC

    reader = AIOKafkaConsumer(bootstrap_servers=replicas.bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        tp = KafkaTP(TOPIC, 0)
        reader.assign([tp])
        await reader.seek_to_beginning(tp)
        end = (await reader.end_offsets([tp]))[tp]
        out: list[Produced] = []
        while await reader.position(tp) < end:
            for records in (await reader.getmany(tp, timeout_ms=500)).values():
                out += [Produced(r.partition, r.offset, (r.key or b"").decode()) for r in records]
        return out
    finally:
        await reader.stop()


async def test_scaling_1_to_3_to_1_replicas_under_traffic(
    replica_set: ReplicaSet, consumers: Workers
) -> None:
    """Replicas join and leave while four consumers run: partitions move whole, handed
    over with the same no-gap rule, and the contract holds throughout."""
    await replica_set.start("r0")
    for r in ("r1", "r2"):
        replica_set.add(r)  # known to the consumers from the start, as a Service lists them
    await _running_group(replica_set, consumers)
    producing = asyncio.ensure_future(produce(replica_set.bootstrap, 20 * RATE, 200, rate=RATE))
    await wait_for(lambda: consumers.unique() > 2 * RATE, 30, "traffic to flow")

    await replica_set.start("r1", "r2")
    served_by = {r: replica_set.replicas[r].read_log().count("taken over") for r in ("r1", "r2")}
    assert any(served_by.values()), f"the new replicas took nothing over: {served_by}"
    await wait_for(lambda: replica_set.settled(CONSUMERS), 30, "settled on 3 replicas")
    for r in ("r1", "r2"):
        replica_set.replicas[r].stop()
    view = await wait_for(lambda: replica_set.settled(CONSUMERS), 30, "settled back on r0")
    assert view["served_by"]["replica_id"] == "r0"

    produced = await producing
    await wait_for(lambda: consumers.unique() >= len(produced), 60, "every record processed")
    report = check(produced, consumers.processed())
    assert report.lost == [] and report.order_violations == [] and report.duplicates == 0


async def test_a_consumer_given_one_replica_finds_the_owner(
    replica_set: ReplicaSet, consumers: Workers
) -> None:
    await replica_set.start("r0", "r1", "r2")
    await create_topic(replica_set.bootstrap)
    # Any replica answers for the group (forwarded): find who serves it, then give the
    # consumer another replica's address only.
    owner = await wait_for(replica_set.owner, 30, "a replica to serve the group's partition")
    other = next(r for r in replica_set.replicas.values() if r is not owner)
    consumers.addresses = other.address
    consumers.spawn("c0", *SESSION)
    view = await wait_for(lambda: owner.settled(1), 30, "the consumer registered with the owner")
    assert view["served_by"]["replica_id"] == owner.replica_id
    assert RangeSet.from_pairs(view["members"][0]["ranges"]).size == 65536
