"""The `keyshard` command line.

Every flag also reads an environment variable (`KEYSHARD_` + the flag name in upper case,
dashes as underscores), so a container can be configured the 12-factor way.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from coordinator.admin_client import ADMIN_COMMANDS, add_admin_commands, run_admin_command
from coordinator.group import GroupConfig


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
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host, int(port)


def _servers(value: str) -> str:
    """A comma-separated list of HOST:PORT, each checked like --listen."""
    for part in value.split(","):
        _host_port(part.strip())
    return value


def _assignor(value: str) -> str:
    from coordinator.assignor import known_assignors

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keyshard", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("KEYSHARD_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    broker = sub.add_parser("broker", help="run an embedded Kafka-protocol broker (Tansu)")
    _add(broker, "--listen", type=_host_port, default=("127.0.0.1", 9092), help="HOST:PORT")
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
        default=("127.0.0.1", 7171),
        help="consumer channel HOST:PORT",
    )
    _add(
        coord,
        "--admin-listen",
        type=_host_port,
        default=("127.0.0.1", 7172),
        help="admin API HOST:PORT",
    )
    _add(coord, "--state-topic", default="__keyshard_state", help="internal topic for positions")
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
        default=10_000,
        help="StopFetcher drain deadline",
    )
    _add(
        coord,
        "--startup-grace-ms",
        type=_positive_ms,
        default=10_500,
        help="no grants this long after start (previous owners must have stopped)",
    )
    _add(
        coord,
        "--lost-member-margin-ms",
        type=_positive_ms,
        default=500,
        help="extra wait past a lost member's session before its ranges move",
    )
    _add(
        coord,
        "--assignor",
        type=_assignor,
        default="load-aware",
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
        default=1.25,
        help="load-aware: rebalance when a member carries this many times its fair share",
    )
    _add(
        coord,
        "--rebalance-hold-ms",
        type=_positive_ms,
        default=30_000,
        help="load-aware: ...continuously for this long",
    )
    _add(
        coord,
        "--balance-check-ms",
        type=_positive_ms,
        default=5_000,
        help="load-aware: how often the imbalance is measured",
    )
    _add(coord, "--load-half-life-ms", type=_positive_ms, default=30_000,
         help="half-life of the measured per-slot load")  # fmt: skip

    add_admin_commands(sub)

    demo = sub.add_parser("demo", help="embedded broker + coordinator + consumers + producer")
    demo.add_argument("--records", type=int, default=20_000)
    demo.add_argument("--keys", type=int, default=500)
    demo.add_argument("--consumers", type=int, default=3)
    demo.add_argument("--partitions", type=int, default=1)
    demo.add_argument("--rate", type=float, default=2000.0, help="records per second produced")
    demo.add_argument("--output", default="demo-output", help="folder for worker logs")

    worker = sub.add_parser("demo-worker", help=argparse.SUPPRESS)
    worker.add_argument("--group", required=True)
    worker.add_argument("--topics", required=True)
    worker.add_argument("--coordinator", required=True)
    worker.add_argument("--bootstrap-servers", required=True)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    try:
        if args.command == "broker":
            from coordinator.broker import run_foreground

            host, port = args.listen
            return run_foreground(host, port, args.storage_engine)
        if args.command == "coordinator":
            return _run_coordinator(args)
        if args.command in ADMIN_COMMANDS:
            return run_admin_command(args)
        if args.command == "demo":
            from coordinator.demo import run_demo

            return run_demo(args)
        if args.command == "demo-worker":
            from coordinator.demo_worker import run_worker

            return run_worker(args)
    except KeyboardInterrupt:
        return 130
    return 2


def _run_coordinator(args: argparse.Namespace) -> int:
    from coordinator.daemon import DaemonConfig, run_daemon

    listen_host, listen_port = args.listen
    admin_host, admin_port = args.admin_listen
    config = DaemonConfig(
        bootstrap_servers=args.bootstrap_servers,
        listen_host=listen_host,
        listen_port=listen_port,
        admin_host=admin_host,
        admin_port=admin_port,
        state_topic=args.state_topic,
        auth_token=args.auth_token,
        admin_token=args.admin_token,
        admin_auth_reads=bool(args.admin_auth_reads),
        group_defaults=GroupConfig(
            assignor=args.assignor,
            drain_timeout_ms=int(args.drain_timeout_ms),
            lost_member_margin_ms=int(args.lost_member_margin_ms),
            rebalance_threshold=float(args.rebalance_threshold),
            rebalance_hold_ms=int(args.rebalance_hold_ms),
            balance_check_ms=int(args.balance_check_ms),
            load_half_life_ms=int(args.load_half_life_ms),
        ),
        group_assignors=dict(args.group_assignor),
        startup_grace_ms=int(args.startup_grace_ms),
    )
    kafka = args.bootstrap_servers or "the embedded broker"
    try:
        asyncio.run(run_daemon(config, announce=lambda line: print(line, flush=True)))
    except TimeoutError:
        print(f"keyshard coordinator: cannot start: Kafka at {kafka} did not answer in time",
              file=sys.stderr)  # fmt: skip
        return 1
    except OSError as err:
        print(f"keyshard coordinator: cannot start: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from aiokafka.errors import KafkaError

        if isinstance(err, KafkaError):
            print(f"keyshard coordinator: cannot reach Kafka at {kafka}: {err}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
