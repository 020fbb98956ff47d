"""Any replica answers for every group: requests about a group served elsewhere are
forwarded to the replica that owns its state partition. Every answer about a group names
the replica that served it in `X-Keyshard-Served-By`.

Forwarded once at most (a replica receiving a forwarded request for a group it does not
serve says the group is moving, instead of passing it on: two replicas with different
views of the placement must not bounce a request between them). The owner checks the
token itself; the answer comes back as the owner gave it, with `X-Keyshard-Served-By`.

Forwarded only to an admin URL this replica has verified: one named in a beat signed with
the replica secret (`coordinator.storage.signing`). A request carries the caller's token,
and the answer goes back to the caller as it came: an URL anyone who can write to the
state topic could have named gets neither. Where it cannot verify the owner (no replica
secret), the answer is 421 naming the replica that serves the group and its admin URL,
to be asked directly.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from keyshard.api.models import ErrorView
from keyshard.coordinator.runtime.location import Location, Replicas
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.core.security.log_safety import printable

FORWARDED_BY = "x-keyshard-forwarded-by"
SERVED_BY = "x-keyshard-served-by"
PASSED_ON = ("authorization", "content-type", "accept")
GROUP_PATH = re.compile(r"^/v1/groups/([^/]+)(?:/|$)")
FORWARD_TIMEOUT_S = 5.0


def _unavailable(detail: str) -> JSONResponse:
    body = ErrorView(error="unavailable", detail=detail).model_dump()
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})


def _served_elsewhere(group: str, where: Location) -> JSONResponse:
    detail = (
        f"group {group!r} is served by replica {where.replica_id}, whose admin API is at "
        f"{where.admin_url} as it says; this replica cannot verify that (the replicas have "
        "no --replica-secret-file), so it forwards nothing there: ask it directly"
    )
    body = ErrorView(error="served_elsewhere", detail=printable(detail, len(detail))).model_dump()
    return JSONResponse(body, status_code=421, headers={SERVED_BY: where.replica_id or ""})


class Forwarder:
    def __init__(
        self, runtime: CoordinatorRuntime, replicas: Replicas, verify: ssl.SSLContext | bool
    ) -> None:
        self.runtime = runtime
        self.replicas = replicas
        self._verify = verify
        self._client: httpx.AsyncClient | None = None

    @property
    def me(self) -> str:
        return self.runtime.config.coordinator_id

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=FORWARD_TIMEOUT_S, verify=self._verify)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """HTTP middleware: serve locally when this replica serves the group (or the
        path names none), else forward."""
        match = GROUP_PATH.match(request.scope["path"])
        if match is None:
            return await call_next(request)
        group = match.group(1)
        if self.runtime.owner_of(group) is not None:
            response = await call_next(request)
            response.headers[SERVED_BY] = self.me
            return response
        where = self.replicas.locate(group)
        if not where.active or where.local or where.replica_id is None or not where.admin_url:
            return _unavailable(
                f"group {group!r}: its state partition is being taken over; retry shortly"
            )
        if not where.verified:
            return _served_elsewhere(group, where)
        if request.headers.get(FORWARDED_BY):
            return _unavailable(
                f"group {group!r} is moving between replicas (forwarded here by "
                f"{request.headers[FORWARDED_BY]}, which thinks {self.me} serves it); retry"
            )
        return await self._forward(request, where)

    async def _forward(self, request: Request, where: Location) -> Response:
        assert where.admin_url is not None
        raw_path = request.scope.get("raw_path") or request.scope["path"].encode()
        url = where.admin_url + raw_path.decode("ascii", "replace")
        if request.url.query:
            url += "?" + request.url.query
        headers = {k: v for k, v in request.headers.items() if k in PASSED_ON}
        headers[FORWARDED_BY] = self.me
        try:
            answer = await self.client().request(
                request.method, url, headers=headers, content=await request.body()
            )
        except httpx.HTTPError as err:
            return JSONResponse(
                ErrorView(
                    error="bad_gateway",
                    detail=f"replica {where.replica_id} serves this group but did not answer "
                    f"at {where.admin_url}: {type(err).__name__}",
                ).model_dump(),
                status_code=502,
            )
        return Response(
            answer.content,
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            headers={SERVED_BY: where.replica_id or ""},
        )

    async def peer_answers(
        self, path: str, authorization: str | None
    ) -> tuple[list[tuple[str, Any]], list[str]]:
        """GET `path` of every other live replica: (replica, JSON) of those that answered
        200, and the ids of those that did not."""
        headers = {"authorization": authorization} if authorization else {}
        headers[FORWARDED_BY] = self.me
        peers = sorted(self.replicas.peers().items())

        async def ask(url: str) -> Any:
            answer = await self.client().get(url + path, headers=headers)
            answer.raise_for_status()
            return answer.json()

        results = await asyncio.gather(*(ask(url) for _, url in peers), return_exceptions=True)
        answered = [
            (rid, r) for (rid, _), r in zip(peers, results, strict=True)
            if not isinstance(r, BaseException)
        ]  # fmt: skip
        failed = [
            rid for (rid, _), r in zip(peers, results, strict=True) if isinstance(r, BaseException)
        ]
        return answered, failed
