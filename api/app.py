"""The admin HTTP API: `create_app(runtime)`, served by uvicorn in the daemon's own loop,
so every view reads the live group state without copies or locks."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException

from api.models import GroupView, group_view
from coordinator.runtime import CoordinatorRuntime


def create_app(runtime: CoordinatorRuntime) -> FastAPI:
    app = FastAPI(
        title="keyshard admin API",
        description="Inspect and steer keyshard consumer groups.",
        version="0.1.0",
    )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process and its event loop answer."""
        return {"status": "ok"}

    @app.get("/v1/groups/{group}", response_model=GroupView)
    async def get_group(group: str) -> GroupView:
        """Members with epochs and ranges, positions per partition, handoffs in progress."""
        state = runtime.groups.get(group)
        if state is None:
            raise HTTPException(status_code=404, detail=f"unknown group {group!r}")
        return group_view(state, runtime.clock())

    return app
