"""May this principal join this group, reading these topics? Kafka's answer, per group.

A Register is authorized as a Kafka consumer's JoinGroup and Fetch are: Read on the Group
and Read on every Topic it reads (`keyshard.core.security.acl`). The bindings come from:

* the cluster (`--authorizer kafka`): its own ACLs, read with DescribeAcls through the
  coordinator's admin client and cached for `--acl-cache-ms`, so a grant or a revocation
  takes effect within that time, with no restart; the coordinator's principal needs
  Describe on the Cluster;
* a file (`--authorizer acl-file`): for clusters without an authorizer, read again when it
  changes (a ConfigMap update); a change that does not parse is logged and the previous
  bindings stay;
* nothing (the default): every authenticated consumer may join every group.

A refusal is `AUTHORIZATION_FAILED` naming the principal, the group and the missing
permission. ACLs that cannot be read (Kafka unreachable, the Describe missing) refuse
the Register as `INTERNAL`, which the client retries: never allowed by default.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from keyshard.coordinator.storage.base import StoreError
from keyshard.core.protocol.messages import ErrorCode
from keyshard.core.security.acl import (
    AclBinding,
    AclConfigError,
    ResourceType,
    read_acl_file,
    register_refusal,
)
from keyshard.core.security.identity import Principal

log = logging.getLogger(__name__)
DEFAULT_ACL_CACHE_MS = 10_000


class AuthorizationUnavailable(Exception):
    """The bindings could not be read: nothing can be decided (the message says why)."""


class Authorizer(Protocol):
    async def refusal(
        self, principal: Principal, host: str, group: str, topics: Sequence[str]
    ) -> str | None:
        """Why `principal` may not join `group` reading `topics`, or None.
        Raises AuthorizationUnavailable when it cannot tell."""
        ...

    def describe(self) -> str: ...


class AllowAll:
    async def refusal(
        self, principal: Principal, host: str, group: str, topics: Sequence[str]
    ) -> str | None:
        return None

    def describe(self) -> str:
        return "every authenticated consumer may join every group (no --authorizer)"


class AclFileAuthorizer:
    def __init__(self, path: str) -> None:
        self.path = path
        self._bindings = read_acl_file(path)
        self._seen = _stamp(path)

    async def refusal(
        self, principal: Principal, host: str, group: str, topics: Sequence[str]
    ) -> str | None:
        self._reload_if_changed()
        return register_refusal(self._bindings, principal, host, group, topics)

    def describe(self) -> str:
        return f"consumers are authorized by {len(self._bindings)} ACL(s) of {self.path}"

    def _reload_if_changed(self) -> None:
        stamp = _stamp(self.path)
        if stamp == self._seen:
            return
        self._seen = stamp
        try:
            self._bindings = read_acl_file(self.path)
        except AclConfigError as err:
            log.error("%s; the %d ACL(s) read before stay in force", err, len(self._bindings))
            return
        log.info("%s changed: %d ACL(s)", self.path, len(self._bindings))


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


class ClusterAclAuthorizer:
    """The cluster's ACLs, per resource type, each read at most once per `cache_s`;
    Registers that arrive while a read is under way wait for that one."""

    def __init__(
        self,
        describe: Callable[[ResourceType], Awaitable[tuple[AclBinding, ...]]],
        cache_s: float = DEFAULT_ACL_CACHE_MS / 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._describe = describe
        self.cache_s = cache_s
        self._clock = clock
        self._cache: dict[ResourceType, tuple[float, tuple[AclBinding, ...]]] = {}
        self._reads: dict[ResourceType, asyncio.Future[tuple[AclBinding, ...]]] = {}

    async def refusal(
        self, principal: Principal, host: str, group: str, topics: Sequence[str]
    ) -> str | None:
        bindings = await self._bindings(ResourceType.GROUP)
        if topics:
            bindings += await self._bindings(ResourceType.TOPIC)
        return register_refusal(bindings, principal, host, group, topics)

    def describe(self) -> str:
        return f"consumers are authorized by the cluster's ACLs (read every {self.cache_s:g} s)"

    async def _bindings(self, resource: ResourceType) -> tuple[AclBinding, ...]:
        cached = self._cache.get(resource)
        if cached is not None and self._clock() - cached[0] < self.cache_s:
            return cached[1]
        read = self._reads.get(resource)
        if read is None:
            read = self._reads[resource] = asyncio.ensure_future(self._read(resource))
            read.add_done_callback(lambda _: self._reads.pop(resource, None))
        try:
            return await asyncio.shield(read)
        except StoreError as err:
            raise AuthorizationUnavailable(str(err)) from None
        except Exception as err:
            # Whatever else the read fails with decides nothing either: refused, said.
            raise AuthorizationUnavailable(
                f"cannot read the cluster's ACLs: {type(err).__name__}: {err}"
            ) from None

    async def _read(self, resource: ResourceType) -> tuple[AclBinding, ...]:
        started = self._clock()
        bindings = await self._describe(resource)
        self._cache[resource] = (started, bindings)
        return bindings


#: `--authorizer`: where the bindings come from.
AUTHORIZERS = ("none", "kafka", "acl-file")


def authorizer_for(
    kind: str,
    *,
    acl_file: str | None = None,
    cache_ms: int = DEFAULT_ACL_CACHE_MS,
    describe: Callable[[ResourceType], Awaitable[tuple[AclBinding, ...]]] | None = None,
) -> Authorizer:
    """The authorizer `--authorizer kind` names; a missing input is a ValueError."""
    if kind == "kafka":
        if describe is None:
            raise ValueError("--authorizer kafka needs the cluster's admin client")
        return ClusterAclAuthorizer(describe, cache_ms / 1000)
    if kind == "acl-file":
        if not acl_file:
            raise ValueError("--authorizer acl-file needs --acl-file")
        return AclFileAuthorizer(acl_file)
    if kind == "none":
        return AllowAll()
    raise ValueError(f"--authorizer {kind!r}: one of {', '.join(AUTHORIZERS)}")


async def register_verdict(
    authorizer: Authorizer, principal: Principal, host: str, group: str, topics: Sequence[str]
) -> tuple[ErrorCode, str] | None:
    """The error a Register must be refused with, or None to go on."""
    try:
        refusal = await authorizer.refusal(principal, host, group, topics)
    except AuthorizationUnavailable as err:
        log.warning("cannot authorize %s in group %s: %s", principal, group, err)
        return ErrorCode.INTERNAL, f"cannot authorize the Register now: {err}"
    return None if refusal is None else (ErrorCode.AUTHORIZATION_FAILED, refusal)
