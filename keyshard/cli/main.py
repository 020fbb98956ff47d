"""The `keyshard` command line: `main` dispatches to the command's module.

Server commands import their modules only when they run, after checking that the extra
they need is installed (`keyshard.cli.extras`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from keyshard.cli.bound_flags import bounds_from
from keyshard.cli.endpoint_tls import endpoint_tls
from keyshard.cli.extras import require_server_extra
from keyshard.cli.parser import ADMIN_COMMANDS, build_parser
from keyshard.cli.secret_flags import take_coordinator_secrets
from keyshard.coordinator.group.state import GroupConfig
from keyshard.core.kafka.settings import (
    KafkaConfigError,
    KafkaSettings,
    from_environment,
    load_properties,
)
from keyshard.core.security.log_safety import PrintableMessages
from keyshard.core.security.secret_files import SecretFileError
from keyshard.core.security.tls import TlsConfigError

# Commands that run a server part or call the admin API: they need `keyshard[server]`.
SERVER_COMMANDS = {"broker", "coordinator", "demo", *ADMIN_COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:  # what clients name stays on its line
        handler.addFilter(PrintableMessages())
    if args.command in SERVER_COMMANDS:
        refused = require_server_extra(args.command)
        if refused is not None:
            return refused
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "broker":
        from keyshard.local.broker import run_foreground

        host, port = args.listen
        return run_foreground(host, port, args.storage_engine)
    if args.command == "coordinator":
        return _run_coordinator(args)
    if args.command in ADMIN_COMMANDS:
        from keyshard.cli.admin import run_admin_command

        return run_admin_command(args)
    if args.command == "demo":
        from keyshard.local.demo import run_demo

        if args.bootstrap_servers and args.embedded_broker_listen:
            return _both_kafkas(args.command)
        return run_demo(args)
    if args.command == "worker":
        from keyshard.cli.worker import run_worker_command

        return run_worker_command(args)
    return 2


def _both_kafkas(command: str) -> int:
    print(
        f"keyshard {command}: --embedded-broker-listen (KEYSHARD_EMBEDDED_BROKER_LISTEN) is "
        "for the embedded broker, started only when no Kafka is named: drop it or "
        "--bootstrap-servers",
        file=sys.stderr,
    )
    return 2


def kafka_settings(config_file: str | None, environ: Mapping[str, str]) -> KafkaSettings:
    """The coordinator's Kafka client settings: the --kafka-config file, then the
    KEYSHARD_KAFKA_* variables over it (a Secret's password wins over a ConfigMap's file)."""
    from_file = load_properties(config_file) if config_file else {}
    return KafkaSettings.parse({**from_file, **from_environment(environ)})


def _run_coordinator(args: argparse.Namespace) -> int:
    """Run the daemon until SIGINT/SIGTERM; with no Kafka named (--bootstrap-servers or
    bootstrap.servers) on an embedded broker, started first and stopped last."""
    from keyshard.cli.access import admin_auth_from, authentication_from, check_authorization
    from keyshard.coordinator.storage.signing import ReplicaSecret, SecretError
    from keyshard.local.broker import BrokerError, embedded_broker

    try:  # TLS and secret files first: a bad one is one line naming its flag, at once
        args.tls, args.admin_tls = endpoint_tls(args)
        take_coordinator_secrets(args)
        args.replica_secret = (
            ReplicaSecret.from_file(args.replica_secret_file) if args.replica_secret_file else None
        )
        args.bounds = bounds_from(args)
        args.authentication = authentication_from(args)
        check_authorization(args)
        args.admin_auth = admin_auth_from(args, args.authentication)
    except (TlsConfigError, SecretFileError, SecretError, ValueError) as err:
        print(f"keyshard coordinator: {err}", file=sys.stderr)
        return 2
    try:
        kafka = kafka_settings(args.kafka_config, os.environ)
        bootstrap = args.bootstrap_servers or kafka.bootstrap_servers
        if bootstrap and args.embedded_broker_listen:
            return _both_kafkas(args.command)
        if bootstrap:
            return _serve(args, kafka.with_bootstrap(bootstrap), kafka)
    except KafkaConfigError as err:
        print(f"keyshard coordinator: bad Kafka settings: {err}", file=sys.stderr)
        return 2
    if kafka.properties:
        print(
            "keyshard coordinator: Kafka settings given but no Kafka: add --bootstrap-servers "
            "(or bootstrap.servers); without one the coordinator starts an embedded broker",
            file=sys.stderr,
        )
        return 2
    broker = embedded_broker(args.embedded_broker_listen)
    try:
        broker.start()
    except BrokerError as err:
        print(f"keyshard {args.command}: embedded broker: {err}", file=sys.stderr)
        return 1
    logging.getLogger(__name__).info(
        "embedded broker started on %s (pid %s)", broker.bootstrap_servers, broker.pid
    )
    try:
        return _serve(args, broker.bootstrap_servers, kafka, embedded=True)
    finally:
        broker.stop()


def _serve(
    args: argparse.Namespace,
    bootstrap_servers: str,
    settings: KafkaSettings,
    embedded: bool = False,
) -> int:
    from keyshard.coordinator.storage.base import StoreError
    from keyshard.daemon import DaemonConfig, run_daemon

    listen_host, listen_port = args.listen
    admin_host, admin_port = args.admin_listen
    config = DaemonConfig(
        bootstrap_servers=bootstrap_servers,
        listen_host=listen_host,
        listen_port=listen_port,
        admin_host=admin_host,
        admin_port=admin_port,
        state_topic=args.state_topic,
        authentication=args.authentication,
        authorizer=args.authorizer,
        acl_file=args.acl_file,
        acl_cache_ms=int(args.acl_cache_ms),
        admin_token=args.admin_token,
        admin_auth=args.admin_auth,
        replica_secret=args.replica_secret,
        admin_auth_reads=bool(args.admin_auth_reads),
        group_defaults=GroupConfig(
            assignor=args.assignor,
            drain_timeout_ms=int(args.drain_timeout_ms),
            lost_member_margin_ms=int(args.lost_member_margin_ms),
            stall_timeout_ms=args.stall_timeout_ms,
            rebalance_threshold=float(args.rebalance_threshold),
            rebalance_hold_ms=int(args.rebalance_hold_ms),
            backlog_hold_ms=int(args.backlog_hold_ms),
            backlog_records=int(args.backlog_records),
            demand_horizon_ms=int(args.demand_horizon_ms),
            balance_check_ms=int(args.balance_check_ms),
            load_half_life_ms=int(args.load_half_life_ms),
            auto_offset_reset=args.auto_offset_reset,
        ),
        group_assignors=dict(args.group_assignor),
        group_offset_resets=dict(args.group_auto_offset_reset),
        state_partitions=int(args.state_partitions),
        replica_timeout_ms=int(args.replica_timeout_ms),
        leader_failover_ms=int(args.leader_failover_ms),
        advertise=":".join(map(str, args.advertise)) if args.advertise else None,
        replica_id=args.replica_id or None,
        kafka=settings,
        embedded_broker=embedded,
        tls=args.tls,
        admin_tls=args.admin_tls,
        register_timeout_ms=int(args.register_timeout_ms),
        max_connections=args.max_connections,
        max_connections_per_peer=int(args.max_connections_per_peer),
        pre_auth_max_frame_bytes=int(args.pre_auth_max_frame_bytes),
        bounds=args.bounds,
        flush_interval_ms=int(args.flush_interval_ms),
        metadata_refresh_ms=int(args.metadata_refresh_ms),
        partition_growth_window_ms=int(args.partition_growth_window_ms),
    )
    kafka = args.bootstrap_servers or "the embedded broker"
    try:
        asyncio.run(run_daemon(config, announce=lambda line: print(line, flush=True)))
    except TimeoutError:
        print(f"keyshard coordinator: cannot start: Kafka at {kafka} did not answer in time",
              file=sys.stderr)  # fmt: skip
        return 1
    except (OSError, StoreError) as err:
        print(f"keyshard coordinator: cannot start: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from aiokafka.errors import KafkaError

        if isinstance(err, KafkaError):
            print(f"keyshard coordinator: cannot reach Kafka at {kafka}: {err}", file=sys.stderr)
            return 1
        raise
    return 0
