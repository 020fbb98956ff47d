"""Admin roles scoped to groups, from per-principal tokens, and the audit trail of every
change: a viewer cannot change anything, an operator of one group cannot touch another,
and each change says who made it, what and when."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from keyshard.api.app import create_app
from keyshard.api.auth import AdminAuth
from keyshard.api.roles import (
    ADMIN_TOKEN_PRINCIPAL,
    AdminRolesError,
    Role,
    parse_role_lines,
    read_roles_file,
)
from keyshard.core.security.identity import user
from keyshard.core.security.tokens import parse_token_lines
from tests.api.fake_runtime import GROUP, fake_runtime

TOKENS = parse_token_lines(
    "User:viewer Zq9-viewer\nUser:ops-a Zq9-ops-a\nUser:ops-b Zq9-ops-b\nUser:nobody Zq9-nobody\n",
    "tokens",
)
ROLES = parse_role_lines(
    "User:viewer viewer *\n"
    f"User:ops-a operator {GROUP} other-a.*\n"
    "User:ops-b operator other-b\n"
    "User:ops-b viewer *\n",
    "roles",
)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer Zq9-{name}"}


def http(auth_reads: bool = False) -> TestClient:
    auth = AdminAuth(token="Zq9-admin", auth_reads=auth_reads, tokens=TOKENS, roles=ROLES)
    return TestClient(create_app(fake_runtime(), auth=auth))


def test_roles_are_scoped_to_groups_and_ordered() -> None:
    assert ROLES.role(user("ops-a"), GROUP) is Role.OPERATOR
    assert ROLES.role(user("ops-a"), "other-a.x") is Role.OPERATOR
    assert ROLES.role(user("ops-a"), "other-b") is None
    assert ROLES.role(user("ops-b"), "other-b") is Role.OPERATOR  # the higher of two
    assert ROLES.role(user("ops-b"), GROUP) is Role.VIEWER
    assert ROLES.role(user("viewer"), None) is Role.VIEWER  # `*` reaches every group
    assert ROLES.role(user("ops-a"), None) is None
    assert ROLES.role(ADMIN_TOKEN_PRINCIPAL, "anything") is Role.OPERATOR


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("User:a viewer", "expected '<principal> <viewer|operator> <group> ...'"),
        ("alice viewer *", "'alice' is not a principal"),
        ("User:a admin *", "'admin' is not a role"),
        ("User:a viewer 'g", "unbalanced quotes"),
    ],
)
def test_a_malformed_roles_file_names_the_line(text: str, complaint: str) -> None:
    with pytest.raises(AdminRolesError, match=re.escape(complaint)):
        parse_role_lines(text, "roles")


def test_an_unreadable_roles_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(AdminRolesError, match=r"--admin-roles-file .* cannot read it"):
        read_roles_file(str(tmp_path / "missing"))


MUTATIONS = [
    ("put", "config", {"json": {"drain_timeout_ms": 7000}}, "change the config of"),
    ("post", "rebalance", {}, "rebalance"),
    ("delete", "members/a-1", {}, "fence a member of"),
    (
        "post",
        "positions/reset",
        {"json": {"to": "earliest", "execute": True}},
        "reset the positions of",
    ),
]


def test_every_state_changing_route_is_one_checked_here() -> None:
    """A route added later that changes state fails this until MUTATIONS checks it."""
    app = create_app(fake_runtime(), auth=AdminAuth(token="Zq9-admin", roles=ROLES))
    changing = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
        if method in {"POST", "PUT", "PATCH", "DELETE"}
    }
    checked = {(m.upper(), f"/v1/groups/{{group}}/{p}") for m, p, _, _ in MUTATIONS}
    checked = {(m, p.replace("members/a-1", "members/{member}")) for m, p in checked}
    assert changing == checked


@pytest.mark.parametrize(("method", "path", "body", "action"), MUTATIONS)
def test_a_viewer_and_an_operator_of_another_group_change_nothing(
    method: str, path: str, body: dict[str, object], action: str
) -> None:
    client = http()
    before = client.get(f"/v1/groups/{GROUP}").json()
    path = f"/v1/groups/{GROUP}/{path}"
    viewer = client.request(method, path, headers=bearer("viewer"), **body)  # type: ignore[arg-type]
    assert viewer.status_code == 403
    assert viewer.json()["detail"] == (
        f"User:viewer may not {action} group '{GROUP}': it is a viewer of group "
        f"'{GROUP}', and that needs operator"
    )
    other = client.request(method, path, headers=bearer("nobody"), **body)  # type: ignore[arg-type]
    assert other.status_code == 403
    assert f"it has no admin role on group '{GROUP}'" in other.json()["detail"]
    after = client.get(f"/v1/groups/{GROUP}").json()
    assert after == before
    assert client.get(f"/v1/groups/{GROUP}/audit").json() == {"group": GROUP, "entries": []}


def test_each_change_is_in_the_audit_trail_with_who_what_and_when() -> None:
    client = http()
    config = client.put(
        f"/v1/groups/{GROUP}/config", json={"drain_timeout_ms": 7000}, headers=bearer("ops-a")
    )
    assert config.status_code == 200
    assert client.post(f"/v1/groups/{GROUP}/rebalance", headers=bearer("ops-a")).status_code == 200
    admin = {"Authorization": "Bearer Zq9-admin"}
    assert client.delete(f"/v1/groups/{GROUP}/members/a-1", headers=admin).status_code == 200
    entries = client.get(f"/v1/groups/{GROUP}/audit").json()["entries"]
    assert [(e["principal"], e["action"]) for e in entries] == [
        ("User:keyshard-admin", "fence"),
        ("User:ops-a", "rebalance"),
        ("User:ops-a", "config"),
    ]
    assert entries[0]["detail"] == "member a-1"
    assert entries[2]["detail"] == "drain_timeout_ms=7000"
    assert entries[0]["at"].endswith("+00:00")


def test_protected_reads_show_a_principal_only_its_groups() -> None:
    client = http(auth_reads=True)
    assert client.get(f"/v1/groups/{GROUP}").status_code == 401
    assert client.get(f"/v1/groups/{GROUP}", headers=bearer("ops-a")).status_code == 200
    refused = client.get(f"/v1/groups/{GROUP}", headers=bearer("nobody"))
    assert refused.status_code == 403
    assert "User:nobody may not view group 'orders'" in refused.json()["detail"]
    listed = client.get("/v1/groups?scope=local", headers=bearer("nobody")).json()["groups"]
    assert listed == []
    listed = client.get("/v1/groups?scope=local", headers=bearer("viewer")).json()["groups"]
    assert [g["group"] for g in listed] == [GROUP]
    # /metrics shows every group: it needs a role on every group.
    assert client.get("/metrics", headers=bearer("viewer")).status_code == 200
    metrics = client.get("/metrics", headers=bearer("ops-a"))
    assert metrics.status_code == 403
    assert "no admin role on every group" in metrics.json()["detail"]
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).json() == {
        "error": "forbidden",
        "detail": "wrong admin token",
    }
