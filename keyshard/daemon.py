"""Daemon lifecycle: start-up -> serve -> graceful shutdown (shaped like uvicorn's Server).

The admin API runs under uvicorn inside this same event loop, so it reads live state.
The admin app is wired in here rather than in the coordinator, so the coordinator never
depends on FastAPI and the admin app can change without touching it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from keyshard.api.auth import AdminAuth
from keyshard.coordinator.group.bounds import Bounds
from keyshard.coordinator.group.growth import DEFAULT_GROWTH_WINDOW_MS
from keyshard.coordinator.group.state import GroupConfig, OffsetReset
from keyshard.coordinator.replication.liveness import DEFAULT_LEADER_FAILOVER_MS
from keyshard.coordinator.replication.manager import ReplicaManager, ReplicationSettings
from keyshard.coordinator.replication.placement import DEFAULT_REPLICA_TIMEOUT_MS
from keyshard.coordinator.runtime.activity import Activity
from keyshard.coordinator.runtime.authorization import DEFAULT_ACL_CACHE_MS, authorizer_for
from keyshard.coordinator.runtime.config import RuntimeConfig
from keyshard.coordinator.runtime.runtime import CoordinatorRuntime
from keyshard.coordinator.server.admission import connection_limits, count_accept_errors
from keyshard.coordinator.server.authentication import Authentication
from keyshard.coordinator.server.listener import CoordinatorServer
from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, DEFAULT_STATE_TOPIC
from keyshard.coordinator.storage.kafka_cluster import KafkaCluster
from keyshard.coordinator.storage.kafka_log import KafkaStateLog, ReplicaIdentity
from keyshard.coordinator.storage.signing import ReplicaSecret
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.protocol.codec import DEFAULT_MAX_FRAME_BYTES, PRE_AUTH_MAX_FRAME_BYTES
from keyshard.core.security.tls import ServerTls

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

log = logging.getLogger(__name__)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # listening on every address of the host


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    bootstrap_servers: str
    listen_host: str  # the defaults are the CLI's (keyshard.cli.parser)
    listen_port: int
    admin_host: str
    admin_port: int
    state_topic: str = DEFAULT_STATE_TOPIC
    # Who each consumer connection is (coordinator.server.authentication).
    authentication: Authentication = field(default_factory=Authentication)
    # Who may join which group (coordinator.runtime.authorization): none, kafka, acl-file.
    authorizer: str = "none"
    acl_file: str | None = None
    acl_cache_ms: int = DEFAULT_ACL_CACHE_MS
    # Bearer token for admin mutations (and reads if below); a secret, kept out of repr().
    admin_token: str | None = field(default=None, repr=False)
    admin_auth_reads: bool = False
    # Admin principals and roles (keyshard.api.auth); None: from the two settings above.
    admin_auth: AdminAuth | None = None
    group_defaults: GroupConfig = field(default_factory=GroupConfig)
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    group_assignors: Mapping[str, str] = field(default_factory=dict)
    group_offset_resets: Mapping[str, OffsetReset] = field(default_factory=dict)
    kafka: KafkaSettings = field(default_factory=KafkaSettings.parse)
    # keyshard's own endpoints: TLS, and what one connection may cost. The None limits
    # take coordinator.server.admission's defaults.
    tls: ServerTls | None = None  # the consumer channel
    admin_tls: ServerTls | None = None  # the admin API: HTTPS
    register_timeout_ms: int | None = None
    max_connections: int | None = None  # None: 10,000, or what the open-file limit allows
    max_connections_per_peer: int | None = None
    pre_auth_max_frame_bytes: int = PRE_AUTH_MAX_FRAME_BYTES  # until a Register succeeds
    # What one member may declare and report, and how many (coordinator.group.bounds).
    bounds: Bounds = field(default_factory=Bounds)
    # Replicas (docs/protocol.md §7): this one's name (None: `default_replica_id`) and
    # where consumers reach it, the state topic's partitions (used when creating it), and
    # how long a replica's beats may be silent before its partitions are taken over.
    replica_id: str | None = None
    advertise: str | None = None  # host:port; None: the listen address (see advertised())
    state_partitions: int = DEFAULT_STATE_PARTITIONS
    replica_timeout_ms: int = DEFAULT_REPLICA_TIMEOUT_MS
    # Signs this replica's beats and epoch markers and verifies the others'
    # (coordinator.storage.signing); None: nothing is signed, nothing verified.
    replica_secret: ReplicaSecret | None = None
    # How long a replica keeps serving while Kafka moves the leader of the partition its
    # beats go to (coordinator.replication.liveness), before it lets go as if cut off.
    leader_failover_ms: int = DEFAULT_LEADER_FAILOVER_MS
    # Kafka is the embedded broker (keyshard.local.broker) this process started: its data
    # is in memory, and it takes no transactional producers (not asked, then: it answers
    # with ERROR lines).
    embedded_broker: bool = False
    # How often each group's topics are read from the cluster, and how long after a topic
    # grew producers may still write by its old partition count (coordinator.group.growth).
    metadata_refresh_ms: int = 5_000
    partition_growth_window_ms: int = DEFAULT_GROWTH_WINDOW_MS
    # How often changed positions are written (the state topic's steady write rate).
    flush_interval_ms: int = 200

    def advertised(self, port: int) -> str:
        """Where consumers reach this replica: --advertise, else the listen address
        (a wildcard listen address advertises this host's name: a pod's IP in Kubernetes)."""
        if self.advertise:
            return self.advertise
        host = self.listen_host
        if host in WILDCARD_HOSTS:
            host = socket.gethostbyname(socket.gethostname())
        return f"{host}:{port}"


def admin_url(advertised: str, admin_port: int, *, https: bool) -> str:
    """Where the other replicas forward admin requests: the advertised host on the admin
    port. An IPv6 host needs brackets in a URL, which `host:port` may lack."""
    host = advertised.rpartition(":")[0]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{'https' if https else 'http'}://{host}:{admin_port}"


def default_replica_id(listen_host: str, listen_port: int) -> str:
    """A bare deployment's replica name: this host's name and the address it listens on
    (`host:port`, or `host:listen-host:port` when it listens on one address, not all).

    It stays the same when the coordinator is restarted in place, so the new process is
    the replica the old one was and takes its state partitions back at once
    (`ReplicaManager.desired_owners`), while its consumers' leases still hold. No two
    live processes share it: one host has one process listening on an address, and the
    daemon binds it before it claims anything. Listening on port 0 (any free port) has
    no stable address: the name then gets a random suffix, a new replica per process.
    """
    host = socket.gethostname()
    if listen_port == 0:
        return f"{host}-{uuid.uuid4().hex[:6]}"
    if listen_host in WILDCARD_HOSTS:
        return f"{host}:{listen_port}"
    where = f"[{listen_host}]" if ":" in listen_host else listen_host
    return f"{host}:{where}:{listen_port}"


@dataclass(frozen=True, slots=True)
class _WebSide:
    create_app: Callable[..., FastAPI]
    server: type[uvicorn.Server]
    config: type[uvicorn.Config]


def _import_web_side() -> _WebSide:
    """The admin API's modules: FastAPI and uvicorn take about a second to import, which
    a thread spends while the daemon waits for Kafka, instead of the daemon before it
    starts (a coordinator restarted in place must take its state back fast)."""
    import uvicorn

    from keyshard.api.app import create_app

    class InLoopUvicorn(uvicorn.Server):
        """uvicorn without its own signal handling: the daemon owns SIGINT/SIGTERM."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return _WebSide(create_app, InLoopUvicorn, uvicorn.Config)


@dataclass
class RunningDaemon:
    config: DaemonConfig
    bootstrap_servers: str
    runtime: CoordinatorRuntime
    server: CoordinatorServer
    app: FastAPI
    admin: uvicorn.Server
    admin_task: asyncio.Task[None]
    replicas: ReplicaManager
    state_log: KafkaStateLog
    cluster: KafkaCluster
    restore_exception_handler: Callable[[], None] = lambda: None

    async def stop(self) -> None:
        """In dependency order: hand the partitions over (each group stored, its members
        told to find the new owner), no new connections or admin requests, the runtime
        (its last writes and offset commits land), the Kafka clients, the admin server."""
        self.admin.should_exit = True
        await self.replicas.stop()
        await self.app.state.forwarder.aclose()
        await self.server.stop()
        await self.runtime.stop()
        await self.state_log.stop()
        await self.cluster.stop()
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


def _count_commit(activity: Activity, writes: int) -> None:
    """A state transaction committed with `writes` groups' writes in it (group commit)."""
    activity.count("state transactions")
    activity.count("state writes", writes)


async def start_daemon(config: DaemonConfig) -> RunningDaemon:
    # Before anything starts: a bad certificate file is a TlsConfigError naming its flag.
    channel_tls = config.tls.context() if config.tls is not None else None
    admin_tls = config.admin_tls.context() if config.admin_tls is not None else None
    limits = connection_limits(
        config.register_timeout_ms, config.max_connections, config.max_connections_per_peer,
        config.pre_auth_max_frame_bytes,
    )  # fmt: skip
    bootstrap = config.bootstrap_servers
    # Bind both sockets first: the advertised address needs the real port, and a busy
    # port is an OSError here, not a sys.exit() inside uvicorn's task that would tear the
    # whole loop down.
    admin_socket = _bind(config.admin_host, config.admin_port)
    web_side = asyncio.ensure_future(asyncio.to_thread(_import_web_side))
    server: CoordinatorServer | None = None
    runtime: CoordinatorRuntime | None = None
    cluster = KafkaCluster(bootstrap, config.kafka)
    state_log: KafkaStateLog | None = None
    try:
        advertised = config.advertised(config.listen_port)
        replica_id = config.replica_id or default_replica_id(config.listen_host, config.listen_port)
        identity = ReplicaIdentity(
            replica_id,
            advertised,
            admin_url(advertised, admin_socket.getsockname()[1], https=admin_tls is not None),
        )
        state_log = KafkaStateLog(
            bootstrap, config.state_topic, settings=config.kafka, identity=identity,
            partitions=config.state_partitions,
            transactions=False if config.embedded_broker else None,
            secret=config.replica_secret,
        )  # fmt: skip
        await cluster.start()
        await state_log.start()
        runtime_config = RuntimeConfig(
            bootstrap_servers=bootstrap,
            advertised_address=advertised,
            state_topic=config.state_topic,
            group_defaults=config.group_defaults,
            group_assignors=dict(config.group_assignors),
            group_offset_resets=dict(config.group_offset_resets),
            coordinator_id=replica_id,
            bounds=config.bounds,
            metadata_refresh_ms=config.metadata_refresh_ms,
            flush_interval_ms=config.flush_interval_ms,
            partition_growth_window_ms=config.partition_growth_window_ms,
        )
        authorizer = authorizer_for(
            config.authorizer, acl_file=config.acl_file, cache_ms=config.acl_cache_ms,
            describe=cluster.describe_acls,
        )  # fmt: skip
        runtime = CoordinatorRuntime(
            runtime_config, state_log, metadata=cluster, partitions=state_log.partitions,
            authorizer=authorizer,
        )  # fmt: skip
        await runtime.start()
        state_log.commits.committed = partial(_count_commit, runtime.activity)
        replicas = ReplicaManager(
            state_log, runtime, bootstrap=bootstrap, kafka=config.kafka,
            settings=ReplicationSettings(
                group_id=f"keyshard-coordinators.{config.state_topic}",
                replica_timeout_s=config.replica_timeout_ms / 1000,
                leader_failover_s=config.leader_failover_ms / 1000,
            ),
        )  # fmt: skip
        runtime.not_ready = replicas.not_ready_reason
        web = await web_side
        app = web.create_app(
            runtime, replicas=replicas, admin_token=config.admin_token,
            auth_reads=config.admin_auth_reads,
            peer_verify=config.admin_tls.peer_context() if config.admin_tls is not None else True,
            auth=config.admin_auth,
        )  # fmt: skip
        server = CoordinatorServer(
            runtime, config.listen_host, config.listen_port, config.max_frame_bytes,
            tls=channel_tls, limits=limits, replicas=replicas,
            authentication=config.authentication,
        )  # fmt: skip
        await server.start()
        await replicas.start()
        log.info("%s", limits.describe())
        log.info("%s; %s", config.authentication.describe(), authorizer.describe())
    except BaseException:
        web_side.cancel()  # (the thread finishes its imports; nobody waits for them)
        admin_socket.close()
        if server is not None:
            await server.stop()
        if runtime is not None:
            await runtime.stop()
        if state_log is not None:
            await state_log.stop()
        await cluster.stop()
        raise
    admin_config = web.config(app, log_level="warning", lifespan="off", backlog=128)
    admin_config.load()
    admin_config.ssl = admin_tls  # ours, not uvicorn's: its errors name our flags
    admin = web.server(admin_config)
    restore = count_accept_errors(asyncio.get_running_loop())
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_socket]), name="admin-api")
    # uvicorn exposes readiness only as a flag, so poll it (bounded by the task ending).
    while not admin.started and not admin_task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return RunningDaemon(
        config, bootstrap, runtime, server, app, admin, admin_task, replicas, state_log, cluster,
        restore,
    )  # fmt: skip


async def run_daemon(config: DaemonConfig, announce: Callable[[str], None] = print) -> None:
    daemon = await start_daemon(config)
    tls = "" if config.tls is None else " (TLS)"
    admin = "https" if config.admin_tls is not None else "http"
    embedded = " (embedded broker: data in memory, lost on exit)" if config.embedded_broker else ""
    announce(
        f"keyshard coordinator listening on {config.listen_host}:{daemon.server.port}{tls}, "
        f"admin {admin}://{config.admin_host}:{config.admin_port}, "
        f"kafka {daemon.bootstrap_servers}{embedded}"
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
