"""The admin app over an in-memory group: auth rules, readiness, metrics, key lookup and
config validation, without processes (the real-daemon tests are in test_api.py)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from keyshard.api.app import create_app
from keyshard.coordinator.runtime.activity import LAG_NOT_READY_S
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.core.model.hashing import slot_for_key
from tests.api.fake_runtime import GROUP, TOPIC, fake_runtime

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client(**kwargs: object) -> tuple[TestClient, object]:
    runtime = fake_runtime()
    return TestClient(create_app(runtime, admin_token=TOKEN, **kwargs)), runtime  # type: ignore[arg-type]


def test_mutations_need_the_admin_token_and_change_nothing_without_it() -> None:
    http, _ = client()
    before = http.get(f"/v1/groups/{GROUP}").json()
    missing = http.post(f"/v1/groups/{GROUP}/rebalance")
    assert missing.status_code == 401
    assert missing.json()["error"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = http.delete(f"/v1/groups/{GROUP}/members/a-1", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert wrong.json() == {"error": "forbidden", "detail": "wrong admin token"}
    bad_config = http.put(f"/v1/groups/{GROUP}/config", json={"drain_timeout_ms": 500})
    assert bad_config.status_code == 401
    after = http.get(f"/v1/groups/{GROUP}").json()
    assert [m["member_id"] for m in after["members"]] == ["a-1", "b-2"]
    assert after["config"] == before["config"]


def test_without_a_configured_token_mutations_are_refused() -> None:
    http = TestClient(create_app(fake_runtime()))
    response = http.post(f"/v1/groups/{GROUP}/rebalance", headers=AUTH)
    assert response.status_code == 403
    assert "--admin-token" in response.json()["detail"]


def test_reads_are_open_unless_protected() -> None:
    open_reads, _ = client()
    assert open_reads.get("/v1/groups").status_code == 200
    closed, _ = client(auth_reads=True)
    assert closed.get("/v1/groups").status_code == 401
    assert closed.get("/metrics").status_code == 401
    assert closed.get("/v1/groups", headers=AUTH).status_code == 200
    assert closed.get("/healthz").status_code == 200  # liveness never needs a token


def test_an_unknown_query_parameter_is_named_not_ignored() -> None:
    http, _ = client()
    typo = http.get("/v1/groups?scop=local")
    assert typo.status_code == 400
    assert typo.json() == {"error": "bad_request", "detail": "unknown query parameter: scop"}
    assert http.get("/v1/groups?scope=local").status_code == 200
    assert http.get(f"/v1/groups/{GROUP}/keys/k?topc={TOPIC}").status_code == 400
    assert http.get(f"/v1/groups/{GROUP}/keys/k?topic={TOPIC}").status_code == 200


def test_readyz_names_the_reason() -> None:
    http, runtime = client()
    assert http.get("/readyz").json() == {"ready": True, "reason": None}
    runtime.metadata.reachable = False  # type: ignore[attr-defined]
    response = http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reason"].startswith("broker unreachable")
    runtime.ready = False  # type: ignore[attr-defined]
    assert http.get("/readyz").json()["reason"].startswith("state not loaded")


def test_a_lagging_event_loop_is_reported_and_fails_readiness() -> None:
    """The longest lag of the last ten seconds: a metric, and not ready past the bound,
    whatever the activity line took meanwhile."""
    http, runtime = client()
    activity = runtime.activity  # type: ignore[attr-defined]
    activity.lag(LAG_NOT_READY_S / 2)
    activity.take()
    assert http.get("/readyz").json() == {"ready": True, "reason": None}
    assert (
        f"keyshard_coordinator_loop_lag_seconds {LAG_NOT_READY_S / 2}" in http.get("/metrics").text
    )
    activity.lag(LAG_NOT_READY_S + 0.5)
    response = http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reason"].startswith("overloaded: the event loop lagged 2.5 s")


def test_metrics_read_live_state() -> None:
    http, _ = client()
    text = http.get("/metrics").text
    assert f'keyshard_group_members{{group="{GROUP}"}} 2.0' in text
    assert f'keyshard_member_owned_slots{{group="{GROUP}",member="a-1"}} 32768.0' in text
    assert f'keyshard_member_processed_total{{group="{GROUP}",member="a-1"}} 42.0' in text
    assert f'keyshard_draining_ranges{{group="{GROUP}",member="b-2"}} 1.0' in text
    low = f'keyshard_position_low_watermark{{group="{GROUP}",partition="1",topic="{TOPIC}"}}'
    assert f"{low} 0.0" in text


def test_metrics_show_how_long_state_writes_took() -> None:
    http, runtime = client()
    assert isinstance(runtime, CoordinatorRuntime)
    for seconds in (0.004, 0.02, 0.3):
        runtime.activity.timed("flush", seconds)
    text = http.get("/metrics").text
    name = "keyshard_coordinator_duration_seconds"
    assert f'{name}_bucket{{kind="flush",le="0.005"}} 1.0' in text
    assert f'{name}_bucket{{kind="flush",le="0.025"}} 2.0' in text
    assert f'{name}_bucket{{kind="flush",le="0.25"}} 2.0' in text
    assert f'{name}_bucket{{kind="flush",le="+Inf"}} 3.0' in text
    assert f'{name}_count{{kind="flush"}} 3.0' in text


def test_key_lookup_reports_owner_position_and_blocking() -> None:
    http, _ = client()
    key = next(k for k in (f"k{i}" for i in range(10_000)) if slot_for_key(k.encode()) >= 60000)
    view = http.get(f"/v1/groups/{GROUP}/keys/{key}", params={"topic": TOPIC}).json()
    assert view["slot"] == slot_for_key(key.encode())
    assert view["owner"] == "b-2"
    assert view["draining"] and view["blocked"]
    assert {(p["partition"], p["next_offset"]) for p in view["positions"]} == {(0, 99), (1, 0)}


def test_config_update_is_validated_and_applied() -> None:
    http, _ = client()
    url = f"/v1/groups/{GROUP}/config"
    assert http.put(url, json={"drain_timeout_ms": -1}, headers=AUTH).status_code == 422
    assert http.put(url, json={"assignor": "nope"}, headers=AUTH).status_code == 422
    assert http.put(url, json={"session_timeout_ms": 1}, headers=AUTH).status_code == 422
    missing = http.put("/v1/groups/nope/config", json={}, headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    assert http.put(url, json={"rebalance_threshold": 0.9}, headers=AUTH).status_code == 422
    done = http.put(url, json={"drain_timeout_ms": 2500}, headers=AUTH)
    assert done.status_code == 200
    assert http.get(f"/v1/groups/{GROUP}").json()["config"]["drain_timeout_ms"] == 2500
    knobs = {"rebalance_threshold": 1.5, "rebalance_hold_ms": 1000, "assignor": "consistent-hash"}
    assert http.put(url, json=knobs, headers=AUTH).status_code == 200
    config = http.get(f"/v1/groups/{GROUP}").json()["config"]
    assert {k: config[k] for k in knobs} == knobs
    assert config["auto_offset_reset"] == "earliest"
    assert http.put(url, json={"auto_offset_reset": "newest"}, headers=AUTH).status_code == 422
    assert http.put(url, json={"auto_offset_reset": "latest"}, headers=AUTH).status_code == 200
    view = http.get(f"/v1/groups/{GROUP}").json()
    assert view["config"]["auto_offset_reset"] == "latest"
    assert view["partitions"][0]["low_watermark"] == 99, "a group with positions keeps them"


def test_dashboard_is_served() -> None:
    http, _ = client()
    page = http.get("/")
    assert page.status_code == 200
    assert "<canvas" in page.text


def test_api_docs_need_no_network() -> None:
    """/docs (Swagger UI) and /redoc load their scripts and styles from this server, and
    these are there: the pages work where no CDN can be reached."""
    http, _ = client()
    for page in ("/docs", "/redoc"):
        html = http.get(page)
        assert html.status_code == 200
        assets = re.findall(r'(?:src|href)="([^"]+)"', html.text)
        assert assets and all(a.startswith("/") for a in assets), assets
        for asset in assets:
            served = http.get(asset)
            assert served.status_code == 200 and len(served.content) > 1000, asset
    assert http.get("/openapi.json").json()["info"]["title"] == "keyshard admin API"


def test_a_reset_of_positions_is_refused_while_members_own_its_slots() -> None:
    http, _ = client()
    url = f"/v1/groups/{GROUP}/positions/reset"
    assert http.post(url, json={"to": "earliest"}).status_code == 401
    refused = http.post(url, json={"to": "earliest", "execute": True}, headers=AUTH)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "conflict"
    assert "a-1 (slots 0-32767)" in refused.json()["detail"]
    assert "b-2 (slots 32768-65535)" in refused.json()["detail"]


def test_a_reset_request_is_validated() -> None:
    http, _ = client()
    url = f"/v1/groups/{GROUP}/positions/reset"
    for body in (
        {"to": "offset"},
        {"to": "earliest", "offset": 3},
        {"to": "datetime"},
        {"to": "offset", "offset": 1, "datetime": "2026-11-27T09:00:00Z"},
        {"to": "earliest", "slots": [0, 65536]},
        {"to": "sideways"},
    ):
        assert http.post(url, json=body, headers=AUTH).status_code == 422, body
    unknown = http.post(url, json={"to": "earliest", "topic": "nope"}, headers=AUTH)
    assert unknown.status_code == 404
    assert "does not read nope" in unknown.json()["detail"]
    unknown = http.post(url, json={"to": "earliest", "partition": 9}, headers=AUTH)
    assert unknown.status_code == 404
    assert "does not read a partition 9" in unknown.json()["detail"]
    assert (
        http.post(
            "/v1/groups/nope/positions/reset", json={"to": "earliest"}, headers=AUTH
        ).status_code
        == 404
    )


def test_a_fenced_members_slots_are_reset_a_dry_run_first() -> None:
    http, runtime = client()
    runtime.metadata.ends = {(TOPIC, 0): 1000}  # type: ignore[attr-defined]
    assert http.delete(f"/v1/groups/{GROUP}/members/a-1", headers=AUTH).status_code == 200
    url = f"/v1/groups/{GROUP}/positions/reset"
    body = {"to": "offset", "offset": 5, "topic": TOPIC, "partition": 0, "slots": [0, 32767]}
    dry = http.post(url, json=body, headers=AUTH)
    assert dry.status_code == 200, dry.text
    expected = [
        {"topic": TOPIC, "partition": 0, "start": 0, "end": 32767, "before": 99, "after": 5}
    ]
    assert dry.json() == {"group": GROUP, "to": "offset 5", "executed": False, "moves": expected}

    def next_offsets() -> list[int]:
        view = http.get(f"/v1/groups/{GROUP}").json()
        part = next(p for p in view["partitions"] if p["partition"] == 0)
        return [s["next_offset"] for s in part["segments"]]

    assert next_offsets() == [99]
    done = http.post(url, json={**body, "execute": True}, headers=AUTH)
    assert done.status_code == 200 and done.json()["executed"], done.text
    assert next_offsets() == [5, 99]
