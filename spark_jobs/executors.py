"""Spark tasks as coordinated consumers: N long-lived tasks, each a `CoordinatedConsumer`.

Spark's Kafka source ties a job's parallelism to the partition count. Here every task of
one job registers with the coordinator as a member of the group and processes the key-hash
slot ranges it is granted, so a 1-partition topic feeds as many tasks as the job has: more
task slots (executors) → more consumers. A lost executor is a member whose session expires;
the coordinator moves its ranges to the others (from its last reported positions), and when
Spark retries the task it simply joins again.

Why tasks are not ordinary short tasks: a consumer is a member with an owned part of the
hash space, so each task lives until its stop condition (`StopWhen`) says so and then leaves
gracefully (drain in-flight records, report exact positions in a Leave: no duplicates). Each
task therefore holds a task slot for its whole life: N consumers need N free task slots, and
`run_executor_consumers` refuses to start a job that could not run them all at once.

Run it from Python (`run_executor_consumers(spark, ...)`) or as a job:

    spark-submit spark_jobs/executors.py --group orders --topics orders \\
        --coordinator coord:7171 --bootstrap-servers kafka:9092 \\
        --handler mypackage.handlers:save --consumers 8 --idle-ms 60000

The coordinator's token (its `--auth-token`) comes from `--auth-token-file` or the
environment (KEYSHARD_AUTH_TOKEN); `--auth-token` works too, with a warning that it shows
in `ps`. It travels to the executors inside the task, over Spark's RPC (turn on
`spark.authenticate` and `spark.network.crypto.enabled` where that network is shared).

Durations are in milliseconds. The names that were in seconds (`--max-seconds`,
`--idle-seconds`, `--connect-timeout-s`; `max_seconds=`, `idle_seconds=`,
`connect_timeout_s=`) are taken for one release: a flag with one line on stderr, an
argument with a `DeprecationWarning`; given with its new name, each is an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from keyshard.core.kafka.fetch_sizes import DEFAULT_MAX_BUFFER_BYTES, MIN_BUFFER_BYTES
from keyshard.core.kafka.settings import KafkaSettings, load_properties
from keyshard.core.model.addresses import parse_host_port
from keyshard.core.model.durations import renamed_seconds, take_renamed_flags
from keyshard.core.model.ranges import RangeSet
from keyshard.core.security.secret_files import secret_from
from keyshard.core.security.tls import ClientTls, TlsNames
from keyshard.spark_jobs.launch import job_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from keyshard.consumer_client import CoordinatedConsumer

Handler = Callable[[Any], None] | Callable[[Any], Awaitable[None]]


@dataclass(frozen=True, slots=True, init=False)
class StopWhen:
    """When each consumer task leaves the group (whichever comes first).

    - `max_ms`: wall time since the task started, in milliseconds (a bounded run, e.g. a
      scheduled job).
    - `idle_ms`: the task handled no record for this long. Idle is per consumer: one
      whose keys are quiet leaves and its slots go to the others, so nothing is left behind;
      the whole job ends once every consumer is idle. Pick it longer than the consumers'
      session timeout so a lost member's ranges have time to arrive.
    - `stop_file`: the path exists (on a cluster: a path every executor sees, e.g. a shared
      mount). The graceful way to end an open-ended job.

    All `None` runs until the Spark job is cancelled, which kills the Python workers: that
    is a crash for the coordinator (duplicates of at most one ping interval of work).
    Keyword-only; `max_seconds` and `idle_seconds` (seconds) are deprecated names of the
    first two.
    """

    max_ms: int | None
    idle_ms: int | None
    stop_file: str | None

    @renamed_seconds(max_seconds="max_ms", idle_seconds="idle_ms")
    def __init__(
        self, *, max_ms: int | None = None, idle_ms: int | None = None, stop_file: str | None = None
    ) -> None:
        for name, value in (("max_ms", max_ms), ("idle_ms", idle_ms)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 ms, got {value!r}")
        if stop_file is not None and not stop_file:
            raise ValueError("stop_file must be a path, got an empty string")
        object.__setattr__(self, "max_ms", max_ms)
        object.__setattr__(self, "idle_ms", idle_ms)
        object.__setattr__(self, "stop_file", stop_file)

    def reason(self, *, running_for: float, idle_for: float, file_exists: bool) -> str | None:
        """Why to stop now, or None to keep consuming (pure: the task feeds it the facts,
        in seconds)."""
        if self.stop_file is not None and file_exists:
            return "stop-file"
        if self.max_ms is not None and running_for * 1000 >= self.max_ms:
            return "max-seconds"
        if self.idle_ms is not None and idle_for * 1000 >= self.idle_ms:
            return "idle"
        return None


@dataclass(frozen=True, slots=True)
class TaskReport:
    """What one consumer task did, returned to the driver when it ends."""

    task: int
    attempt: int
    member_id: str | None
    records: int
    slots: int  # slots owned when the stop condition fired
    ranges: list[tuple[int, int]]  # inclusive (first, last) slot pairs
    seconds: float
    stopped_by: str
    host: str
    pid: int


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Everything a task needs; pickled once and shipped with the job."""

    group: str
    topics: list[str]
    coordinator: str
    bootstrap_servers: str
    until: StopWhen
    name: str = "spark"
    max_concurrency: int = 16
    session_timeout_ms: int = 10_000
    capacity: int = 1
    # Kafka client settings in Kafka's own names (security, SASL, TLS file paths that
    # exist on every executor): strings, so they pickle; each task checks them.
    kafka_config: dict[str, str] = field(default_factory=dict)
    coordinator_tls: ClientTls | None = None  # paths as the executors see them
    topic_pattern: str | None = None  # instead of `topics`
    # How long a task's coordinator or Kafka may stay unreachable before it fails (None:
    # retry, warning at once and then every 30 s, as `CoordinatedConsumer` does).
    connect_timeout_ms: int | None = None
    # A task that has read nothing from Kafka for this long hands its ranges back and
    # registers again once Kafka answers (None: its session timeout; docs/protocol.md
    # §7.6), as `CoordinatedConsumer` does.
    fetch_failure_timeout_ms: int | None = None
    # The coordinator's --auth-token; repr=False: kept out of anything that prints these.
    auth_token: str | None = field(default=None, repr=False)
    # Each task's memory budget (`CoordinatedConsumer`'s `max_buffer_bytes`): a Python
    # worker runs one task at a time, so an executor needs about this per task slot.
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES


_current: CoordinatedConsumer | None = None


def current_member() -> str | None:
    """Member id of the consumer running in this Python worker (a handler may log it).

    A worker process runs one consumer task at a time, so a process-wide value is enough.
    """
    return None if _current is None else _current.member_id


class _Counter:
    def __init__(self) -> None:
        self.records = 0
        self.last = time.monotonic()

    def done(self) -> None:
        self.records += 1
        self.last = time.monotonic()


def as_async(
    handler: Handler, counter: _Counter, pool: ThreadPoolExecutor
) -> Callable[[Any], Awaitable[None]]:
    """The user's function as the consumer's async handler: coroutine functions run in the
    lanes directly, plain functions in a thread pool (one thread per lane), and a normal
    return counts as one processed record."""
    if inspect.iscoroutinefunction(handler):

        async def call_async(record: Any) -> None:
            await handler(record)
            counter.done()

        return call_async

    async def call_sync(record: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(pool, handler, record)
        counter.done()

    return call_sync


def _exists(path: str) -> bool:
    """A stat every 0.2 s: cheap enough not to need a thread."""
    return os.path.exists(path)


async def consume_until(
    settings: ConsumerSettings, handler: Handler, task: int, attempt: int = 0
) -> TaskReport:
    """One consumer task: register, consume until the stop condition, leave gracefully."""
    from keyshard.consumer_client import CoordinatedConsumer

    global _current
    consumer = CoordinatedConsumer(
        group=settings.group,
        topics=settings.topics,
        topic_pattern=settings.topic_pattern,
        coordinator=settings.coordinator,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_config=settings.kafka_config,
        name=f"{settings.name}-{task}",
        max_concurrency=settings.max_concurrency,
        session_timeout_ms=settings.session_timeout_ms,
        fetch_failure_timeout_ms=settings.fetch_failure_timeout_ms,
        capacity=settings.capacity,
        coordinator_tls=settings.coordinator_tls,
        connect_timeout_ms=settings.connect_timeout_ms,
        auth_token=settings.auth_token,
        max_buffer_bytes=settings.max_buffer_bytes,
        # Spark owns its Python workers' signals: it stops a task by interrupting it.
        handle_signals=False,
    )
    counter = _Counter()
    reason = ""
    pool = ThreadPoolExecutor(
        settings.max_concurrency, thread_name_prefix=f"{settings.name}-{task}"
    )
    started = time.monotonic()
    _current = consumer
    running = asyncio.create_task(consumer.run(as_async(handler, counter, pool)))
    try:
        while True:
            if running.done():
                running.result()  # a fatal consumer error fails the task with its message
                raise RuntimeError("the consumer stopped on its own")
            now = time.monotonic()
            until = settings.until
            stop = until.reason(
                running_for=now - started,
                idle_for=now - counter.last,
                file_exists=until.stop_file is not None and _exists(until.stop_file),
            )
            if stop is not None:
                reason = stop
                break
            await asyncio.sleep(0.2)
        ranges = consumer.owned_slots
        member = consumer.member_id
        await consumer.close()
        await running
    finally:
        if not running.done():
            running.cancel()
            with contextlib.suppress(BaseException):
                await running
        pool.shutdown(wait=False, cancel_futures=True)
        _current = None
    return TaskReport(
        task=task,
        attempt=attempt,
        member_id=member,
        records=counter.records,
        slots=RangeSet.from_pairs(ranges).size,
        ranges=[tuple(r) for r in ranges],  # type: ignore[misc]
        seconds=round(time.monotonic() - started, 3),
        stopped_by=reason,
        host=socket.gethostname(),
        pid=os.getpid(),
    )


def _task(
    settings: ConsumerSettings, handler: Handler
) -> Callable[[Iterable[int]], list[TaskReport]]:
    def run(indexes: Iterable[int]) -> list[TaskReport]:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        return [asyncio.run(consume_until(settings, handler, task, attempt)) for task in indexes]

    return run


def _probe(address: str, what: str, timeout: float = 5.0) -> None:
    """Fail on the driver, before Spark starts anything, if `address` does not answer."""
    try:
        host, port = parse_host_port(address.split(",")[0].strip())
    except ValueError as err:
        raise ValueError(f"{what} address {err}") from None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(f"{what} at {host}:{port} is unreachable: {err}") from err


def task_slots(spark: SparkSession) -> int:
    """How many tasks this application can run at once right now (local[N]: N)."""
    return int(spark.sparkContext.defaultParallelism)


@renamed_seconds(connect_timeout_s="connect_timeout_ms")
def run_executor_consumers(
    spark: SparkSession,
    *,
    group: str,
    topics: list[str] | None = None,
    coordinator: str,
    bootstrap_servers: str,
    handler: Handler,
    consumers: int | None = None,
    until: StopWhen | None = None,
    max_concurrency: int = 16,
    session_timeout_ms: int = 10_000,
    capacity: int = 1,
    name: str = "spark",
    kafka_config: Mapping[str, str] | None = None,
    coordinator_tls: ClientTls | None = None,
    connect_timeout_ms: int | None = None,
    auth_token: str | None = None,
    topic_pattern: str | None = None,
    fetch_failure_timeout_ms: int | None = None,
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
) -> list[TaskReport]:
    """Run `consumers` tasks (default: one per task slot), each a member of `group` calling
    `handler(record)` (an aiokafka ConsumerRecord; sync or async) per record, keys in order.

    Blocks until every task met `until`, and returns one `TaskReport` per task (the last
    attempt's, when Spark retried a task whose executor was lost). `handler` is pickled to
    the executors: a module-level function of an importable module is the safe choice.
    `coordinator_tls` files must exist at the same paths on every executor.
    `connect_timeout_ms`: how long a task's coordinator or Kafka may stay unreachable
    before the task fails (None: retry, warning at once and then every 30 s);
    `connect_timeout_s` (seconds) is its deprecated name. `auth_token`: the coordinator's
    `--auth-token`, if it has one. `topic_pattern` instead of `topics`: every topic whose
    name matches it, as `CoordinatedConsumer`'s. `fetch_failure_timeout_ms`: a task that
    has read nothing from Kafka for this long (Kafka unreachable from its executor alone)
    hands its ranges back to the other tasks and registers again once Kafka answers
    (None: its session timeout; docs/protocol.md §7.6). `max_buffer_bytes`: each task's
    memory budget in record bytes (`CoordinatedConsumer`'s): an executor holds about this
    much per task slot, plus the Python worker's own memory.
    """
    if topic_pattern is not None:
        if topics:
            raise ValueError("give topics or topic_pattern, not both")
    elif not topics or any(not t for t in topics):
        raise ValueError(f"topics must name at least one topic, got {topics!r}")
    if not group:
        raise ValueError("group must not be empty")
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {handler!r}")
    if connect_timeout_ms is not None and connect_timeout_ms <= 0:
        raise ValueError(f"connect_timeout_ms must be > 0, got {connect_timeout_ms}")
    if max_buffer_bytes < MIN_BUFFER_BYTES:
        raise ValueError(f"max_buffer_bytes must be >= {MIN_BUFFER_BYTES}, got {max_buffer_bytes}")
    slots = task_slots(spark)
    count = slots if consumers is None else consumers
    if count < 1:
        raise ValueError(f"consumers must be >= 1, got {count}")
    dynamic = spark.sparkContext.getConf().get("spark.dynamicAllocation.enabled", "false")
    if count > slots and dynamic != "true":
        raise ValueError(
            f"{count} consumers need {count} concurrent task slots but this application has "
            f"{slots}: each consumer task runs until it stops, so the rest would never start "
            f"(use more executors/cores, e.g. --master local[{count}], or fewer consumers)"
        )
    _probe(coordinator, "coordinator")
    _probe(bootstrap_servers, "Kafka bootstrap server")
    KafkaSettings.parse(kafka_config)  # a bad setting fails here, not in every task
    settings = ConsumerSettings(
        group=group,
        topics=list(topics or []),
        coordinator=coordinator,
        bootstrap_servers=bootstrap_servers,
        until=until or StopWhen(),
        name=name,
        max_concurrency=max_concurrency,
        session_timeout_ms=session_timeout_ms,
        capacity=capacity,
        kafka_config=dict(kafka_config or {}),
        coordinator_tls=coordinator_tls,
        connect_timeout_ms=connect_timeout_ms,
        auth_token=auth_token,
        topic_pattern=topic_pattern,
        fetch_failure_timeout_ms=fetch_failure_timeout_ms,
        max_buffer_bytes=max_buffer_bytes,
    )
    sc = spark.sparkContext
    sc.setJobGroup(f"keyshard-{group}", f"keyshard consumers of {group}", interruptOnCancel=True)
    rdd = sc.parallelize(range(count), count).mapPartitions(_task(settings, handler))
    return sorted(rdd.collect(), key=lambda s: s.task)


# ---- command line ------------------------------------------------------------------------


def load_handler(spec: str) -> Handler:
    """`package.module:function` → the function (the form `--handler` takes)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--handler {spec!r} is not module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--handler {spec!r}: cannot import {module_name}: {err}") from err
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ValueError(f"--handler {spec!r}: {module_name} has no function {attr}")
    return handler  # type: ignore[no-any-return]


#: Flags in seconds renamed to milliseconds, still taken for one release: old -> new.
RENAMED_FLAGS = {
    "--max-seconds": "--max-ms",
    "--idle-seconds": "--idle-ms",
    "--connect-timeout-s": "--connect-timeout-ms",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="keyshard.spark_jobs.executors",
        description="Run Spark tasks as keyshard coordinated consumers of a group.",
    )
    p.add_argument("--group", required=True)
    subscription = p.add_mutually_exclusive_group(required=True)
    subscription.add_argument("--topics", help="comma-separated")
    subscription.add_argument("--topic-pattern", help="every topic whose name matches (regex)")
    p.add_argument("--coordinator", required=True, help="host:port[,host:port...]")
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--handler", required=True, help="module:function called once per record")
    p.add_argument("--consumers", type=int, default=None, help="default: one per task slot")
    p.add_argument("--max-ms", type=int, default=None, help="a task leaves after this long")
    p.add_argument(
        "--idle-ms", type=int, default=None, help="a task leaves after no record for this long"
    )
    p.add_argument("--stop-file", default=None, help="a task leaves once this file exists")
    p.add_argument("--max-concurrency", type=int, default=16, help="keys in flight per task")
    p.add_argument(
        "--max-buffer-bytes",
        type=int,
        default=DEFAULT_MAX_BUFFER_BYTES,
        help="each task's memory budget: record bytes held at most (default: 64 MiB)",
    )
    p.add_argument("--session-timeout-ms", type=int, default=10_000)
    p.add_argument(
        "--fetch-failure-timeout-ms",
        type=int,
        default=None,
        help="a task that reads nothing from Kafka this long hands its keys to the others "
        "until Kafka answers again (default: the session timeout)",
    )
    p.add_argument(
        "--connect-timeout-ms",
        type=int,
        default=None,
        help="fail a task whose coordinator or Kafka stays unreachable this long "
        "(default: retry, warning at once and then every 30 s)",
    )
    for old, new in RENAMED_FLAGS.items():
        p.add_argument(old, type=float, default=None, help=f"deprecated: {new} in seconds")
    p.add_argument("--master", default=None, help="default: spark-submit's, else local[consumers]")
    p.add_argument("--stats", default=None, help="also write the per-task stats here (JSON)")
    p.add_argument(
        "--kafka-config", default=None,
        help="Kafka client settings, Java .properties format (security.protocol, sasl.*, ssl.*)",
    )  # fmt: skip
    p.add_argument(
        "--coordinator-tls-ca-file",
        default=None,
        help="the coordinator's channel runs TLS: the CA file that signed it",
    )
    p.add_argument(
        "--coordinator-tls-cert-file",
        default=None,
        help="mutual TLS: the consumers' certificate (same path on every executor)",
    )
    p.add_argument("--coordinator-tls-key-file", default=None, help="and its private key")
    p.add_argument(
        "--auth-token-file",
        default=os.environ.get("KEYSHARD_AUTH_TOKEN_FILE"),
        help="file holding the coordinator's --auth-token [env KEYSHARD_AUTH_TOKEN_FILE]",
    )
    p.add_argument(
        "--auth-token",
        default=os.environ.get("KEYSHARD_AUTH_TOKEN"),
        help="the coordinator's --auth-token (shows in ps: prefer the file or the "
        "variable) [env KEYSHARD_AUTH_TOKEN]",
    )
    return p


def tls_from_flags(args: argparse.Namespace) -> ClientTls | None:
    """The --coordinator-tls-* flags, their files read now (on the driver): a wrong path
    is an error naming the flag before any Spark task starts."""
    if not args.coordinator_tls_ca_file:
        if args.coordinator_tls_cert_file or args.coordinator_tls_key_file:
            raise ValueError("--coordinator-tls-ca-file is required with a client certificate")
        return None
    tls = ClientTls(
        args.coordinator_tls_ca_file, args.coordinator_tls_cert_file, args.coordinator_tls_key_file
    )
    tls.context(TlsNames(*(f"--coordinator-tls-{p}-file" for p in ("ca", "cert", "key"))))
    return tls


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for line in take_renamed_flags(args, RENAMED_FLAGS):
            print(f"{parser.prog}: warning: {line}", file=sys.stderr)
        handler = load_handler(args.handler)
        until = StopWhen(max_ms=args.max_ms, idle_ms=args.idle_ms, stop_file=args.stop_file)
        tls = tls_from_flags(args)  # TlsConfigError is a ValueError
        token, warning = secret_from(  # SecretFileError is a ValueError too
            args.auth_token, args.auth_token_file, flag="--auth-token",
            file_flag="--auth-token-file", env_value=os.environ.get("KEYSHARD_AUTH_TOKEN"),
        )  # fmt: skip
        if warning is not None:
            print(f"{parser.prog}: warning: {warning}", file=sys.stderr)
    except ValueError as err:
        parser.error(str(err))
    try:  # before paying for a JVM
        _probe(args.coordinator, "coordinator")
        _probe(args.bootstrap_servers, "Kafka bootstrap server")
    except (ValueError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spark = job_session("keyshard-executor-consumers", args.master, threads=args.consumers or 2)
    try:
        stats = run_executor_consumers(
            spark,
            group=args.group,
            topics=[t.strip() for t in args.topics.split(",")] if args.topics else None,
            topic_pattern=args.topic_pattern,
            coordinator=args.coordinator,
            bootstrap_servers=args.bootstrap_servers,
            handler=handler,
            consumers=args.consumers,
            until=until,
            max_concurrency=args.max_concurrency,
            max_buffer_bytes=args.max_buffer_bytes,
            session_timeout_ms=args.session_timeout_ms,
            fetch_failure_timeout_ms=args.fetch_failure_timeout_ms,
            kafka_config=load_properties(args.kafka_config) if args.kafka_config else None,
            coordinator_tls=tls,
            connect_timeout_ms=args.connect_timeout_ms,
            auth_token=token,
        )
    except (ValueError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    rows = [asdict(s) for s in stats]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.stats:
        with open(args.stats, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this `__main__` copy: functions shipped to the
    # executors must refer to `keyshard.spark_jobs.executors` (whose state handlers can
    # see), not be pickled by value from `__main__`.
    from keyshard.spark_jobs.executors import main as _main

    sys.exit(_main())
