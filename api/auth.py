"""Who is calling the admin API, and may they do this to that group.

A bearer token names a principal: the shared `--admin-token` (`User:keyshard-admin`,
operator of every group), a per-principal token of `--admin-tokens-file`, or a JWT
verified as consumers' are (`--jwt-jwks-url`). Roles scoped to groups
(`keyshard.api.roles`) decide what it may do. The admin credentials are separate from the
consumers' Register token: handing a consumer its credentials must not let it fence other
members.

Changes always need a principal with the operator role on the group; reads need the
viewer role only with `--admin-auth-reads`. With no admin credentials configured at all,
changes are refused outright rather than left open: an admin port reachable from the
network must not let anyone rebalance or fence.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Protocol

from keyshard.api.roles import ADMIN_TOKEN_PRINCIPAL, AdminRoles, Role
from keyshard.coordinator.server.authentication import AuthenticationFailed, TokenVerifier
from keyshard.core.security.identity import Principal
from keyshard.core.security.tokens import TokenTable


class BearerCredentials(Protocol):
    """What an `Authorization: Bearer` header carried (FastAPI's
    HTTPAuthorizationCredentials): the rules here do not import the web side, so the
    daemon builds them before it has (keyshard.api.dependencies wires them to routes)."""

    @property
    def credentials(self) -> str: ...


Credentials = BearerCredentials | None


class AdminAuthError(Exception):
    def __init__(self, status_code: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.error = error
        self.detail = detail


@dataclass(frozen=True, slots=True)
class AdminAuth:
    token: str | None = field(default=None, repr=False)
    auth_reads: bool = False
    tokens: TokenTable | None = None
    jwt: TokenVerifier | None = None
    roles: AdminRoles = field(default_factory=AdminRoles)

    @property
    def configured(self) -> bool:
        return self.token is not None or self.tokens is not None or self.jwt is not None

    async def principal(self, credentials: Credentials) -> Principal:
        """Whose bearer token this is; AdminAuthError when nobody's."""
        if credentials is None:
            raise AdminAuthError(
                401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'"
            )
        given = credentials.credentials
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return ADMIN_TOKEN_PRINCIPAL
        if self.tokens is not None and (found := self.tokens.principal(given)) is not None:
            return found
        if self.jwt is not None and self.jwt.accepts(given):
            try:
                principal = await self.jwt.principal(given)
            except AuthenticationFailed as err:
                raise AdminAuthError(403, "forbidden", str(err)) from None
            if principal == ADMIN_TOKEN_PRINCIPAL:
                # Operator of every group is the --admin-token's alone: an issuer's user
                # that happens to be called so is not made it.
                raise AdminAuthError(
                    403,
                    "forbidden",
                    f"a JWT may not name {ADMIN_TOKEN_PRINCIPAL}, the --admin-token's holder",
                )
            return principal
        raise AdminAuthError(403, "forbidden", "wrong admin token")

    async def check(
        self, credentials: Credentials, needed: Role, group: str | None, action: str
    ) -> Principal | None:
        """The caller's principal if it may `action` on `group` (None: every group), or
        None when the action is a read and reads are open. AdminAuthError otherwise."""
        if needed is Role.VIEWER and not self.auth_reads:
            return None
        if not self.configured:
            if needed is Role.VIEWER:
                return None
            raise AdminAuthError(
                403,
                "forbidden",
                "mutations are disabled: the daemon has no admin token "
                "(start it with --admin-token or KEYSHARD_ADMIN_TOKEN, or --admin-tokens-file)",
            )
        principal = await self.principal(credentials)
        refusal = self.roles.refusal(principal, needed, group, action)
        if refusal is not None:
            raise AdminAuthError(403, "forbidden", refusal)
        return principal

    def may_view(self, principal: Principal | None, group: str) -> bool:
        return principal is None or self.roles.role(principal, group) is not None
