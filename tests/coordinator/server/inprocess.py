"""An in-process coordinator (its runtime on an in-memory state log) behind a real listener."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from keyshard.coordinator.group.state import GroupConfig
from keyshard.coordinator.runtime.authorization import Authorizer
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.server.admission import ConnectionLimits
from keyshard.coordinator.server.authentication import Authentication
from keyshard.coordinator.server.listener import CoordinatorServer
from keyshard.local.processes import free_port
from tests.coordinator.runtime.memory import serving_runtime


@asynccontextmanager
async def running_coordinator(
    limits: ConnectionLimits | None = None,
    tls: ssl.SSLContext | None = None,
    auth_token: str | None = None,
    authentication: Authentication | None = None,
    authorizer: Authorizer | None = None,
) -> AsyncIterator[CoordinatorServer]:
    """A listening coordinator on a free loopback port; groups may use any topic (the
    in-memory cluster says every topic exists, with one partition)."""
    port = free_port()
    config = RuntimeConfig(
        "unused:1",
        advertised_address=f"127.0.0.1:{port}",
        group_defaults=GroupConfig(ping_interval_ms=100),
    )
    runtime = serving_runtime(config, authorizer=authorizer)
    await runtime.start()
    if authentication is None:
        authentication = Authentication(shared_token=auth_token)
    server = CoordinatorServer(
        runtime, "127.0.0.1", port, tls=tls, limits=limits, authentication=authentication
    )
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
        await runtime.stop()
