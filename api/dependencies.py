"""The admin API's routes' view of `keyshard.api.auth`: FastAPI dependencies that find
the caller's principal from its bearer token and check its role.

Apart from the rules themselves so that those import no web framework: the daemon
builds them from its flags before anything starts, and imports the web side (FastAPI
takes about a second) while it waits for Kafka."""

from __future__ import annotations

from fastapi import Depends, Request, params
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from keyshard.api.auth import AdminAuth
from keyshard.api.roles import Role
from keyshard.core.security.identity import Principal

bearer = HTTPBearer(
    auto_error=False,
    description="--admin-token, a token of --admin-tokens-file, or a JWT (--jwt-jwks-url)",
)
Credentials = HTTPAuthorizationCredentials | None


def for_group(auth: AdminAuth, needed: Role, action: str) -> params.Depends:
    """A FastAPI dependency for a route with a `{group}`; the caller's principal is left
    for the route in the request's state (`caller_of`)."""

    async def dependency(
        group: str,
        request: Request,
        credentials: Credentials = Depends(bearer),  # noqa: B008
    ) -> None:
        principal = await auth.check(credentials, needed, group, action.format(group=group))
        request.state.admin_principal = principal

    return params.Depends(dependency)


def for_every_group(auth: AdminAuth, needed: Role, action: str) -> params.Depends:
    """A FastAPI dependency for what shows every group (`/metrics`)."""

    async def dependency(
        credentials: Credentials = Depends(bearer),  # noqa: B008
    ) -> Principal | None:
        return await auth.check(credentials, needed, None, action)

    return params.Depends(dependency)


def for_listing(auth: AdminAuth) -> params.Depends:
    """`/v1/groups`: any principal when reads are protected (the list shows only the
    groups it has a role on); `caller_of` is None when they are open."""

    async def dependency(
        request: Request,
        credentials: Credentials = Depends(bearer),  # noqa: B008
    ) -> None:
        principal = None
        if auth.auth_reads and auth.configured:
            principal = await auth.principal(credentials)
        request.state.admin_principal = principal

    return params.Depends(dependency)


def caller_of(request: Request) -> Principal | None:
    """The principal the route's auth dependency found (None: reads are open)."""
    principal: Principal | None = getattr(request.state, "admin_principal", None)
    return principal
