"""Who may join which group: the ACL file read again when it changes, the cluster's ACLs
cached for a bounded time, and what a Register gets when either says no or cannot say."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from keyshard.coordinator.runtime.authorization import (
    AclFileAuthorizer,
    AllowAll,
    AuthorizationUnavailable,
    ClusterAclAuthorizer,
    register_verdict,
)
from keyshard.coordinator.storage.base import StoreError
from keyshard.core.protocol.messages import ErrorCode
from keyshard.core.security.acl import (
    AclBinding,
    AclConfigError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from keyshard.core.security.identity import user

ALICE = user("alice")


def read(resource: ResourceType, name: str) -> AclBinding:
    return AclBinding(
        "User:alice", Permission.ALLOW, Operation.READ, resource, PatternType.LITERAL, name
    )


async def test_nothing_configured_allows_everyone() -> None:
    assert await register_verdict(AllowAll(), ALICE, "h", "g", ["t"]) is None


async def test_the_acl_file_is_read_again_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "acls"
    path.write_text(
        "User:alice allow Read Group literal a\nUser:alice allow Read Topic literal t\n"
    )
    authorizer = AclFileAuthorizer(str(path))
    assert await authorizer.refusal(ALICE, "h", "a", ["t"]) is None
    assert "lacks Read on Group 'b'" in str(await authorizer.refusal(ALICE, "h", "b", ["t"]))
    path.write_text(path.read_text() + "User:alice allow Read Group literal b\n")
    os.utime(path, ns=(1, 1))  # a new stamp, however coarse the file system's clock
    assert await authorizer.refusal(ALICE, "h", "b", ["t"]) is None
    # A change that does not parse: said, and the bindings before it stay.
    path.write_text("User:alice allow Read\n")
    assert await authorizer.refusal(ALICE, "h", "b", ["t"]) is None
    assert "the 3 ACL(s) read before stay in force" in caplog.text
    with pytest.raises(AclConfigError):
        AclFileAuthorizer(str(path))


class Cluster:
    def __init__(self) -> None:
        self.bindings: dict[ResourceType, tuple[AclBinding, ...]] = {
            ResourceType.GROUP: (read(ResourceType.GROUP, "a"),),
            ResourceType.TOPIC: (read(ResourceType.TOPIC, "t"),),
        }
        self.reads: list[ResourceType] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failure: Exception | None = None

    async def describe(self, resource: ResourceType) -> tuple[AclBinding, ...]:
        self.reads.append(resource)
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return self.bindings[resource]


async def test_the_clusters_acls_are_cached_for_a_bounded_time() -> None:
    cluster, now = Cluster(), [0.0]
    authorizer = ClusterAclAuthorizer(cluster.describe, cache_s=10, clock=lambda: now[0])
    assert await authorizer.refusal(ALICE, "h", "a", ["t"]) is None
    assert await authorizer.refusal(ALICE, "h", "b", ["t"]) is not None
    assert cluster.reads == [ResourceType.GROUP, ResourceType.TOPIC]  # once each
    # Granted on the cluster: in force once the cached copy is older than the bound.
    cluster.bindings[ResourceType.GROUP] += (read(ResourceType.GROUP, "b"),)
    now[0] = 9.9
    assert await authorizer.refusal(ALICE, "h", "b", ["t"]) is not None
    now[0] = 10.0
    assert await authorizer.refusal(ALICE, "h", "b", ["t"]) is None
    # No topics (a pattern that matches none): only the group is asked about.
    assert await authorizer.refusal(ALICE, "h", "a", []) is None


async def test_registers_during_a_read_share_it_and_a_failed_read_decides_nothing() -> None:
    cluster = Cluster()
    authorizer = ClusterAclAuthorizer(cluster.describe, cache_s=10)
    cluster.gate.clear()
    waiting = [asyncio.ensure_future(authorizer.refusal(ALICE, "h", "a", [])) for _ in range(5)]
    await asyncio.sleep(0)
    cluster.gate.set()
    assert await asyncio.gather(*waiting) == [None] * 5
    assert cluster.reads == [ResourceType.GROUP]
    cluster.failure = StoreError("Kafka refused DescribeAcls: grant User:keyshard Describe")
    fresh = ClusterAclAuthorizer(cluster.describe, cache_s=10)
    with pytest.raises(AuthorizationUnavailable, match="grant User:keyshard Describe"):
        await fresh.refusal(ALICE, "h", "a", [])
    verdict = await register_verdict(fresh, ALICE, "h", "a", [])
    assert verdict is not None and verdict[0] is ErrorCode.INTERNAL
    assert "cannot authorize the Register now" in verdict[1]


async def test_a_refusal_is_authorization_failed_naming_principal_group_and_permission() -> None:
    cluster = Cluster()
    verdict = await register_verdict(ClusterAclAuthorizer(cluster.describe), ALICE, "h", "b", [])
    assert verdict == (
        ErrorCode.AUTHORIZATION_FAILED,
        "User:alice may not join group 'b': it lacks Read on Group 'b' (no ACL allows it)",
    )


async def test_any_failure_to_read_the_clusters_acls_refuses_and_says_so() -> None:
    cluster = Cluster()
    cluster.failure = RuntimeError("the admin client is closed")
    authorizer = ClusterAclAuthorizer(cluster.describe, cache_s=10)
    verdict = await register_verdict(authorizer, ALICE, "h", "a", [])
    assert verdict == (
        ErrorCode.INTERNAL,
        "cannot authorize the Register now: cannot read the cluster's ACLs: RuntimeError: "
        "the admin client is closed",
    )
    cluster.failure = None  # read again at the next Register, not a cached failure
    assert await register_verdict(authorizer, ALICE, "h", "a", []) is None
