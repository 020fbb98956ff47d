"""Daemon lifecycle: start-up -> serve -> graceful shutdown (shaped like uvicorn's Server).

The admin API runs under uvicorn inside this same event loop, so it reads live state.
This is the one module that wires `api` in: nothing else imports it, so the admin app can
change without touching the coordinator, and the coordinator never depends on FastAPI.
Layer: above `coordinator.server`; imported by `coordinator.cli` and `coordinator.local`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import uvicorn

from api.app import create_app
from coordinator.group.state import GroupConfig
from coordinator.kafka.settings import KafkaSettings
from coordinator.protocol.codec import DEFAULT_MAX_FRAME_BYTES
from coordinator.runtime.runtime import CoordinatorRuntime
from coordinator.runtime.settings import DEFAULT_STARTUP_GRACE_MS, RuntimeSettings
from coordinator.security.tls import ServerTls
from coordinator.server.admission import connection_limits, count_accept_errors
from coordinator.server.listener import CoordinatorServer
from coordinator.storage.base import DEFAULT_STATE_TOPIC
from coordinator.storage.kafka_store import KafkaStateStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    bootstrap_servers: str
    listen_host: str  # the defaults are the CLI's (coordinator.cli.parser)
    listen_port: int
    admin_host: str
    admin_port: int
    state_topic: str = DEFAULT_STATE_TOPIC
    auth_token: str | None = None
    admin_token: str | None = None  # bearer token for admin mutations (and reads if below)
    admin_auth_reads: bool = False
    group_defaults: GroupConfig = field(default_factory=GroupConfig)
    startup_grace_ms: int = DEFAULT_STARTUP_GRACE_MS
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    group_assignors: Mapping[str, str] = field(default_factory=dict)
    kafka: KafkaSettings = field(default_factory=KafkaSettings.parse)
    # keyshard's own endpoints (issue 13): TLS, and what one connection may cost. The
    # None limits take coordinator.server.admission's defaults.
    tls: ServerTls | None = None  # the consumer channel
    admin_tls: ServerTls | None = None  # the admin API: HTTPS
    register_timeout_ms: int | None = None
    max_connections: int | None = None  # None: 10,000, or what the open-file limit allows
    max_connections_per_peer: int | None = None


class _InLoopUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningDaemon:
    config: DaemonConfig
    bootstrap_servers: str
    runtime: CoordinatorRuntime
    server: CoordinatorServer
    admin: _InLoopUvicorn
    admin_task: asyncio.Task[None]
    restore_exception_handler: Callable[[], None] = lambda: None

    async def stop(self) -> None:
        """In dependency order: no new connections or admin requests, then the runtime
        (its last position write and offset commits land), then the admin server."""
        self.admin.should_exit = True
        await self.server.stop()
        await self.runtime.stop()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(self.admin_task, 5)
        self.restore_exception_handler()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(
            err.errno, f"admin API cannot listen on {host}:{port}: {err.strerror}"
        ) from err
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def start_daemon(config: DaemonConfig) -> RunningDaemon:
    # Before anything starts: a bad certificate file is a TlsConfigError naming its flag.
    channel_tls = config.tls.context() if config.tls is not None else None
    admin_tls = config.admin_tls.context() if config.admin_tls is not None else None
    limits = connection_limits(
        config.register_timeout_ms, config.max_connections, config.max_connections_per_peer
    )
    bootstrap = config.bootstrap_servers
    store = KafkaStateStore(bootstrap, config.state_topic, settings=config.kafka)
    settings = RuntimeSettings(
        bootstrap_servers=bootstrap,
        advertised_address=f"{config.listen_host}:{config.listen_port}",
        state_topic=config.state_topic,
        auth_token=config.auth_token,
        group_defaults=config.group_defaults,
        startup_grace_ms=config.startup_grace_ms,
        group_assignors=dict(config.group_assignors),
    )
    runtime = CoordinatorRuntime(settings, store, metadata=store)
    try:
        await runtime.start()
    except BaseException:
        await store.stop()
        raise
    server = CoordinatorServer(
        runtime, config.listen_host, config.listen_port, config.max_frame_bytes,
        tls=channel_tls, limits=limits,
    )  # fmt: skip
    try:
        await server.start()
        # Bind the admin socket ourselves: a busy port is then an OSError here, not a
        # sys.exit() inside uvicorn's task that would tear the whole loop down.
        admin_socket = _bind(config.admin_host, config.admin_port)
    except BaseException:
        await server.stop()
        await runtime.stop()
        raise
    app = create_app(runtime, admin_token=config.admin_token, auth_reads=config.admin_auth_reads)
    admin_config = uvicorn.Config(app, log_level="warning", lifespan="off", backlog=128)
    admin_config.load()
    admin_config.ssl = admin_tls  # ours, not uvicorn's: its errors name our flags
    admin = _InLoopUvicorn(admin_config)
    restore = count_accept_errors(asyncio.get_running_loop())
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_socket]), name="admin-api")
    # uvicorn exposes readiness only as a flag, so poll it (bounded by the task ending).
    while not admin.started and not admin_task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return RunningDaemon(config, bootstrap, runtime, server, admin, admin_task, restore)


async def run_daemon(config: DaemonConfig, announce: Callable[[str], None] = print) -> None:
    daemon = await start_daemon(config)
    tls = "" if config.tls is None else " (TLS)"
    admin = "https" if config.admin_tls is not None else "http"
    announce(
        f"keyshard coordinator listening on {config.listen_host}:{daemon.server.port}{tls}, "
        f"admin {admin}://{config.admin_host}:{config.admin_port}, "
        f"kafka {daemon.bootstrap_servers}"
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await daemon.stop()
