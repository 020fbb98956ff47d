"""Bearer-token checks for the admin API.

The admin token is separate from the consumers' Register token: handing a consumer its
credentials must not let it fence other members. Mutations always need the token; reads
only when the daemon runs with `--admin-auth-reads`. Without a configured admin token,
mutations are refused outright rather than left open: an admin port reachable from the
network must not let anyone rebalance or fence.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Depends, params
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer = HTTPBearer(auto_error=False, description="the daemon's --admin-token")


class AdminAuthError(Exception):
    def __init__(self, status_code: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.error = error
        self.detail = detail


@dataclass(frozen=True, slots=True)
class AdminAuth:
    token: str | None = None
    auth_reads: bool = False

    def check(self, credentials: HTTPAuthorizationCredentials | None, *, mutation: bool) -> None:
        if not mutation and not self.auth_reads:
            return
        if self.token is None:
            if not mutation:
                return
            raise AdminAuthError(
                403,
                "forbidden",
                "mutations are disabled: the daemon has no admin token "
                "(start it with --admin-token or KEYSHARD_ADMIN_TOKEN)",
            )
        if credentials is None:
            raise AdminAuthError(
                401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'"
            )
        if not hmac.compare_digest(credentials.credentials.encode(), self.token.encode()):
            raise AdminAuthError(403, "forbidden", "wrong admin token")

    def for_mutations(self) -> params.Depends:
        """A FastAPI dependency that admits only the admin token."""

        async def dependency(
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
        ) -> None:
            self.check(credentials, mutation=True)

        return params.Depends(dependency)

    def for_reads(self) -> params.Depends:
        """A FastAPI dependency that admits everyone unless reads are protected too."""

        async def dependency(
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
        ) -> None:
            self.check(credentials, mutation=False)

        return params.Depends(dependency)
