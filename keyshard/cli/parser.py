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

from keyshard.cli.access_flags import (
    add_admin_access_flags,
    add_authorization_flags,
    add_identity_flags,
)
from keyshard.cli.bound_flags import add_bound_flags
from keyshard.cli.flag_values import (
    LOG_LEVELS,
    assignor,
    env_variable,
    group_assignor,
    group_offset_reset,
    host_port,
    log_level,
    offset_reset,
    positive_int,
    positive_ms,
    positive_number,
    ratio,
    servers,
)
from keyshard.cli.secret_flags import add_coordinator_secret_flags
from keyshard.cli.worker_flags import add_worker_command
from keyshard.coordinator.group.growth import DEFAULT_GROWTH_WINDOW_MS
from keyshard.coordinator.group.state import GroupConfig
from keyshard.coordinator.replication.liveness import DEFAULT_LEADER_FAILOVER_MS
from keyshard.coordinator.replication.placement import DEFAULT_REPLICA_TIMEOUT_MS
from keyshard.coordinator.server.admission import (
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_REGISTER_TIMEOUT_MS,
)
from keyshard.coordinator.storage.base import DEFAULT_STATE_PARTITIONS, DEFAULT_STATE_TOPIC
from keyshard.core.model.addresses import LOOPBACK

DEFAULT_LISTEN = (LOOPBACK, 7171)  # the consumer channel
DEFAULT_ADMIN_LISTEN = (LOOPBACK, 7172)  # the admin API
DEFAULT_ADMIN = "http://{}:{}".format(*DEFAULT_ADMIN_LISTEN)
GROUP_DEFAULTS = GroupConfig()
DESCRIPTION = """The `keyshard` command line.

Every flag also reads an environment variable (`KEYSHARD_` + the flag name in upper case,
dashes as underscores), so a container can be configured the 12-factor way.
"""


class DefaultsShownFormatter(argparse.HelpFormatter):
    """`--help` says each flag's default where it has one, as the flag would take it
    (`127.0.0.1:7171`, not a tuple), and nothing where it has none: no "default: None"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or not _has_default(action.default):
            return text
        shown = _as_given(action.default).replace("%", "%%")  # help text is %-formatted
        return f"{text} (default: {shown})"


def _has_default(value: object) -> bool:
    return not (value is None or value is argparse.SUPPRESS or value is False or value in ([], ""))


def _as_given(value: object) -> str:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
        return "{}:{}".format(*value)  # a HOST:PORT default
    if isinstance(value, list):
        return ",".join(_as_given(v) for v in value)
    return str(value)


class _Parser(argparse.ArgumentParser):
    """Every parser of the command (subcommands included: argparse makes them of the
    top-level parser's class) shows defaults in its help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsShownFormatter)
        super().__init__(*args, **kwargs)


def _add(parser: argparse.ArgumentParser, flag: str, **kwargs: object) -> None:
    """A flag whose default comes from its environment variable when set."""
    env = env_variable(flag)
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


def log_level_flag() -> argparse.ArgumentParser:
    """`--log-level`, taken after the subcommand too (`keyshard coordinator --log-level
    DEBUG`): the subcommand's copy sets nothing when absent, so the one before the
    subcommand, or KEYSHARD_LOG_LEVEL, stays in force."""
    shared = argparse.ArgumentParser(add_help=False)
    default = os.environ.get("KEYSHARD_LOG_LEVEL", "INFO")
    shared.add_argument(
        "--log-level",
        type=log_level,
        default=argparse.SUPPRESS,
        help=f"{', '.join(LOG_LEVELS)} [env KEYSHARD_LOG_LEVEL] (default: {default})",
    )
    return shared


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="keyshard", description=DESCRIPTION)
    _add(parser, "--log-level", type=log_level, default="INFO", help=", ".join(LOG_LEVELS))
    sub = parser.add_subparsers(dest="command", required=True)
    logs = log_level_flag()

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parents = [logs, *kwargs.pop("parents", [])]
        return sub.add_parser(name, parents=parents, **kwargs)

    broker = command("broker", help="run an embedded Kafka-protocol broker (Tansu)")
    _add(broker, "--listen", type=host_port, default=(LOOPBACK, 9092), help="HOST:PORT")
    _add(
        broker,
        "--storage-engine",
        default="memory://tansu/",
        help="memory://tansu/ or s3://bucket/",
    )

    coord = command("coordinator", help="run the coordinator daemon")
    _add(
        coord,
        "--bootstrap-servers",
        type=servers,
        default=None,
        help="Kafka HOST:PORT[,HOST:PORT...]; none: an embedded broker (in memory)",
    )
    add_embedded_broker_flag(coord)
    _add(
        coord,
        "--listen",
        type=host_port,
        default=DEFAULT_LISTEN,
        help="consumer channel HOST:PORT",
    )
    _add(
        coord,
        "--admin-listen",
        type=host_port,
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
        type=positive_int,
        default=DEFAULT_STATE_PARTITIONS,
        help="partitions of the state topic when this creates it: the most replicas that "
        "can share the groups",
    )
    _add(
        coord,
        "--replica-id",
        default=None,
        help="this replica's name among the coordinator replicas (default: the host name "
        "and the listen address, the same across restarts in place; with port 0 a random "
        "suffix)",
    )
    _add(
        coord,
        "--advertise",
        type=host_port,
        default=None,
        help="HOST:PORT consumers reach this replica at (default: the listen address; "
        "0.0.0.0 advertises this host's address)",
    )
    _add(
        coord,
        "--replica-timeout-ms",
        type=positive_ms,
        default=DEFAULT_REPLICA_TIMEOUT_MS,
        help="a replica silent this long has its groups taken over by the others",
    )
    _add(
        coord,
        "--leader-failover-ms",
        type=positive_ms,
        default=DEFAULT_LEADER_FAILOVER_MS,
        help="how long a replica keeps serving while Kafka moves the leader of the state "
        "partition its beats go to, before it lets go as if cut off from Kafka",
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
        type=positive_ms,
        default=GROUP_DEFAULTS.drain_timeout_ms,
        help="StopFetcher drain deadline",
    )
    _add(
        coord,
        "--lost-member-margin-ms",
        type=positive_ms,
        default=GROUP_DEFAULTS.lost_member_margin_ms,
        help="extra wait past a lost member's session before its ranges move",
    )
    _add(
        coord,
        "--stall-timeout-ms",
        type=positive_ms,
        default=None,
        help="a member with records waiting in its slots whose positions stand still this "
        "long is fenced and its ranges move (default: 60000)",
    )
    _add(
        coord,
        "--assignor",
        type=assignor,
        default=GROUP_DEFAULTS.assignor,
        help="strategy of every group: load-aware, balanced, auto-split, consistent-hash, sticky",
    )
    _add(
        coord,
        "--group-assignor",
        type=group_assignor,
        action="append",
        default=[],
        help="GROUP=ASSIGNOR: the strategy of one group (repeatable)",
    )
    _add(
        coord,
        "--rebalance-threshold",
        type=ratio,
        default=GROUP_DEFAULTS.rebalance_threshold,
        help="load-aware: rebalance when a member carries this many times its fair share",
    )
    _add(
        coord,
        "--rebalance-hold-ms",
        type=positive_ms,
        default=GROUP_DEFAULTS.rebalance_hold_ms,
        help="load-aware: ...continuously for this long",
    )
    _add(
        coord,
        "--backlog-hold-ms",
        type=positive_ms,
        default=GROUP_DEFAULTS.backlog_hold_ms,
        help="load-aware: ...or this long when the imbalance is a backlog (records waiting)",
    )
    _add(
        coord,
        "--backlog-records",
        type=positive_int,
        default=GROUP_DEFAULTS.backlog_records,
        help="load-aware: a backlog is this many records waiting on the busiest member "
        "beyond its fair share",
    )
    _add(
        coord,
        "--demand-horizon-ms",
        type=positive_ms,
        default=GROUP_DEFAULTS.demand_horizon_ms,
        help="load-aware: demand = records waiting + this long of records at the measured rate",
    )
    _add(
        coord,
        "--balance-check-ms",
        type=positive_ms,
        default=GROUP_DEFAULTS.balance_check_ms,
        help="load-aware: how often the imbalance is measured",
    )
    _add(coord, "--load-half-life-ms", type=positive_ms, default=GROUP_DEFAULTS.load_half_life_ms,
         help="half-life of the measured per-slot load")  # fmt: skip
    _add(
        coord,
        "--auto-offset-reset",
        type=offset_reset,
        metavar="{earliest,latest}",
        default=GROUP_DEFAULTS.auto_offset_reset,
        help="where a new group starts: earliest (every record already in its topics) or "
        "latest (only records produced after the group was created), as Kafka's "
        "auto.offset.reset",
    )
    _add(
        coord,
        "--group-auto-offset-reset",
        type=group_offset_reset,
        metavar="GROUP=RESET",
        action="append",
        default=[],
        help="GROUP=earliest or GROUP=latest: where one new group starts (repeatable)",
    )
    _add(coord, "--flush-interval-ms", type=positive_ms, default=200,
         help="how often a group's changed positions are written to the state topic "
         "(a StartFetcher's still are before it leaves)")  # fmt: skip
    _add(coord, "--metadata-refresh-ms", type=positive_ms, default=5_000,
         help="how often each group's topics are read from the cluster (partitions added, "
         "topics created or deleted)")  # fmt: skip
    _add(coord, "--partition-growth-window-ms", type=positive_ms,
         default=DEFAULT_GROWTH_WINDOW_MS, help="after a topic grew, how long producers may "
         "still write by the old partition count (their metadata.max.age.ms)")  # fmt: skip
    add_endpoint_flags(coord)
    add_coordinator_secret_flags(coord, _add)
    add_bound_flags(coord, _add)
    add_identity_flags(coord, _add)
    add_authorization_flags(coord, _add)
    add_admin_access_flags(coord, _add)

    add_admin_commands(command)
    add_worker_command(command, _add, "{}:{}".format(*DEFAULT_LISTEN))
    add_demo_command(command)
    return parser


def add_embedded_broker_flag(parser: argparse.ArgumentParser) -> None:
    _add(
        parser,
        "--embedded-broker-listen",
        type=host_port,
        metavar="HOST:PORT",
        default=None,
        help="HOST:PORT of the embedded broker, started when no --bootstrap-servers is "
        "given (default: a free port on 127.0.0.1); its data is in memory, lost on exit",
    )


def add_demo_command(command: Any) -> None:
    """`keyshard demo`: everything on one machine, checked end to end (keyshard.local.demo)."""
    demo = command("demo", help="embedded broker + coordinator + consumers + producer")
    _add(demo, "--records", type=positive_int, default=20_000, help="records produced")
    _add(demo, "--keys", type=positive_int, default=500, help="distinct keys among them")
    _add(demo, "--consumers", type=positive_int, default=3,
         help="consumer processes at the start (one more joins, one leaves mid-run)")  # fmt: skip
    _add(demo, "--partitions", type=positive_int, default=1, help="partitions of the topic")
    _add(demo, "--rate", type=positive_number, default=2000.0, help="records per second produced")
    _add(demo, "--output", default="demo-output", help="folder for every component's logs")
    _add(
        demo,
        "--bootstrap-servers",
        type=servers,
        default=None,
        help="run on this Kafka instead of an embedded broker (a fresh topic and state "
        "topic of its own, deleted afterwards)",
    )
    _add(
        demo,
        "--kafka-config",
        default=None,
        help="Kafka client settings for --bootstrap-servers, Java .properties format",
    )
    add_embedded_broker_flag(demo)


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
        type=positive_ms,
        default=DEFAULT_REGISTER_TIMEOUT_MS,
        help="a consumer connection that has not sent Register this long after it was "
        "accepted (TLS handshake included) is closed",
    )
    _add(
        coord,
        "--max-connections",
        type=positive_int,
        default=None,
        help="consumer connections at once (default: 10000, or fewer to fit the "
        "open-file limit); more are refused",
    )
    _add(
        coord,
        "--max-connections-per-peer",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
        help="consumer connections at once from one IP address",
    )


def add_admin_commands(command: Any) -> None:
    """The admin subcommands (keyshard.cli.admin), `command` adding each one."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin",
        default=os.environ.get("KEYSHARD_ADMIN", DEFAULT_ADMIN),
        help="admin API URL [env KEYSHARD_ADMIN]",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("KEYSHARD_ADMIN_TOKEN"),
        help="admin bearer token [env KEYSHARD_ADMIN_TOKEN]",
    )
    common.add_argument(
        "--token-file",
        default=os.environ.get("KEYSHARD_ADMIN_TOKEN_FILE"),
        help="file holding the admin bearer token [env KEYSHARD_ADMIN_TOKEN_FILE]",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON as is")
    command("groups", parents=[common], help="list groups")
    status = command("status", parents=[common], help="members, ranges, handoffs")
    status.add_argument("group")
    positions = command(
        "positions", parents=[common], help="where a group resumes: slot ranges, next offsets"
    )
    positions.add_argument("group")
    where = command("where", parents=[common], help="which member runs a key")
    where.add_argument("group")
    where.add_argument("key")
    where.add_argument("--topic", default=None, help="only this topic's partitions")
    rebalance = command("rebalance", parents=[common], help="recompute the target now")
    rebalance.add_argument("group")
    fence = command("fence", parents=[common], help="fence (remove) a member")
    fence.add_argument("group")
    fence.add_argument("member")
    add_reset_command(command, common)


def add_reset_command(command: Any, common: argparse.ArgumentParser) -> None:
    """`reset-positions`, shaped like `kafka-consumer-groups --reset-offsets`."""
    reset = command(
        "reset-positions",
        parents=[common],
        help="move a group's positions (a dry run unless --execute); members must be "
        "stopped or fenced first",
    )
    reset.add_argument("group")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's first offset")
    to.add_argument("--to-latest", action="store_true", help="each partition's end")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (within the log)")
    to.add_argument(
        "--to-datetime",
        metavar="ISO",
        help="the first offset at or after an ISO 8601 time (UTC unless it says)",
    )
    to.add_argument(
        "--to-committed", action="store_true", help="the group's committed Kafka offsets"
    )
    reset.add_argument(
        "--topic", metavar="T[:P]", default=None, help="only topic T (partition P of it)"
    )
    reset.add_argument(
        "--slots", metavar="A-B", default=None, help="only slots A to B (0-65535, inclusive)"
    )
    reset.add_argument(
        "--execute", action="store_true", help="apply it (without: show what it would do)"
    )


ADMIN_COMMANDS = {"groups", "status", "positions", "where", "rebalance", "fence", "reset-positions"}
