"""Shared machinery of the throughput benchmarks: broker, coordinator, data, runs, tables.

A *run* starts N worker processes of one system (`bench._worker`), waits until all of
them have imported and built their clients, releases them at once (the go file), and
measures from the first completed handler call on: throughput over a fixed time window
(after a short warm-up, so group formation and the first rebalance are not averaged in),
or up to the last record when the topic runs out first. Every process started here is
stopped by pid.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

from bench import RESULTS
from bench._worker import BUCKET_S, burn
from harness import CoordinatorProcess, OrderStats, is_settled, order_stats
from harness.brokers import new_broker, stop_broker
from harness.brokers.kafka import cache_root
from keyshard.local.processes import stop_process

KEYS = 10_000  # distinct record keys in every benchmark topic

#: The repository root: worker processes run `python -m bench._worker` from here (the
#: peers' interpreters have neither keyshard nor the harness installed).
ROOT = Path(__file__).resolve().parent.parent
# Each peer in its own virtualenv under the project's cache, made by scripts/bench.sh
# (Pyrallel declares Python >= 3.12 and brings its own confluent-kafka).
PEERS = cache_root() / "peers"
PYRALLEL_PYTHON = Path(os.environ.get("PYRALLEL_PYTHON", PEERS / "pyrallel" / "bin" / "python"))
CONFLUENT_PYTHON = Path(os.environ.get("CONFLUENT_PYTHON", PEERS / "confluent" / "bin" / "python"))


def peer_python(system: str) -> Path:
    """The interpreter a system's workers run with: a peer's own virtualenv, or ours."""
    if system.startswith("pyrallel"):
        return PYRALLEL_PYTHON
    if system in ("kip848", "share"):
        return CONFLUENT_PYTHON
    return Path(sys.executable)


def peer_missing(system: str) -> str:
    """Empty when `system`'s interpreter can import its client library, else why not."""
    python = peer_python(system)
    module = {"kip848": "confluent_kafka", "share": "confluent_kafka"}.get(system, "")
    module = "pyrallel_consumer" if system.startswith("pyrallel") else module
    if not module:
        return ""
    if not python.exists():
        return f"{python} not found (scripts/bench.sh makes it)"
    probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True)
    return probe.stderr.strip()[-300:] if probe.returncode else ""


# ---- the machine ----------------------------------------------------------------------


def machine() -> str:
    """One line for every table: where, when, and how busy the machine was at the start."""
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal"):
                mem_kb = int(line.split()[1])
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem_kb / 2**20:.0f} GiB, Python "
        f"{platform.python_version()}, {date.today().isoformat()}; load average at start "
        f"{load[0]:.1f}"
    )


def calibrate_cpu_loops(target_s: float = 0.001) -> int:
    """Loop count of `_worker.burn` that takes `target_s` here (best of several tries)."""
    loops = 20_000
    best = float("inf")
    for _ in range(30):
        t0 = time.perf_counter()
        burn(loops)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(loops * target_s / best))


# ---- broker, coordinator, data ----------------------------------------------------------


class Cluster:
    """A broker (the embedded Tansu, or an Apache Kafka node) and a coordinator daemon
    process, for one benchmark invocation."""

    def __init__(self, work: Path, broker: str = "tansu") -> None:
        self.work = work
        self.broker = new_broker(broker, work / "kafka")
        self.coordinator: CoordinatorProcess | None = None

    def __enter__(self) -> Cluster:
        self.broker.start()
        self.coordinator = CoordinatorProcess(self.bootstrap, self.work)
        asyncio.run(self.coordinator.start())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.coordinator is not None:
            self.coordinator.stop()
        stop_broker(self.broker)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def daemon(self) -> CoordinatorProcess:
        if self.coordinator is None:
            raise RuntimeError("the cluster has not been entered")
        return self.coordinator

    def group(self, group: str) -> Any:
        """The coordinator's view of `group` (None: unknown), from synchronous code."""
        return asyncio.run(self.daemon.group(group))


def _env(spec: RunSpec) -> dict[str, str]:
    return {**os.environ, "KEYSHARD_PURE_PYTHON": "1"} if spec.pure_python else dict(os.environ)


#: The producer's batching: (linger ms, max batch bytes). "large" is what these benchmarks
#: always used; "default" is the Java producer's defaults (5 ms, 16 KiB, Kafka 4.x); "small"
#: ~10 records per batch, "small20" ~20 (of the 64-byte records here). Share groups hand out
#: acquired records by batch.
BATCHING = {
    "large": (20, 256 * 1024),
    "default": (5, 16 * 1024),
    "small": (0, 1024),
    "small20": (0, 1800),
}


def key_weights(keys: int, zipf: float) -> list[float]:
    """Key k's weight 1 / (k + 1) ** zipf: all alike for 0, key 0 the hottest above."""
    return [1 / (k + 1) ** zipf for k in range(keys)]


def draw_keys(records: int, keys: int, random_keys: bool, zipf: float = 0.0) -> list[int]:
    """The key numbers `load_topic` writes, in order (deterministic: a fixed seed)."""
    draw = random.Random(16)
    if random_keys and zipf:
        return draw.choices(range(keys), key_weights(keys, zipf), k=records)
    return [draw.randrange(keys) if random_keys else i % keys for i in range(records)]


def load_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    records: int,
    keys: int,
    create: bool = True,
    batching: str = "large",
    random_keys: bool = False,
    zipf: float = 0.0,
) -> float:
    """Create `topic` (unless `create` is False) and fill it with `records` keyed records
    (key i mod `keys`, or with `random_keys` drawn from `keys` with a fixed seed: uniformly,
    or with `zipf` > 0 by the weights of `key_weights`; 64-byte values); returns the seconds
    the filling took."""
    return asyncio.run(
        _load_topic(
            bootstrap, topic, partitions, records, keys, create, batching, random_keys, zipf
        )
    )


async def _load_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    records: int,
    keys: int,
    create: bool,
    batching: str = "large",
    random_keys: bool = False,
    zipf: float = 0.0,
) -> float:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    if create:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            await admin.close()
    t0 = time.monotonic()
    linger_ms, batch_bytes = BATCHING[batching]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=linger_ms, max_batch_size=batch_bytes
    )
    await producer.start()
    value = b"v" * 64
    try:
        futures = []
        for k in draw_keys(records, keys, random_keys, zipf):
            futures.append(await producer.send(topic, key=f"key-{k}".encode(), value=value))
            if len(futures) >= 20_000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.monotonic() - t0


# ---- one run ------------------------------------------------------------------------------


@dataclass
class RunSpec:
    system: str  # plain | pyrallel | pyrallel-process | keyshard | bare
    topic: str
    records: int  # how many the topic holds (the run ends early when all are done)
    processes: int = 1
    handler: str = "io"  # io | cpu | noop
    concurrency: int = 0  # keyshard lanes / Pyrallel max_in_flight; 0 = system default
    cpu_loops: int = 0
    warmup_s: float = 1.0
    window_s: float = 4.0
    pure_python: bool = False  # keyshard without its C fast path (KEYSHARD_PURE_PYTHON=1)
    # keyshard only: the topic (a fresh one per run) is filled only once all processes'
    # consumers share it, so the first to register does not read it all alone.
    fill_when_settled: bool = False
    # keyshard churn: worker i starts consuming i x stagger_s after the first one, so the
    # group changes while the topic is being read.
    stagger_s: float = 0.0
    replay_window: int = -1  # keyshard's replay window; -1: its default
    # Workers log (partition, offset, key, start, end) of every handler call, for the
    # per-key order check (`harness.order_stats`).
    order_log: bool = False
    note: str = ""  # shown after the system's name, e.g. the topic's producer batching
    max_poll_records: int = 0  # share group's max.poll.records; 0: the client's default
    slow_first: float = 1.0  # the first process's io handler takes this many times longer
    # > 0: no throughput window; the run lasts until each of the `records` records (of a
    # one-partition topic) was handled at least once, or this many seconds after the go
    # (then it timed out). Needs order_log (the times and members come from it).
    until_all_s: float = 0.0
    # The checkout the workers run from (its `keyshard`): another build, for bench/ab.py.
    root: Path = ROOT


@dataclass
class RunResult:
    spec: RunSpec
    rate: float  # records/s over the measured window
    measured: int  # records completed in the window
    window_s: float
    start_s: float  # go -> first completed record
    total: int  # completed during the whole run
    stats: dict[str, int] = field(default_factory=dict)  # keyshard counters, summed
    error: str = ""
    order: OrderStats | None = None
    # CPU microseconds of the worker processes per record, over the span in which they
    # did records (0: not measured; bench._worker's Meter.cpu_span)
    cpu_us_per_record: float = 0.0
    # until_all_s runs: from the order logs
    timed_out: bool = False
    distinct: int = 0  # records handled at least once
    last_s: float = 0.0  # go -> the last record's first completed handling
    per_member: list[int] = field(default_factory=list)  # handler calls per process
    # keyshard: ranges moved after the go, (s after it, handoff kind, slots), and the
    # coordinator's reasons for rebalancing, (s after the go, reason)
    moves: list[tuple[float, str, int]] = field(default_factory=list)
    rebalances: list[tuple[float, str]] = field(default_factory=list)


_counter = Counter[str]()


def run(cluster: Cluster, spec: RunSpec, timeout_s: float = 60) -> RunResult:
    _counter[spec.system] += 1
    tag = f"{spec.system}-{spec.topic}-{spec.processes}-{_counter[spec.system]}"
    moved: tuple[list[tuple[float, str, int]], list[tuple[float, str]]] | None = None
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=cluster.work))
    # One start file per worker: all touched at once, or one after another (stagger_s).
    gos = [work / f"go{i}" for i in range(spec.processes)]
    python = str(peer_python(spec.system))
    procs: list[subprocess.Popen[bytes]] = []
    statuses = [work / f"w{i}.json" for i in range(spec.processes)]
    if spec.fill_when_settled:
        spec = replace(spec, topic=f"{spec.topic}-{_counter[spec.system]}")
        load_topic(cluster.bootstrap, spec.topic, 1, 0, 1)
    try:
        for i, status in enumerate(statuses):
            cmd = [
                python, "-m", "bench._worker", "--system", spec.system, "--handler", spec.handler,
                "--cpu-loops", str(spec.cpu_loops), "--bootstrap", cluster.bootstrap,
                "--topic", spec.topic, "--group", tag, "--coordinator", cluster.daemon.address,
                "--name", f"{tag}-w{i}", "--concurrency", str(spec.concurrency),
                "--replay-window", str(spec.replay_window),
                "--go", str(gos[i]), "--status", str(status),
                "--max-poll-records", str(spec.max_poll_records),
                "--io-scale", str(spec.slow_first if i == 0 else 1.0),
                *(["--order-log"] if spec.order_log else []),
                *(["--track-distinct"] if spec.until_all_s else []),
            ]  # fmt: skip
            log = open(work / f"w{i}.log", "wb")  # noqa: SIM115 - handed to the child
            procs.append(
                subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, cwd=spec.root, env=_env(spec)
                )
            )
            log.close()
        _wait(lambda: all(s.with_suffix(".ready").exists() for s in statuses), procs, 60, work)
        started = time.monotonic()
        due = [started + i * spec.stagger_s for i in range(len(gos))]
        _touch_due(gos, due)
        if spec.fill_when_settled:
            _wait(lambda: is_settled(cluster.group(tag), spec.processes), procs, 60, work)
            load_topic(cluster.bootstrap, spec.topic, 1, spec.records, KEYS, create=False)
        t_go, t_go_wall = time.monotonic(), time.time()
        first: float | None = None
        timed_out = False
        while True:
            time.sleep(min(0.1, spec.stagger_s / 4) if spec.stagger_s else 0.1)
            _touch_due(gos, due)
            _check_alive(procs, work)
            live = [_read(s) for s in statuses]
            done = sum(d.get("count", 0) for d in live)
            firsts = [d["first"] for d in live if d.get("first") is not None]
            if firsts:
                first = min(firsts)
            now = time.monotonic()
            if spec.until_all_s:
                if _distinct(live) >= spec.records:
                    break
                if now > t_go + spec.until_all_s:
                    timed_out = True
                    break
                continue
            if done >= spec.records:
                break
            if first is not None and now > first + spec.warmup_s + spec.window_s + 0.2:
                break
            if first is None and now > t_go + timeout_s:
                return RunResult(spec, 0, 0, 0, 0, 0, error="nothing processed")
        moved = _moves(cluster, tag, t_go, t_go_wall) if spec.system == "keyshard" else None
    finally:
        for proc in procs:
            stop_process(proc)
    finals = [_read(s) for s in statuses]
    result = _measure(spec, t_go, finals)
    if moved is not None:
        result.moves, result.rebalances = moved
    if spec.until_all_s and spec.order_log:
        _until_all(result, t_go, finals, timed_out)
    return result


def _moves(
    cluster: Cluster, group: str, t_go: float, t_go_wall: float
) -> tuple[list[tuple[float, str, int]], list[tuple[float, str]]]:
    """What moved ranges after the go, before the workers stop: the group's handoffs (the
    coordinator's monotonic clock is this process's) and its logged rebalance reasons."""
    view = cluster.group(group) or {"handoffs": []}
    moves = sorted(
        (h["started_at"] - t_go, h["kind"], sum(b - a + 1 for a, b in h["ranges"]))
        for h in view["handoffs"]
        if h["started_at"] >= t_go
    )
    marker = f"group {group}: rebalancing: "
    reasons = []
    for line in cluster.daemon.read_log().splitlines():
        if marker in line:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - t_go_wall
            reasons.append((at, line.split(marker, 1)[1]))
    return moves, reasons


def _distinct(statuses: list[dict[str, Any]]) -> int:
    """Offsets handled by any worker (the union of their live bitmaps)."""
    union = 0
    for data in statuses:
        union |= int.from_bytes(base64.b64decode(data.get("seen", "")), "little")
    return union.bit_count()


def _until_all(
    result: RunResult, t_go: float, finals: list[dict[str, Any]], timed_out: bool
) -> None:
    """The times of a run to the last record, from every handler call's log row."""
    first_done: dict[tuple[int, int], float] = {}
    for data in finals:
        for partition, offset, _key, _start, end in data.get("order", []):
            where = (int(partition), int(offset))
            first_done[where] = min(end, first_done.get(where, end))
    result.timed_out = timed_out
    result.distinct = len(first_done)
    result.per_member = [len(d.get("order", [])) for d in finals]
    if first_done:
        result.start_s = min(first_done.values()) - t_go
        result.last_s = max(first_done.values()) - t_go


def _touch_due(gos: list[Path], due: list[float]) -> None:
    now = time.monotonic()
    for go, at in zip(gos, due, strict=True):
        if at <= now and not go.exists():
            go.touch()


def _wait(cond: Any, procs: list[subprocess.Popen[bytes]], timeout: float, work: Path) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        _check_alive(procs, work)
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready within {timeout} s ({work})")
        time.sleep(0.05)


def _check_alive(procs: list[subprocess.Popen[bytes]], work: Path) -> None:
    for i, proc in enumerate(procs):
        if proc.poll() is not None:
            tail = (work / f"w{i}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"worker {i} exited with {proc.returncode}:\n{tail}")


def _read(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def _measure(spec: RunSpec, t_go: float, finals: list[dict[str, Any]]) -> RunResult:
    buckets: Counter[int] = Counter()
    stats: Counter[str] = Counter()
    for data in finals:
        for key, n in data.get("buckets", {}).items():
            buckets[int(key)] += n
        stats.update(data.get("stats", {}))
    if not buckets:
        return RunResult(spec, 0, 0, 0, 0, 0, error="nothing processed")
    first_b, last_b = min(buckets), max(buckets)
    total = sum(buckets.values())
    start_b = first_b + round(spec.warmup_s / BUCKET_S)
    end_b = min(start_b + round(spec.window_s / BUCKET_S), last_b + 1)
    if end_b <= start_b:  # everything done within the warm-up: measure it all
        start_b, end_b = first_b, last_b + 1
    measured = sum(n for b, n in buckets.items() if start_b <= b < end_b)
    window = (end_b - start_b) * BUCKET_S
    return RunResult(
        spec,
        rate=measured / window,
        measured=measured,
        window_s=window,
        start_s=first_b * BUCKET_S - t_go,
        total=total,
        stats=dict(stats),
        order=order_stats([d.get("order", []) for d in finals]) if spec.order_log else None,
        cpu_us_per_record=_cpu_per_record(finals),
    )


def _cpu_per_record(finals: list[dict[str, Any]]) -> float:
    spans = [d["cpu"] for d in finals if len(d.get("cpu", [])) == 2]
    done = sum(last[0] - first[0] for first, last in spans)
    spent = sum(last[1] - first[1] for first, last in spans)
    return spent / done * 1e6 if done > 0 else 0.0


# ---- reporting ----------------------------------------------------------------------------


def publish(stem: str, md: str, results: Mapping[int, list[RunResult]]) -> None:
    """A benchmark's table (`bench/results/STEM.md`) and every run
    (`bench/results/STEM.json`), and the table on stdout."""
    (RESULTS / f"{stem}.md").write_text(md)
    save_json(RESULTS / f"{stem}.json", [r for rs in results.values() for r in rs])
    print(md)


def save_json(path: Path, results: list[RunResult]) -> None:
    path.write_text(
        json.dumps(
            [
                {
                    **r.spec.__dict__,
                    **{k: v for k, v in r.__dict__.items() if k not in ("spec", "order")},
                    **({"order": r.order.__dict__} if r.order else {}),
                }
                for r in results
            ],
            indent=1,
        )
    )


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="keyshard-bench-"))


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
