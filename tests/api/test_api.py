"""The admin API of a real coordinator, with real workers on a real broker: views, metrics,
readiness, rebalance, config, fence, key lookup and the bearer-token rules."""

from __future__ import annotations

from typing import Any

import httpx
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
from keyshard.core.model.hashing import slot_for_key
from keyshard.local.broker import EmbeddedBroker
from tests.api.conftest import ADMIN_ARGS, ADMIN_TOKEN

pytestmark = [pytest.mark.integration, pytest.mark.coordinator_args(*ADMIN_ARGS)]
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def ownership(view: dict[str, Any]) -> dict[str, tuple[int, list[list[int]]]]:
    return {m["member_id"]: (m["epoch"], m["ranges"]) for m in view["members"]}


async def test_views_and_operations_on_a_live_group(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await create_topic(coordinator.bootstrap)
    workers.spawn("c0")
    workers.spawn("c1")
    await wait_for(lambda: coordinator.settled(2), 30, "2 settled members")
    await produce(coordinator.bootstrap, 2_000, 100)
    await wait_for(lambda: workers.unique() >= 2_000, 60, "2,000 records processed")

    async with httpx.AsyncClient(base_url=coordinator.admin_url, timeout=5) as http:
        groups = (await http.get("/v1/groups")).json()["groups"]
        assert [(g["group"], g["members"], g["owned_slots"]) for g in groups] == [(GROUP, 2, 65536)]

        async def processed_reported() -> dict[str, Any] | None:
            view = (await http.get(f"/v1/groups/{GROUP}")).json()
            members = view["members"]
            done = sum(m["processed"] for m in members) >= 2_000
            rated = all(m["processed_per_s"] is not None for m in members)
            # Lag: the partition's end as the workers' fetches saw it, minus each owned
            # range's position; everything was processed, so it drains to 0.
            caught_up = all(m["lag"] == 0 and m["range_lag"] for m in members)
            return view if done and rated and caught_up else None

        view = await wait_for(processed_reported, 15, "processed counts and zero lag reported")
        high = {r["high_watermark"] for m in view["members"] for r in m["range_lag"]}
        assert high == {2_000}
        assert view["config"]["drain_timeout_ms"] == 2000

        where = (await http.get(f"/v1/groups/{GROUP}/keys/key-7", params={"topic": TOPIC})).json()
        assert where["slot"] == slot_for_key(b"key-7")
        assert where["owner"] in {m["member_id"] for m in view["members"]}
        assert not where["blocked"]
        assert [(p["topic"], p["partition"]) for p in where["positions"]] == [(TOPIC, 0)]

        metrics = (await http.get("/metrics")).text
        assert f'keyshard_group_members{{group="{GROUP}"}} 2.0' in metrics
        assert "keyshard_member_processed_total" in metrics
        assert f'keyshard_position_low_watermark{{group="{GROUP}",partition="0"' in metrics
        assert (await http.get("/readyz")).json() == {"ready": True, "reason": None}

        # Unauthenticated and wrongly authenticated mutations change nothing.
        before = ownership((await http.get(f"/v1/groups/{GROUP}")).json())
        victim = sorted(before)[0]
        for headers, status in (({}, 401), ({"Authorization": "Bearer wrong"}, 403)):
            assert (
                await http.post(f"/v1/groups/{GROUP}/rebalance", headers=headers)
            ).status_code == status
            fence = await http.delete(f"/v1/groups/{GROUP}/members/{victim}", headers=headers)
            assert fence.status_code == status
            assert fence.json()["error"] in {"unauthorized", "forbidden"}
            put = await http.put(
                f"/v1/groups/{GROUP}/config", json={"drain_timeout_ms": 999}, headers=headers
            )
            assert put.status_code == status
        after = (await http.get(f"/v1/groups/{GROUP}")).json()
        assert ownership(after) == before
        assert after["config"]["drain_timeout_ms"] == 2000

        # With the token: config, rebalance (already balanced: nothing moves), fence.
        put = await http.put(
            f"/v1/groups/{GROUP}/config", json={"drain_timeout_ms": 3000}, headers=AUTH
        )
        assert put.status_code == 200 and put.json()["drain_timeout_ms"] == 3000
        bad = await http.put(
            f"/v1/groups/{GROUP}/config", json={"drain_timeout_ms": 0}, headers=AUTH
        )
        assert bad.status_code == 422
        rebalance = await http.post(f"/v1/groups/{GROUP}/rebalance", headers=AUTH)
        assert rebalance.status_code == 200
        assert rebalance.json()["moved_slots"] == 0
        assert set(rebalance.json()["target"]) == set(before)
        assert (
            await http.delete(f"/v1/groups/nope/members/{victim}", headers=AUTH)
        ).status_code == 404
        fenced = await http.delete(f"/v1/groups/{GROUP}/members/{victim}", headers=AUTH)
        assert fenced.status_code == 200 and fenced.json()["fenced"]

        async def victim_gone_and_settled() -> dict[str, Any] | None:
            view = await coordinator.settled(2)  # the fenced worker re-registers as a new member
            return view if view and victim not in ownership(view) else None

        await wait_for(victim_gone_and_settled, 30, "fenced member replaced, group settled")
        handoffs = (await http.get(f"/v1/groups/{GROUP}/handoffs")).json()
        fenced_handoffs = [h for h in handoffs["handoffs"] if h["from_member"] == victim]
        assert fenced_handoffs and all(h["pause_s"] is not None for h in fenced_handoffs)
        assert handoffs["draining"] == []


async def test_readyz_reports_an_unreachable_broker(
    coordinator: CoordinatorProcess, broker: EmbeddedBroker
) -> None:
    async with httpx.AsyncClient(base_url=coordinator.admin_url, timeout=5) as http:
        assert (await http.get("/readyz")).status_code == 200
        broker.kill()

        async def not_ready() -> dict[str, Any] | None:
            response = await http.get("/readyz")
            return response.json() if response.status_code == 503 else None

        body = await wait_for(not_ready, 20, "/readyz to fail")
        assert body["ready"] is False
        assert body["reason"].startswith("broker unreachable")
        assert (await http.get("/healthz")).status_code == 200
    # A graceful stop would spend its Kafka timeouts on the dead broker (15 s): nothing
    # left to check here.
    coordinator.kill()
