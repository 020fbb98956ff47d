"""Alive means making progress (docs/protocol.md §7.6), on real brokers: a consumer that
cannot read Kafka while its coordinator channel stays up gives its keys up and takes a
share again once it can; a consumer whose handler completes nothing while records wait in
its slots is fenced by the coordinator and its ranges move."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import (
    CoordinatorProcess,
    CuttableProxy,
    Workers,
    create_topic,
    produce,
    wait_for,
)
from harness.brokers.kafka import KafkaBroker, KafkaUnavailable, missing_tools
from keyshard.local.processes import free_port
from keyshard.local.verify import check

pytestmark = pytest.mark.integration
SESSION_S = 6.0
SESSION = ("--session-timeout-ms", str(int(SESSION_S * 1000)))


async def _readyz(port: int) -> tuple[int, str] | None:
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            response = await client.get(f"http://127.0.0.1:{port}/readyz")
    except httpx.HTTPError:
        return None
    return response.status_code, response.text


async def _ready_is(port: int, code: int) -> str | None:
    """The /readyz answer's text when its status is `code`."""
    answer = await _readyz(port)
    return answer[1] if answer is not None and answer[0] == code else None


def _member(view: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    if view is None:
        return None
    return next((m for m in view["members"] if m["name"] == name), None)


@pytest.fixture
async def routed_kafka() -> AsyncIterator[tuple[KafkaBroker, CuttableProxy]]:
    """An Apache Kafka node with a listener `CUT` advertised at a proxy in front of it: a
    client bootstrapped there reaches the broker only through the proxy."""
    reason = missing_tools()
    if reason is not None:
        pytest.skip(f"Apache Kafka tests skipped: {reason}")
    proxy = CuttableProxy()
    await proxy.start()
    broker = KafkaBroker(extra_listeners={"CUT": "PLAINTEXT"}, advertised={"CUT": proxy.address})
    try:
        await asyncio.to_thread(broker.start)
    except KafkaUnavailable as err:
        await proxy.stop()
        pytest.skip(f"Apache Kafka tests skipped: {err}")
    proxy.target = broker.listener("CUT")
    try:
        yield broker, proxy
    finally:
        await proxy.stop()
        await asyncio.to_thread(broker.stop)


async def test_a_consumer_cut_off_from_kafka_gives_its_keys_up_and_comes_back(
    routed_kafka: tuple[KafkaBroker, CuttableProxy], tmp_path: Path
) -> None:
    broker, proxy = routed_kafka
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers, tmp_path, extra=["--drain-timeout-ms", "2000"]
    )
    await coordinator.start()
    workers = Workers(coordinator, tmp_path)
    try:
        await create_topic(broker.bootstrap_servers, partitions=2)
        workers.spawn_cli("c0", *SESSION)
        workers.spawn_cli("c1", *SESSION)
        port = free_port()
        workers.spawn_cli(
            "cut", *SESSION, "--metrics-listen", f"127.0.0.1:{port}",
            env={"KEYSHARD_BOOTSTRAP_SERVERS": proxy.address},
        )  # fmt: skip
        await wait_for(lambda: coordinator.settled(3), 60, "3 settled members")
        # 200 records/s over 300 keys for 60 s; the cut comes 15 s in.
        producing = asyncio.ensure_future(produce(broker.bootstrap_servers, 12_000, 300, rate=200))
        await wait_for(lambda: workers.unique() >= 2_500, 40, "15 s of traffic processed")
        assert {e.worker for e in workers.processed()} == {"c0", "c1", "cut"}

        proxy.cut()
        cut_at = time.monotonic()
        settled = await wait_for(
            lambda: coordinator.settled(2), SESSION_S + 10, "2 members owning everything"
        )
        moved_after = time.monotonic() - cut_at
        assert _member(settled, "cut") is None
        assert moved_after <= SESSION_S + 5, moved_after
        unready = await wait_for(lambda: _ready_is(port, 503), 5, "the cut one unready")
        assert "cannot read Kafka" in unready, unready
        log = workers.output("cut")
        assert log.count("handing its ranges back") == 1, log
        # Still cut off a while later: it stays aside, unready, and nobody waits for it.
        await wait_for(lambda: workers.unique() >= 5_000, 60, "traffic to flow without it")
        assert await _ready_is(port, 503)

        proxy.heal()
        healed_at = time.monotonic()
        back = await wait_for(
            lambda: coordinator.settled(3), 60, "the consumer back, 3 settled members"
        )
        member = _member(back, "cut")
        assert member is not None and member["ranges"], back
        await wait_for(lambda: _ready_is(port, 200), 30, "the consumer's /readyz 200 again")
        rejoined_after = time.monotonic() - healed_at

        produced = await producing
        await wait_for(lambda: workers.unique() >= len(produced), 90, "every record processed")
        report = check(produced, workers.processed())
        assert report.lost == [], report.lost[:10]
        assert report.order_violations == [], report.order_violations[:5]
        assert report.duplicates == 0, report.duplicates  # a Leave hands over exactly
        # It took a share again: records it started after the heal (one monotonic clock).
        assert any(e.worker == "cut" and e.t0 / 1e9 > healed_at for e in workers.processed())
        print(
            f"moved {moved_after:.1f} s after the cut (session {SESSION_S:g} s), back "
            f"{rejoined_after:.1f} s after the heal; {report.duplicates} duplicates, "
            f"per worker {report.per_worker}"
        )
    finally:
        workers.stop_all()
        coordinator.stop()


# Slot counts, not load: no backlog rebalance sends the stuck member a StopFetcher it
# could not drain (a drain deadline would fence it first); only the stall rule acts.
@pytest.mark.coordinator_args(
    "--assignor", "balanced", "--stall-timeout-ms", str(int(SESSION_S * 1000))
)
async def test_a_consumer_that_completes_nothing_while_records_wait_is_fenced(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    """Its channel stays up and it answers every Ping; its handler hangs on every record
    until the member is fenced. Its ranges move after the bound (`--stall-timeout-ms`, one
    session here), and the records it had not started run once elsewhere."""
    await create_topic(coordinator.bootstrap)
    workers.spawn_cli("c0", *SESSION)
    workers.spawn_cli("c1", *SESSION)
    workers.spawn_cli(
        "stuck", *SESSION, target="tests.integration.worker_app:handle_stuck_until_fenced"
    )
    view = await wait_for(lambda: coordinator.settled(3), 60, "3 settled members")
    stuck = _member(view, "stuck")
    assert stuck is not None and stuck["ranges"]
    produced = await produce(coordinator.bootstrap, 3_000, 300)
    backlog_at = time.monotonic()

    def fenced(view: dict[str, Any] | None) -> list[dict[str, Any]]:
        return [
            h for h in (view or {}).get("handoffs", [])
            if h["from_member"] == stuck["member_id"] and h["kind"] == "fenced"
        ]  # fmt: skip

    async def moved() -> list[dict[str, Any]] | None:
        handoffs = fenced(await coordinator.group())
        return handoffs if handoffs and all(h["resumed_at"] for h in handoffs) else None

    handoffs = await wait_for(moved, 4 * SESSION_S + 20, "the stuck member's ranges moved")
    fenced_after = time.monotonic() - backlog_at
    assert fenced_after >= SESSION_S, fenced_after
    log = coordinator.read_log()
    assert f"closing member {stuck['member_id']}: no progress for" in log, log[-3000:]
    assert "its handlers completed none of them" in log
    await wait_for(lambda: workers.unique() >= len(produced), 90, "every record processed")
    report = check(produced, workers.processed())
    assert report.lost == []
    assert report.duplicates == 0, report.duplicates
    assert report.order_violations == [], report.order_violations[:5]
    print(f"moved {fenced_after:.1f} s after the backlog ({len(handoffs)} handoff(s))")
