"""The admin HTTP API: `create_app(runtime)`, served by uvicorn in the daemon's own loop,
so every view reads the live group state without copies or locks.

Reads are cheap views of `runtime.group_states()`; mutations go through
`coordinator.runtime.operations`, which feeds them to the runtime's single apply path, so
an operator cannot do anything a consumer's request could not (no ownership change
bypasses the handoff rules).
"""

from __future__ import annotations

import ssl
from importlib import resources
from typing import Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from keyshard.api.auth import AdminAuth, AdminAuthError
from keyshard.api.dependencies import caller_of, for_every_group, for_group, for_listing
from keyshard.api.forward import FORWARDED_BY, Forwarder
from keyshard.api.metrics import metrics_registry, render
from keyshard.api.models import (
    AuditView,
    ErrorView,
    FenceView,
    GroupConfigUpdate,
    GroupConfigView,
    GroupsView,
    GroupView,
    HandoffsView,
    HealthView,
    KeyPosition,
    KeyView,
    PositionsResetRequest,
    PositionsResetView,
    ReadyView,
    RebalanceView,
    ServedByView,
    audit_view,
    config_view,
    group_view,
    handoffs_view,
    positions_reset_view,
    summary_view,
)
from keyshard.api.rates import ProcessedRates
from keyshard.api.roles import Role
from keyshard.coordinator.runtime import operations
from keyshard.coordinator.runtime.location import Replicas, Standalone
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime

ERROR_NAMES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
}
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorView, "description": "missing bearer token"},
    403: {"model": ErrorView, "description": "wrong token, or mutations disabled"},
}
GROUP_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_ERRORS,
    404: {"model": ErrorView, "description": "unknown group (or member)"},
    421: {
        "model": ErrorView,
        "description": "served by a replica whose admin URL cannot be verified (no replica "
        "secret): ask it directly (X-Keyshard-Served-By names it)",
    },
}


QUERY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorView, "description": "a query parameter the operation does not take"},
}


def only_query(*names: str) -> Any:
    """Refuses a query parameter the operation does not take: `?scop=local` is a typo to
    name, not a request to answer as if it had not been given."""
    allowed = frozenset(names)

    def check(request: Request) -> None:
        unknown = sorted(set(request.query_params) - allowed)
        if unknown:
            raise StarletteHTTPException(400, f"unknown query parameter: {', '.join(unknown)}")

    return Depends(check)


def _error(status_code: int, error: str, detail: str, **headers: str) -> JSONResponse:
    body = ErrorView(error=error, detail=detail).model_dump()
    return JSONResponse(body, status_code=status_code, headers=headers or None)


def create_app(
    runtime: CoordinatorRuntime,
    *,
    replicas: Replicas | None = None,
    admin_token: str | None = None,
    auth_reads: bool = False,
    peer_verify: ssl.SSLContext | bool = True,
    auth: AdminAuth | None = None,
) -> FastAPI:
    """The admin app of one replica. `replicas` says where groups served elsewhere are
    (their requests are forwarded there); `peer_verify` is how the other replicas' HTTPS
    certificates are checked. `auth` (principals and roles) replaces `admin_token` and
    `auth_reads` when given."""
    forwarder = Forwarder(runtime, replicas or Standalone(runtime), peer_verify)
    # /docs (Swagger UI) and /redoc with their scripts served from this Python
    # environment (fastapi-offline ships them): they work where no CDN can be reached.
    app = FastAPIOffline(
        title="keyshard admin API",
        description="Inspect and steer keyshard consumer groups. Any replica answers for "
        "every group: requests about a group another replica serves are forwarded to it.",
        version="0.1.0",
    )
    app.state.forwarder = forwarder  # its client is closed by whoever serves the app
    app.middleware("http")(forwarder.dispatch)
    auth = auth or AdminAuth(admin_token, auth_reads)
    view = for_group(auth, Role.VIEWER, "view group {group!r}")
    registry = metrics_registry(runtime)
    rates = ProcessedRates()
    dashboard = (
        resources.files("keyshard.api").joinpath("dashboard.html").read_text(encoding="utf-8")
    )

    @app.exception_handler(AdminAuthError)
    async def auth_failed(request: Request, err: AdminAuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if err.status_code == 401 else {}
        return _error(err.status_code, err.error, err.detail, **headers)

    @app.exception_handler(LookupError)
    async def not_found(request: Request, err: LookupError) -> JSONResponse:
        return _error(404, "not_found", str(err.args[0] if err.args else err))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        """Every 4xx, including the router's own 404/405, in the one documented shape."""
        name = ERROR_NAMES.get(err.status_code, "error")
        return _error(err.status_code, name, str(err.detail), **(err.headers or {}))

    def state_of(group: str) -> Any:
        return operations.group_state(runtime, group)

    def served_by(group: str) -> ServedByView:
        partition, epoch = runtime.owner_of(group) or (-1, 0)
        return ServedByView(
            replica_id=forwarder.me, state_partition=partition, coordinator_epoch=epoch
        )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard_page() -> HTMLResponse:
        """The live dashboard: static HTML/JS that polls the JSON API (no build step)."""
        return HTMLResponse(dashboard)

    @app.get("/healthz", response_model=HealthView)
    async def healthz() -> HealthView:
        """Liveness: the process and its event loop answer. Never needs a token, so a
        probe can always tell a hung daemon from a locked one."""
        return HealthView(status="ok")

    @app.get(
        "/readyz",
        response_model=ReadyView,
        responses={503: {"model": ReadyView, "description": "not ready, with the reason"}},
    )
    async def readyz() -> Response:
        """Readiness: state loaded and Kafka reachable; otherwise 503 and why."""
        reason = await operations.not_ready_reason(runtime)
        view = ReadyView(ready=reason is None, reason=reason)
        return JSONResponse(view.model_dump(), status_code=200 if reason is None else 503)

    @app.get(
        "/metrics",
        response_model=None,
        dependencies=[for_every_group(auth, Role.VIEWER, "read the metrics of every group")],
        responses={
            200: {
                "description": "Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **AUTH_ERRORS,
        },
    )
    async def metrics() -> PlainTextResponse:
        """Prometheus text format, computed from the live state at scrape time."""
        return PlainTextResponse(render(registry), media_type="text/plain; version=0.0.4")

    @app.get(
        "/v1/groups",
        response_model=GroupsView,
        dependencies=[for_listing(auth), only_query("scope")],
        responses={**AUTH_ERRORS, **QUERY_ERRORS},
    )
    async def list_groups(
        request: Request,
        scope: Literal["all", "local"] = Query(
            default="all", description="every replica's groups, or this replica's only"
        ),
    ) -> GroupsView:
        """Every group, with a one-line summary each and the replica that serves it
        (asked of the other replicas unless scope=local). With protected reads, only the
        groups the caller has a role on."""
        groups, caller = runtime.group_states(), caller_of(request)
        summaries = [
            summary_view(groups[g], forwarder.me)
            for g in sorted(groups)
            if auth.may_view(caller, g)
        ]
        unreachable: list[str] = []
        unverified: list[str] = []
        if scope == "all" and not request.headers.get(FORWARDED_BY):
            answers, unreachable = await forwarder.peer_answers(
                "/v1/groups?scope=local", request.headers.get("authorization")
            )
            for _, answer in answers:
                summaries += GroupsView.model_validate(answer).groups
            unverified = forwarder.replicas.unverified_peers()
        return GroupsView(
            groups=sorted(summaries, key=lambda g: g.group),
            unreachable=unreachable,
            unverified=unverified,
        )

    @app.get(
        "/v1/groups/{group}",
        response_model=GroupView,
        dependencies=[view],
        responses=GROUP_ERRORS,
    )
    async def get_group(group: str) -> GroupView:
        """Members with epochs, ranges and processed rate; positions per partition;
        handoffs with the ranges still draining and the offset that blocks each."""
        state = state_of(group)
        now = runtime.clock()
        member_rates = {
            mid: rates.observe(group, mid, m.processed, now) for mid, m in state.members.items()
        }
        rates.forget_except(group, set(state.members))
        return group_view(state, now, served_by(group), member_rates)

    @app.put(
        "/v1/groups/{group}/config",
        response_model=GroupConfigView,
        dependencies=[for_group(auth, Role.OPERATOR, "change the config of group {group!r}")],
        responses={
            **GROUP_ERRORS,
            400: {"model": ErrorView, "description": "body is not JSON"},
        },
    )
    async def put_config(
        group: str,
        update: GroupConfigUpdate,
        http: Request,
    ) -> GroupConfigView:
        """Change a group's knobs at run time: assignor, drain timeout, lost-member margin,
        ping interval, stall timeout, rebalance threshold / hold / check interval, and
        where the group starts while it has no positions (auto_offset_reset). A new
        assignor takes effect at once (the target is recomputed)."""
        state_of(group)
        changes = update.model_dump(exclude_none=True)
        config = operations.update_config(runtime, group, **changes)
        operations.audit(runtime, group, str(caller_of(http)), "config", _described(changes))
        return config_view(config)

    @app.post(
        "/v1/groups/{group}/rebalance",
        response_model=RebalanceView,
        dependencies=[for_group(auth, Role.OPERATOR, "rebalance group {group!r}")],
        responses=GROUP_ERRORS,
    )
    async def post_rebalance(
        group: str,
        http: Request,
    ) -> RebalanceView:
        """Recompute the target assignment now; moved slots are handed off as usual."""
        outcome = operations.rebalance(runtime, group)
        detail = f"{outcome.moved_slots()} slot(s) moved"
        operations.audit(runtime, group, str(caller_of(http)), "rebalance", detail)
        return RebalanceView(
            group=group,
            moved_slots=outcome.moved_slots(),
            target={mid: r.to_pairs() for mid, r in sorted(outcome.target_after.items())},
        )

    @app.delete(
        "/v1/groups/{group}/members/{member}",
        response_model=FenceView,
        dependencies=[for_group(auth, Role.OPERATOR, "fence a member of group {group!r}")],
        responses=GROUP_ERRORS,
    )
    async def delete_member(
        group: str,
        member: str,
        http: Request,
    ) -> FenceView:
        """Fence a member: its channel is closed, and its ranges move once it must have
        stopped on its own (session timeout + margin), never earlier."""
        operations.fence(runtime, group, member)
        operations.audit(runtime, group, str(caller_of(http)), "fence", f"member {member}")
        return FenceView(group=group, member_id=member, fenced=True)

    @app.post(
        "/v1/groups/{group}/positions/reset",
        response_model=PositionsResetView,
        dependencies=[for_group(auth, Role.OPERATOR, "reset the positions of group {group!r}")],
        responses={
            **GROUP_ERRORS,
            400: {"model": ErrorView, "description": "body is not JSON"},
            404: {"model": ErrorView, "description": "unknown group, a topic or partition "
                  "the group does not read, or no committed Kafka offset to reset to"},
            409: {"model": ErrorView, "description": "members own slots of the reset, or may "
                  "come back for them: stop or fence them first (named)"},
        },
    )  # fmt: skip
    async def post_positions_reset(
        group: str,
        request: PositionsResetRequest,
        http: Request,
    ) -> PositionsResetView:
        """Reset the group's positions, as `kafka-consumer-groups --reset-offsets`: to the
        earliest or latest offset, an offset, a time's first offset, or the group's
        committed Kafka offsets; for every partition, a topic's or one, every slot or one
        range. A dry run unless `execute`: each slot range's next offset now and after.
        Refused while members own those slots (fence or stop them first); 404 for what
        is not there (a topic the group does not read, no committed offset)."""
        state_of(group)
        target = request.target()
        try:
            moves = await operations.reset_positions(
                runtime, group, target, topic=request.topic, partition=request.partition,
                slots=request.slot_range(), execute=request.execute,
            )  # fmt: skip
        except operations.ResetRefusedError as err:
            raise StarletteHTTPException(409, str(err)) from None
        if request.execute:
            scope = request.model_dump(include={"topic", "partition"}, exclude_none=True)
            detail = f"to {target}" + (f" ({_described(scope)})" if scope else "")
            operations.audit(runtime, group, str(caller_of(http)), "reset", detail)
        return positions_reset_view(group, target, moves, request.execute)

    @app.get(
        "/v1/groups/{group}/keys/{key:path}",
        response_model=KeyView,
        dependencies=[view, only_query("topic")],
        responses={**GROUP_ERRORS, **QUERY_ERRORS},
    )
    async def get_key(
        group: str,
        key: str,
        topic: str | None = Query(default=None, description="only this topic's partitions"),
    ) -> KeyView:
        """Which slot a key hashes to, who runs it, where it resumes, and whether its
        records are blocked (slot draining, unowned or quarantined)."""
        where = operations.locate_key(state_of(group), key.encode(), topic)
        return KeyView(
            group=group,
            key=key,
            slot=where.slot,
            owner=where.owner,
            draining=where.draining,
            starting=where.starting,
            quarantined=where.quarantined,
            blocked=where.blocked,
            positions=[
                KeyPosition(topic=t, partition=p, next_offset=o)
                for (t, p), o in where.positions.items()
            ],
        )

    @app.get(
        "/v1/groups/{group}/handoffs",
        response_model=HandoffsView,
        dependencies=[view],
        responses=GROUP_ERRORS,
    )
    async def get_handoffs(group: str) -> HandoffsView:
        """Recent handoffs (newest first) with their durations, and every range still
        draining with the offset that blocks it."""
        return handoffs_view(state_of(group), runtime.clock())

    @app.get(
        "/v1/groups/{group}/audit",
        response_model=AuditView,
        dependencies=[view],
        responses=GROUP_ERRORS,
    )
    async def get_audit(group: str) -> AuditView:
        """The latest state-changing admin calls on the group (newest first): who made
        each (its principal), what it changed, and when."""
        return audit_view(state_of(group))

    return app


def _described(fields: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(fields.items())) or "nothing"
