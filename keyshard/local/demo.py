"""`keyshard demo`: the whole product on one machine, checked end to end.

Embedded broker, the coordinator (in this process), several consumer processes and a keyed
producer; one consumer joins and one leaves mid-run. The report says what was produced and
processed, duplicates, per-key order violations, and every handoff with its pause. The
exit code is non-zero if anything was lost or handed out of order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from keyshard.coordinator.group.state import GroupConfig, GroupState
from keyshard.coordinator.storage.base import DEFAULT_STATE_TOPIC
from keyshard.core.kafka.settings import KafkaSettings, load_properties
from keyshard.core.model.addresses import LOOPBACK
from keyshard.daemon import DaemonConfig, start_daemon
from keyshard.local.broker import BrokerError, EmbeddedBroker, embedded_broker
from keyshard.local.processes import free_port
from keyshard.local.verify import Produced, Report, check, read_processed

GROUP = "demo"
TOPIC = "demo.events"


@dataclass(frozen=True)
class DemoKafka:
    """Where the demo runs: the embedded broker, or a Kafka the user named (then with a
    topic and a state topic of its own, so nothing of theirs is read or written)."""

    bootstrap_servers: str
    settings: KafkaSettings
    config_file: str | None
    topic: str
    state_topic: str
    external: bool


def worker_command(
    *, name: str, coordinator: str, bootstrap: str, out: Path, extra: list[str] | None = None,
    topic: str = TOPIC, group: str = GROUP, kafka_config: str | None = None,
    topic_pattern: str | None = None,
) -> list[str]:  # fmt: skip
    config = ["--kafka-config", kafka_config] if kafka_config else []
    reads = ["--topic-pattern", topic_pattern] if topic_pattern else ["--topics", topic]
    return [
        sys.executable, "-m", "keyshard.local.demo_worker", "--log-level", "WARNING",
        "--group", group, *reads, "--coordinator", coordinator,
        "--bootstrap-servers", bootstrap, *config, "--name", name,
        "--out", str(out), *(extra or []),
    ]  # fmt: skip


def run_demo(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_demo(args))
    except BrokerError as err:
        print(f"keyshard demo: embedded broker: {err}", file=sys.stderr)
        return 1


async def _demo(args: argparse.Namespace) -> int:
    """Run everything, print the report, then stop in dependency order: the consumers
    (they leave through the coordinator), the coordinator (its last writes go to the
    broker), the broker. The terminal gets the progress and the report; every
    component's log goes to a file in the output folder."""
    console = Console()
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("*.jsonl"), *out_dir.glob("*.log")]:
        old.unlink()
    _log_to(out_dir / "coordinator.log")
    broker: EmbeddedBroker | None = None
    settings = KafkaSettings.parse(load_properties(args.kafka_config) if args.kafka_config else {})
    if args.bootstrap_servers:
        run_id = time.strftime("%Y%m%d-%H%M%S")
        kafka = DemoKafka(
            args.bootstrap_servers, settings, args.kafka_config, f"{TOPIC}.{run_id}",
            f"__keyshard_demo_state.{run_id}", external=True,
        )  # fmt: skip
    else:
        broker = embedded_broker(args.embedded_broker_listen, log_path=out_dir / "broker.log")
        broker.start()
        kafka = DemoKafka(
            broker.bootstrap_servers, settings, None, TOPIC, DEFAULT_STATE_TOPIC, external=False
        )
    workers: dict[str, subprocess.Popen[bytes]] = {}
    daemon = None
    admin = AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap_servers, **settings.admin_options()
    )
    try:
        await admin.start()
        await admin.create_topics([NewTopic(kafka.topic, args.partitions, 1)])
        listen, admin_port = free_port(), free_port()
        daemon = await start_daemon(
            DaemonConfig(
                bootstrap_servers=kafka.bootstrap_servers,
                listen_host=LOOPBACK,
                listen_port=listen,
                admin_host=LOOPBACK,
                admin_port=admin_port,
                state_topic=kafka.state_topic,
                group_defaults=GroupConfig(drain_timeout_ms=5000),
                kafka=settings,
                embedded_broker=not kafka.external,
            )
        )
        coordinator = f"{LOOPBACK}:{listen}"
        console.print(
            f"kafka [bold]{kafka.bootstrap_servers}[/] "
            f"({'' if kafka.external else 'embedded, in memory; '}topic {kafka.topic}), "
            f"coordinator [bold]{coordinator}[/], "
            f"admin [bold]http://{LOOPBACK}:{admin_port}/v1/groups/{GROUP}[/], "
            f"logs [bold]{out_dir}/[/]"
        )

        def spawn(name: str) -> None:
            with (out_dir / f"{name}.log").open("ab") as log:
                workers[name] = subprocess.Popen(
                    worker_command(
                        name=name,
                        coordinator=coordinator,
                        bootstrap=kafka.bootstrap_servers,
                        out=out_dir / f"{name}.jsonl",
                        topic=kafka.topic,
                        kafka_config=kafka.config_file,
                    ),
                    stdout=log,
                    stderr=log,
                )

        for i in range(args.consumers):
            spawn(f"consumer-{i}")
        produced = await _produce_with_events(args, console, kafka, spawn, workers, out_dir)
        report = check(produced, read_processed(out_dir.glob("*.jsonl")))
        _print_report(console, report, daemon.runtime.group_states().get(GROUP))
        await _stop_workers(workers)
        return 0 if report.ok and report.produced == args.records else 1
    finally:
        await _stop_workers(workers, graceful=False)
        if daemon is not None:
            await daemon.stop()
        if kafka.external:  # leave the user's cluster as it was
            with contextlib.suppress(Exception):
                await admin.delete_topics([kafka.topic, kafka.state_topic])
        with contextlib.suppress(Exception):
            await admin.close()
        if broker is not None:
            broker.stop()


def _log_to(path: Path) -> None:
    """Send this process's logs (the coordinator's) to `path` instead of the terminal,
    in the format the command line set up."""
    root = logging.getLogger()
    formatter = next((h.formatter for h in root.handlers if h.formatter), None)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(formatter)
    root.addHandler(to_file)


async def _stop_workers(
    workers: dict[str, subprocess.Popen[bytes]], *, graceful: bool = True
) -> None:
    """Gracefully (SIGTERM: drain, Leave) and wait, or kill what is still running."""
    running = [p for p in workers.values() if p.poll() is None]
    for proc in running:
        if graceful:
            proc.send_signal(signal.SIGTERM)
        else:
            proc.kill()
    # The coordinator runs in this loop: wait off-loop so it can serve their Leaves.
    await asyncio.gather(*(asyncio.to_thread(p.wait, 30) for p in running))


async def _produce_with_events(
    args: argparse.Namespace,
    console: Console,
    kafka: DemoKafka,
    spawn: object,
    workers: dict[str, subprocess.Popen[bytes]],
    out_dir: Path,
) -> list[Produced]:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers, linger_ms=5, **kafka.settings.client_options()
    )
    await producer.start()
    produced: list[Produced] = []
    join_at, leave_at = int(args.records * 0.35), int(args.records * 0.65)
    interval = 1.0 / args.rate
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
    ) as progress:  # fmt: skip
        sent = progress.add_task("produced ", total=args.records)
        done = progress.add_task("processed", total=args.records)
        started = time.monotonic()
        pending = []
        for i in range(args.records):
            key = f"key-{i % args.keys}"
            pending.append(
                (key, await producer.send(kafka.topic, key=key.encode(), value=str(i).encode()))
            )
            if i == join_at:
                spawn(f"consumer-{args.consumers}")  # type: ignore[operator]
                progress.console.print(
                    f"[green]join[/]: consumer-{args.consumers} starts at record {i}"
                )
            if i == leave_at:
                workers["consumer-0"].send_signal(signal.SIGTERM)
                progress.console.print(
                    f"[yellow]leave[/]: consumer-0 stops gracefully at record {i}"
                )
            if i % 200 == 0:
                progress.update(sent, completed=i)
                progress.update(done, completed=_count_processed(out_dir))
                await asyncio.sleep(max(0.0, started + i * interval - time.monotonic()))
        for key, fut in pending:
            meta = await fut
            produced.append(Produced(meta.partition, meta.offset, key))
        await producer.stop()
        progress.update(sent, completed=args.records)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            n = _count_processed(out_dir)
            progress.update(done, completed=min(n, args.records))
            if n >= args.records:
                break
            await asyncio.sleep(0.2)
    return produced


def _count_processed(out_dir: Path) -> int:
    unique = {(e.partition, e.offset) for e in read_processed(out_dir.glob("*.jsonl"))}
    return len(unique)


def _print_report(console: Console, report: Report, state: GroupState | None) -> None:
    table = Table(title="keyshard demo report")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("records produced", str(report.produced))
    table.add_row("records processed (unique)", str(report.processed_unique))
    table.add_row("handler runs", str(report.handler_runs))
    table.add_row("lost", str(len(report.lost)))
    table.add_row("duplicates", str(report.duplicates))
    table.add_row("per-key order violations", str(len(report.order_violations)))
    for worker, n in report.per_worker.items():
        table.add_row(f"  processed by {worker}", str(n))
    console.print(table)
    if state is not None:
        handoffs = Table(title="handoffs")
        for col in ("#", "kind", "from", "to", "slots", "pause ms"):
            handoffs.add_column(col)
        pauses = []
        for h in state.handoffs:
            pause = h.pause_s
            if pause is not None:
                pauses.append(pause * 1000)
            shown_pause = "-" if pause is None else f"{pause * 1000:.1f}"
            handoffs.add_row(
                str(h.handoff_id), h.kind, h.from_member, ", ".join(h.to_members),
                str(h.ranges.size), shown_pause,
            )  # fmt: skip
        console.print(handoffs)
        if pauses:
            console.print(
                f"handoff pause: median {statistics.median(pauses):.1f} ms, "
                f"max {max(pauses):.1f} ms (StopFetcher sent -> range running on its new owner)"
            )
    for problem in report.order_violations[:10]:
        console.print(f"[red]order violation[/]: {problem}")
    if report.lost:
        console.print(f"[red]lost[/]: {report.lost[:20]}")
    verdict = "[green]OK[/]" if report.ok else "[red]FAILED[/]"
    console.print(f"verdict: {verdict} (pid {os.getpid()})")
