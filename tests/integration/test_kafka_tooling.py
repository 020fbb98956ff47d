"""Lag as users see it: Kafka's own `kafka-consumer-groups --describe` shows a keyshard
group's committed offsets and lag, the same as the admin API says (Apache Kafka only:
the tool is Kafka's, from `kafka-tools`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness import (
    GROUP,
    TOPIC,
    CoordinatorProcess,
    Workers,
    create_topic,
    produce,
    wait_for,
)
from harness.brokers.kafka import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.brokers("kafka")]


def describe(bootstrap: str, group: str) -> dict[int, dict[str, str]]:
    """kafka-consumer-groups --describe: partition -> its row (column name -> value)."""
    done = run_tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "--bootstrap-server", bootstrap, "--describe", "--group", group,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(i for i, cols in enumerate(lines) if cols[:2] == ["GROUP", "TOPIC"])
    names = lines[header]
    rows = [dict(zip(names, cols, strict=False)) for cols in lines[header + 1 :]]
    return {int(r["PARTITION"]): r for r in rows if r.get("TOPIC") == TOPIC}


async def test_kafka_consumer_groups_shows_the_groups_offsets_and_lag(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap, partitions=2)
    produced = await produce(coordinator.bootstrap, 6000, 200)
    ends = {p: 1 + max(r.offset for r in produced if r.partition == p) for p in (0, 1)}
    for name in ("a", "b"):
        workers.spawn(name, "--handler-ms", "5")
    await wait_for(lambda: workers.unique() > 1000, 60, "a sixth processed")
    for name in ("a", "b"):
        workers.stop(name)  # graceful: exact positions, then no more progress

    async def settled_positions() -> dict[int, int] | None:
        view: Any = await coordinator.group(GROUP)
        if view is None or view["members"]:
            return None
        return {p["partition"]: p["low_watermark"] for p in view["partitions"]}

    positions = await wait_for(settled_positions, 30, "the group's final positions")
    assert 0 < sum(positions.values()) < sum(ends.values()), "stopped mid-stream: lag left"

    def matches() -> dict[int, dict[str, str]] | None:
        rows = describe(coordinator.bootstrap, GROUP)
        committed = {p: int(r["CURRENT-OFFSET"]) for p, r in rows.items()
                     if r["CURRENT-OFFSET"] != "-"}  # fmt: skip
        return rows if committed == positions else None

    rows = await wait_for(lambda: asyncio.to_thread(matches), 60, "the tool to show them")
    for p, row in rows.items():
        assert int(row["LOG-END-OFFSET"]) == ends[p]
        # One partition may be drained by the time both have left (its slots run in
        # parallel); the lag the tool shows is still exactly what is left of each.
        assert int(row["LAG"]) == ends[p] - positions[p]
    assert sum(int(row["LAG"]) for row in rows.values()) > 0
