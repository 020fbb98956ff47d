"""Kafka's ACL decision, and the ACL file: the same grant means what it means on the
brokers (StandardAuthorizer's rules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyshard.core.security.acl import (
    AclBinding,
    AclConfigError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    decide,
    parse_acl_lines,
    read_acl_file,
    register_refusal,
)
from keyshard.core.security.identity import user

ALICE = user("alice")
GROUP, TOPIC = ResourceType.GROUP, ResourceType.TOPIC


def acl(
    principal: str = "User:alice",
    operation: Operation = Operation.READ,
    resource: ResourceType = GROUP,
    name: str = "team-a.orders",
    pattern: PatternType = PatternType.LITERAL,
    permission: Permission = Permission.ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(principal, permission, operation, resource, pattern, name, host)


def allowed(bindings: list[AclBinding], name: str = "team-a.orders", **kw: object) -> bool:
    operation = kw.get("operation", Operation.READ)
    resource = kw.get("resource", GROUP)
    principal = kw.get("principal", ALICE)
    host = kw.get("host", "10.0.0.1")
    return decide(bindings, principal, host, operation, resource, name).allowed  # type: ignore[arg-type]


def test_nothing_that_applies_is_denied() -> None:
    assert not allowed([])
    assert not allowed([acl(name="team-b.orders")])
    assert not allowed([acl(resource=TOPIC)])
    assert not allowed([acl(principal="User:bob")])
    assert not allowed([acl(operation=Operation.WRITE)])
    assert not allowed([acl(host="10.0.0.2")])


def test_literal_wildcard_prefixed_principal_wildcard_and_host_match() -> None:
    assert allowed([acl()])
    assert allowed([acl(name="*")])
    assert allowed([acl(name="team-a.", pattern=PatternType.PREFIXED)])
    assert not allowed([acl(name="team-a.", pattern=PatternType.LITERAL)])
    assert not allowed([acl(name="team-b", pattern=PatternType.PREFIXED)])
    assert allowed([acl(principal="User:*")])
    assert allowed([acl(host="10.0.0.1")])
    assert allowed([acl(operation=Operation.ALL)])


def test_a_deny_wins_and_read_implies_describe_only() -> None:
    deny = acl(name="team-a.", pattern=PatternType.PREFIXED, permission=Permission.DENY)
    assert not allowed([acl(), deny])
    decision = decide([deny, acl()], ALICE, "h", Operation.READ, GROUP, "team-a.orders")
    assert decision.denied_by == deny
    assert allowed([acl()], operation=Operation.DESCRIBE)
    assert not allowed([acl(operation=Operation.DESCRIBE)], operation=Operation.READ)


def test_a_register_needs_read_on_the_group_and_every_topic() -> None:
    bindings = [
        acl(name="team-a.", pattern=PatternType.PREFIXED),
        acl(resource=TOPIC, name="orders"),
        acl(resource=TOPIC, name="payments", permission=Permission.DENY),
    ]
    assert register_refusal(bindings, ALICE, "h", "team-a.x", ["orders"]) is None
    assert register_refusal(bindings, ALICE, "h", "team-b.x", ["orders"]) == (
        "User:alice may not join group 'team-b.x': it lacks Read on Group 'team-b.x' "
        "(no ACL allows it)"
    )
    assert register_refusal(bindings, ALICE, "h", "team-a.x", ["orders", "payments"]) == (
        "User:alice may not join group 'team-a.x': it lacks Read on Topic 'payments' "
        "(an ACL denies it)"
    )


def test_the_acl_file_reads_as_kafka_acls_read() -> None:
    bindings = parse_acl_lines(
        "# team A\n"
        "User:team-a allow Read Group prefixed team-a.\n"
        "User:team-a ALLOW read topic PREFIXED orders  # its topics\n"
        "'User:CN=x,O=Example Corp' deny All Topic literal * 10.0.0.9\n",
        "acls",
    )
    assert bindings == (
        AclBinding("User:team-a", Permission.ALLOW, Operation.READ, GROUP,
                   PatternType.PREFIXED, "team-a."),
        AclBinding("User:team-a", Permission.ALLOW, Operation.READ, TOPIC,
                   PatternType.PREFIXED, "orders"),
        AclBinding("User:CN=x,O=Example Corp", Permission.DENY, Operation.ALL, TOPIC,
                   PatternType.LITERAL, "*", "10.0.0.9"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("User:a allow Read Group literal", r"acls line 1: expected .*\(5 fields\)"),
        ("alice allow Read Group literal g", r"acls line 1: 'alice' is not a principal"),
        (
            "User:a maybe Read Group literal g",
            r"'maybe' is not a permission \(one of Allow, Deny\)",
        ),
        ("User:a allow Eat Group literal g", r"'Eat' is not a operation"),
        ("User:a allow Read Queue literal g", r"'Queue' is not a resource type"),
        ("User:a allow Read Group regex g", r"'regex' is not a pattern type"),
        ("\nUser:a allow Read Group literal 'g", r"acls line 2: unbalanced quotes"),
    ],
)
def test_a_malformed_acl_file_names_the_line_and_what_is_wrong(text: str, complaint: str) -> None:
    with pytest.raises(AclConfigError, match=complaint):
        parse_acl_lines(text, "acls")


def test_an_unreadable_acl_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(AclConfigError, match=r"--acl-file .*cannot read it"):
        read_acl_file(str(tmp_path / "missing"))
