"""`keyshard worker`'s flags: what the coordinated consumer it runs is given (its group,
Kafka, the coordinator, its budget, retries and dead letters, TLS), each a flag and its
KEYSHARD_* variable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keyshard.cli.flag_values import host_port, positive_int, positive_ms, positive_number, servers
from keyshard.cli.secret_flags import add_token_file_flag
from keyshard.core.kafka.fetch_sizes import DEFAULT_MAX_BUFFER_BYTES


def add_worker_command(command: Any, add: Callable[..., None], coordinator: str) -> None:
    """`keyshard worker module:function`: a handler run as a coordinated consumer
    (keyshard.cli.worker). `add` is the parser's flag adder (keyshard.cli.parser._add:
    it reads the KEYSHARD_* variable); `coordinator` the default coordinator address."""
    w = command(
        "worker",
        help="run module:function (async or sync) as a coordinated consumer",
        description="Run a handler function as a coordinated consumer until SIGTERM/SIGINT "
        "(the first closes gracefully, a second aborts). Log lines go to stdout; a fatal "
        "refusal is one line on stderr and a non-zero exit.",
    )
    w.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="the handler, called once per record (an aiokafka ConsumerRecord)",
    )
    add(w, "--group", default=None, help="consumer group (required)")
    add(w, "--topics", default=None, help="comma-separated topics (or --topic-pattern)")
    add(w, "--topic-pattern", default=None,
         help="instead of --topics: every topic whose whole name matches this regex")  # fmt: skip
    add(
        w,
        "--coordinator",
        type=servers,
        default=coordinator,
        help="coordinator HOST:PORT[,HOST:PORT...] (every replica, or a headless Service)",
    )
    add(
        w,
        "--bootstrap-servers",
        type=servers,
        default=None,
        help="Kafka HOST:PORT[,...] (or bootstrap.servers in --kafka-config)",
    )
    add(
        w,
        "--kafka-config",
        default=None,
        help="Kafka client settings, .properties; KEYSHARD_KAFKA_<NAME> variables win",
    )
    add(w, "--name", default=None, help="consumer name (default: the host name)")
    add(w, "--max-concurrency", type=positive_int, default=64, help="keys in flight at once")
    add(
        w,
        "--max-buffer-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BUFFER_BYTES,
        help="memory budget: record bytes held at most (fetched, in flight, replay windows); "
        "fetching pauses while it is used up. Size the pod's memory request to about this "
        "plus 100 MiB (at least 65536)",
    )
    add(
        w,
        "--session-timeout-ms",
        type=positive_ms,
        default=10_000,
        help="silent this long, the coordinator moves this worker's ranges",
    )
    add(
        w,
        "--fetch-failure-timeout-ms",
        type=positive_ms,
        default=None,
        help="reading nothing from Kafka this long, the worker hands its ranges back until "
        "Kafka answers again (default: the session timeout)",
    )
    add(
        w,
        "--drain-timeout-ms",
        type=positive_ms,
        default=30_000,
        help="on SIGTERM, how long in-flight records may take to finish",
    )
    add(w, "--capacity", type=positive_int, default=1, help="share of the group's load")
    add(
        w,
        "--auth-token",
        default=None,
        help="credentials for the coordinator: its --auth-token, a per-principal token or a JWT",
    )
    add_token_file_flag(w, add)
    add(
        w,
        "--dead-letter-topic",
        default=None,
        help="after --retry-max-attempts failures a record goes here (none: retry forever)",
    )
    add(
        w,
        "--retry-max-attempts",
        type=positive_int,
        default=5,
        help="attempts before dead-lettering",
    )
    add(
        w,
        "--retry-initial-backoff-ms",
        type=positive_ms,
        default=100,
        help="first retry backoff, doubling",
    )
    add(w, "--retry-max-backoff-ms", type=positive_ms, default=10_000, help="longest retry backoff")
    add(
        w,
        "--connect-timeout-ms",
        type=positive_ms,
        default=None,
        help="exit when the coordinator or Kafka stays unreachable this long (default: "
        "retry forever, warning at once and then every 30 s)",
    )
    add(
        w,
        "--connect-timeout-s",
        type=positive_number,
        default=None,
        help="deprecated: --connect-timeout-ms in seconds, taken for one release (a warning)",
    )
    add(
        w,
        "--metrics-listen",
        type=host_port,
        default=None,
        help="HOST:PORT serving /healthz, /readyz and /metrics (default: none)",
    )
    add(
        w,
        "--log-format",
        choices=("plain", "json"),
        default="plain",
        help="plain lines or one JSON object per line",
    )
    add(
        w,
        "--coordinator-tls-ca-file",
        default=None,
        help="the coordinator's channel runs TLS: the CA that signed its certificate",
    )
    add(w, "--coordinator-tls-cert-file", default=None, help="mutual TLS: this worker's cert")
    add(w, "--coordinator-tls-key-file", default=None, help="...and its private key")
