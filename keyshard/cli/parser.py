"""The `keyshard` command line's flags: every command, parsed without the server extra.

Every flag also reads an environment variable (`KEYSHARD_` + the flag name in upper case,
dashes as underscores), so a container can be configured the 12-factor way. Nothing here
imports what only `keyshard[server]` installs: `keyshard --help` works on a consumer-only
install, and each command checks for its extra when it runs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from keyshard.coordinator.group.state import GroupConfig
from keyshard.coordinator.replication.placement import DEFAULT_REPLICA_TIMEOUT_MS
from keyshard.coordinator.server.admission import (
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_REGISTER_TIMEOUT_MS,
)
from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, DEFAULT_STATE_TOPIC
from keyshard.coordinator.strategies.registry import known_assignors
from keyshard.core.model.addresses import LOOPBACK, parse_host_port

DEFAULT_LISTEN = (LOOPBACK, 7171)  # the consumer channel
DEFAULT_ADMIN_LISTEN = (LOOPBACK, 7172)  # the admin API
DEFAULT_ADMIN = "http://{}:{}".format(*DEFAULT_ADMIN_LISTEN)
GROUP_DEFAULTS = GroupConfig()
DESCRIPTION = """The `keyshard` command line.

Every flag also reads an environment variable (`KEYSHARD_` + the flag name in upper case,
dashes as underscores), so a container can be configured the 12-factor way.
"""


def _env(flag: str) -> str:
    return "KEYSHARD_" + flag.lstrip("-").replace("-", "_").upper()


def _add(parser: argparse.ArgumentParser, flag: str, **kwargs: object) -> None:
    """A flag whose default comes from its environment variable when set."""
    env = _env(flag)
    if env in os.environ:
        value = os.environ[env]
        convert = kwargs.get("type")
        if kwargs.get("action") == "append" and callable(convert):
            # A repeatable flag reads a comma-separated list from its variable.
            kwargs["default"] = [convert(v.strip()) for v in value.split(",") if v.strip()]
        else:
            kwargs["default"] = value
    help_text = str(kwargs.pop("help", ""))
    parser.add_argument(flag, help=f"{help_text} [env {env}]", **kwargs)  # type: ignore[arg-type]


def _host_port(value: str) -> tuple[str, int]:
    try:
        return parse_host_port(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT") from None


def _servers(value: str) -> str:
    """A comma-separated list of HOST:PORT, each checked like --listen."""
    for part in value.split(","):
        _host_port(part.strip())
    return value


def _assignor(value: str) -> str:
    if value not in known_assignors():
        known = ", ".join(known_assignors())
        raise argparse.ArgumentTypeError(f"unknown assignor {value!r} (known: {known})")
    return value


def _group_assignor(value: str) -> tuple[str, str]:
    group, sep, name = value.partition("=")
    if not sep or not group:
        raise argparse.ArgumentTypeError(f"{value!r} is not GROUP=ASSIGNOR")
    return group, _assignor(name)


def _ratio(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 1.0:
        raise argparse.ArgumentTypeError(f"{value!r} must be > 1.0")
    return number


def _positive_ms(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a whole number of milliseconds"
        ) from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be > 0")
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be > 0")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keyshard", description=DESCRIPTION)
    parser.add_argument("--log-level", default=os.environ.get("KEYSHARD_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    broker = sub.add_parser("broker", help="run an embedded Kafka-protocol broker (Tansu)")
    _add(broker, "--listen", type=_host_port, default=(LOOPBACK, 9092), help="HOST:PORT")
    _add(
        broker,
        "--storage-engine",
        default="memory://tansu/",
        help="memory://tansu/ or s3://bucket/",
    )

    coord = sub.add_parser("coordinator", help="run the coordinator daemon")
    _add(
        coord,
        "--bootstrap-servers",
        type=_servers,
        default=None,
        help="Kafka HOST:PORT[,HOST:PORT...]; none: embedded broker",
    )
    _add(
        coord,
        "--listen",
        type=_host_port,
        default=DEFAULT_LISTEN,
        help="consumer channel HOST:PORT",
    )
    _add(
        coord,
        "--admin-listen",
        type=_host_port,
        default=DEFAULT_ADMIN_LISTEN,
        help="admin API HOST:PORT",
    )
    _add(
        coord,
        "--kafka-config",
        default=None,
        help="Kafka client settings, Java .properties format (security.protocol, sasl.*, "
        "ssl.*, client.id, ...); KEYSHARD_KAFKA_<NAME> variables (sasl.password -> "
        "KEYSHARD_KAFKA_SASL_PASSWORD) win over the file",
    )
    _add(coord, "--state-topic", default=DEFAULT_STATE_TOPIC, help="internal topic for positions")
    _add(
        coord,
        "--state-partitions",
        type=_positive_int,
        default=DEFAULT_STATE_PARTITIONS,
        help="partitions of the state topic when this creates it: the most replicas that "
        "can share the groups",
    )
    _add(
        coord,
        "--replica-id",
        default=None,
        help="this replica's name among the coordinator replicas (default: host name and "
        "a random suffix)",
    )
    _add(
        coord,
        "--advertise",
        type=_host_port,
        default=None,
        help="HOST:PORT consumers reach this replica at (default: the listen address; "
        "0.0.0.0 advertises this host's address)",
    )
    _add(
        coord,
        "--replica-timeout-ms",
        type=_positive_ms,
        default=DEFAULT_REPLICA_TIMEOUT_MS,
        help="a replica silent this long has its groups taken over by the others",
    )
    _add(coord, "--auth-token", default=None, help="token consumers must present at Register")
    _add(
        coord,
        "--admin-token",
        default=None,
        help="bearer token the admin API requires for every change (none: changes refused)",
    )
    coord.add_argument(
        "--admin-auth-reads",
        action="store_true",
        default=os.environ.get("KEYSHARD_ADMIN_AUTH_READS", "").lower() in ("1", "true", "yes"),
        help="require the admin token for reads too (env: 1, true or yes) "
        "[env KEYSHARD_ADMIN_AUTH_READS]",
    )
    _add(
        coord,
        "--drain-timeout-ms",
        type=_positive_ms,
        default=GROUP_DEFAULTS.drain_timeout_ms,
        help="StopFetcher drain deadline",
    )
    _add(
        coord,
        "--lost-member-margin-ms",
        type=_positive_ms,
        default=GROUP_DEFAULTS.lost_member_margin_ms,
        help="extra wait past a lost member's session before its ranges move",
    )
    _add(
        coord,
        "--assignor",
        type=_assignor,
        default=GROUP_DEFAULTS.assignor,
        help="strategy of every group: load-aware, balanced, auto-split, consistent-hash, sticky",
    )
    _add(
        coord,
        "--group-assignor",
        type=_group_assignor,
        action="append",
        default=[],
        help="GROUP=ASSIGNOR: the strategy of one group (repeatable)",
    )
    _add(
        coord,
        "--rebalance-threshold",
        type=_ratio,
        default=GROUP_DEFAULTS.rebalance_threshold,
        help="load-aware: rebalance when a member carries this many times its fair share",
    )
    _add(
        coord,
        "--rebalance-hold-ms",
        type=_positive_ms,
        default=GROUP_DEFAULTS.rebalance_hold_ms,
        help="load-aware: ...continuously for this long",
    )
    _add(
        coord,
        "--backlog-hold-ms",
        type=_positive_ms,
        default=GROUP_DEFAULTS.backlog_hold_ms,
        help="load-aware: ...or this long when the imbalance is a backlog (records waiting)",
    )
    _add(
        coord,
        "--backlog-records",
        type=_positive_int,
        default=GROUP_DEFAULTS.backlog_records,
        help="load-aware: a backlog is this many records waiting on the busiest member "
        "beyond its fair share",
    )
    _add(
        coord,
        "--demand-horizon-ms",
        type=_positive_ms,
        default=GROUP_DEFAULTS.demand_horizon_ms,
        help="load-aware: demand = records waiting + this long of records at the measured rate",
    )
    _add(
        coord,
        "--balance-check-ms",
        type=_positive_ms,
        default=GROUP_DEFAULTS.balance_check_ms,
        help="load-aware: how often the imbalance is measured",
    )
    _add(coord, "--load-half-life-ms", type=_positive_ms, default=GROUP_DEFAULTS.load_half_life_ms,
         help="half-life of the measured per-slot load")  # fmt: skip
    add_endpoint_flags(coord)

    add_admin_commands(sub)
    add_worker_command(sub)

    demo = sub.add_parser("demo", help="embedded broker + coordinator + consumers + producer")
    demo.add_argument("--records", type=int, default=20_000)
    demo.add_argument("--keys", type=int, default=500)
    demo.add_argument("--consumers", type=int, default=3)
    demo.add_argument("--partitions", type=int, default=1)
    demo.add_argument("--rate", type=float, default=2000.0, help="records per second produced")
    demo.add_argument("--output", default="demo-output", help="folder for every component's logs")
    demo.add_argument(
        "--bootstrap-servers",
        type=_servers,
        default=None,
        help="run on this Kafka instead of an embedded broker (a fresh topic and state "
        "topic of its own, deleted afterwards)",
    )
    demo.add_argument("--kafka-config", default=None, help="Kafka client settings (.properties)")

    worker = sub.add_parser("demo-worker", help=argparse.SUPPRESS)
    worker.add_argument("--group", required=True)
    worker.add_argument("--topics", required=True)
    worker.add_argument("--coordinator", required=True)
    worker.add_argument("--bootstrap-servers", required=True)
    worker.add_argument("--kafka-config", default=None)
    worker.add_argument("--name", required=True)
    worker.add_argument("--out", required=True)
    worker.add_argument("--max-concurrency", type=int, default=64)
    worker.add_argument("--session-timeout-ms", type=int, default=6000)
    worker.add_argument("--handler-ms", type=float, default=2.0)
    # Records whose offset is a multiple of this finish without awaiting (0: none do), so
    # the consumer's inline path and its hand-over to a worker both run.
    worker.add_argument("--no-wait-every", type=int, default=0)
    worker.add_argument("--stuck-key", default=None)
    worker.add_argument("--fail-key", default=None)
    worker.add_argument("--dead-letter-topic", default=None)
    # SIGTERM as a crash (the library's signal handling off): bench/sigterm_handoff.py.
    worker.add_argument("--no-signals", action="store_true")
    return parser


def add_endpoint_flags(coord: argparse.ArgumentParser) -> None:
    """TLS on keyshard's own endpoints and the consumer channel's connection limits
    (coordinator.server.admission). Key passwords come only from the environment
    (KEYSHARD_TLS_KEY_PASSWORD, KEYSHARD_ADMIN_TLS_KEY_PASSWORD): a flag would show in `ps`."""
    _add(
        coord,
        "--tls-cert-file",
        default=None,
        help="consumer channel over TLS: PEM certificate (chain) of the coordinator",
    )
    _add(
        coord,
        "--tls-key-file",
        default=None,
        help="its private key (default: in --tls-cert-file); password in KEYSHARD_TLS_KEY_PASSWORD",
    )
    _add(
        coord,
        "--tls-client-ca-file",
        default=None,
        help="mutual TLS: consumers must present a certificate signed by this CA",
    )
    _add(
        coord,
        "--admin-tls-cert-file",
        default=None,
        help="admin API over HTTPS: PEM certificate (chain)",
    )
    _add(
        coord,
        "--admin-tls-key-file",
        default=None,
        help="its private key (default: in --admin-tls-cert-file); password in "
        "KEYSHARD_ADMIN_TLS_KEY_PASSWORD",
    )
    _add(
        coord,
        "--register-timeout-ms",
        type=_positive_ms,
        default=DEFAULT_REGISTER_TIMEOUT_MS,
        help="a consumer connection that has not sent Register this long after it was "
        "accepted (TLS handshake included) is closed",
    )
    _add(
        coord,
        "--max-connections",
        type=_positive_int,
        default=None,
        help="consumer connections at once (default: 10000, or fewer to fit the "
        "open-file limit); more are refused",
    )
    _add(
        coord,
        "--max-connections-per-peer",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
        help="consumer connections at once from one IP address",
    )


def add_worker_command(sub: Any) -> None:
    """`keyshard worker module:function`: a handler run as a coordinated consumer
    (keyshard.cli.worker). Flags read KEYSHARD_* variables like the daemon's."""
    w = sub.add_parser(
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
    _add(w, "--group", default=None, help="consumer group (required)")
    _add(w, "--topics", default=None, help="comma-separated topics (required)")
    _add(
        w,
        "--coordinator",
        type=_servers,
        default="{}:{}".format(*DEFAULT_LISTEN),
        help="coordinator HOST:PORT[,HOST:PORT...] (every replica, or a headless Service)",
    )
    _add(
        w,
        "--bootstrap-servers",
        type=_servers,
        default=None,
        help="Kafka HOST:PORT[,...] (or bootstrap.servers in --kafka-config)",
    )
    _add(
        w,
        "--kafka-config",
        default=None,
        help="Kafka client settings, .properties; KEYSHARD_KAFKA_<NAME> variables win",
    )
    _add(w, "--name", default=None, help="consumer name (default: the host name)")
    _add(w, "--max-concurrency", type=_positive_int, default=64, help="keys in flight at once")
    _add(
        w,
        "--session-timeout-ms",
        type=_positive_ms,
        default=10_000,
        help="silent this long, the coordinator moves this worker's ranges",
    )
    _add(
        w,
        "--drain-timeout-ms",
        type=_positive_ms,
        default=30_000,
        help="on SIGTERM, how long in-flight records may take to finish",
    )
    _add(w, "--capacity", type=_positive_int, default=1, help="share of the group's load")
    _add(w, "--auth-token", default=None, help="the coordinator's --auth-token")
    _add(
        w,
        "--dead-letter-topic",
        default=None,
        help="after --retry-max-attempts failures a record goes here (none: retry forever)",
    )
    _add(
        w,
        "--retry-max-attempts",
        type=_positive_int,
        default=5,
        help="attempts before dead-lettering",
    )
    _add(
        w,
        "--retry-initial-backoff-ms",
        type=_positive_ms,
        default=100,
        help="first retry backoff, doubling",
    )
    _add(
        w, "--retry-max-backoff-ms", type=_positive_ms, default=10_000, help="longest retry backoff"
    )
    _add(
        w,
        "--connect-timeout-s",
        type=float,
        default=None,
        help="exit when the coordinator or Kafka stays unreachable this long (default: "
        "retry forever, warning at once and then every 30 s)",
    )
    _add(
        w,
        "--metrics-listen",
        type=_host_port,
        default=None,
        help="HOST:PORT serving /healthz, /readyz and /metrics (default: none)",
    )
    _add(
        w,
        "--log-format",
        choices=("plain", "json"),
        default="plain",
        help="plain lines or one JSON object per line",
    )
    _add(
        w,
        "--coordinator-tls-ca-file",
        default=None,
        help="the coordinator's channel runs TLS: the CA that signed its certificate",
    )
    _add(w, "--coordinator-tls-cert-file", default=None, help="mutual TLS: this worker's cert")
    _add(w, "--coordinator-tls-key-file", default=None, help="...and its private key")


def add_admin_commands(sub: Any) -> None:
    """Register the admin subcommands on the top-level subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin",
        default=os.environ.get("KEYSHARD_ADMIN", DEFAULT_ADMIN),
        help=f"admin API URL [env KEYSHARD_ADMIN, default {DEFAULT_ADMIN}]",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("KEYSHARD_ADMIN_TOKEN"),
        help="admin bearer token [env KEYSHARD_ADMIN_TOKEN]",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON as is")
    sub.add_parser("groups", parents=[common], help="list groups")
    status = sub.add_parser("status", parents=[common], help="members, ranges, handoffs")
    status.add_argument("group")
    where = sub.add_parser("where", parents=[common], help="which member runs a key")
    where.add_argument("group")
    where.add_argument("key")
    where.add_argument("--topic", default=None, help="only this topic's partitions")
    rebalance = sub.add_parser("rebalance", parents=[common], help="recompute the target now")
    rebalance.add_argument("group")
    fence = sub.add_parser("fence", parents=[common], help="fence (remove) a member")
    fence.add_argument("group")
    fence.add_argument("member")


ADMIN_COMMANDS = {"groups", "status", "where", "rebalance", "fence"}
