"""The streaming side of the `keyshard` source: the query is one coordinated consumer.

    spark.readStream.format("keyshard").option("group", "g").option("topics", "t1,t2")
        .option("coordinator", "host:7171").option("bootstrap_servers", "host:9092").load()

Options: `group`, `topics` (or `topic_pattern`, a regular expression), `coordinator`,
`bootstrap_servers` (required); `auth_token_file` (a file holding the coordinator's
token), or `auth_token`, or the driver's KEYSHARD_AUTH_TOKEN;
`capacity` (default: Spark's default parallelism); `ranges` (Spark partitions per
topic-partition and batch, default: the capacity); `name`; `session_timeout_ms` (10000);
`connect_timeout_ms` (30000); `stall_timeout_ms` (30000); `ordering_header`;
`coordinator_tls_ca_file` (the coordinator's channel runs TLS), `coordinator_tls_cert_file`
and `coordinator_tls_key_file` (mutual TLS). Durations are in milliseconds; the names in
seconds, `connect_timeout_s` and `stall_timeout_s`, are taken for one release, with a
warning (`planning.parse_ms`).

**Who is the member.** The driver-side reader (Spark runs it in one long-lived Python
process per query) registers with the coordinator over the consumer protocol, through
`keyshard.consumer_client.Membership` — the same code as `CoordinatedConsumer` — in a
background thread with its own event loop, which also answers Pings on schedule.
Executors are not members: they read bounded slices planned by the driver.

**Offsets.** A Spark offset is a `StreamOffset` (`spark_jobs.offsets`): per
topic-partition a range position map of what the query has planned, plus the positions
of freshly granted ranges and the cut of the owned slots into Spark partitions. Each
micro-batch reads, for every owned slot, the records between the previous offset and the
partition's fetch high watermark; one Spark partition per (topic-partition x piece of
the owned slots), read in offset order, so per-key order holds inside each task.

**Commits and handoffs.** `commit(end)` — and `latestOffset(start)`, which Spark calls only
once `start`'s batch is in its commit log — mark batches committed; Ping replies report
the committed positions of the owned ranges. On StopFetcher the ranges leave the plan at
once, and the reply (with the committed positions) waits until the last batch that
covered them is committed: the next owner starts exactly after what this query wrote.
StartFetcher adds the ranges from the positions handed over. A batch must finish within
the coordinator's drain deadline, or the member is fenced (and its ranges move from the
last reported positions: duplicates, never loss).

**Restart from the checkpoint: what is true.** Spark's checkpoint says what this query
wrote to its sink (Spark re-runs a batch that was planned but not committed — re-planned
from its logged offsets alone, so the idempotent sink absorbs it). The coordinator's
positions say what the *group* processed: they can be behind the checkpoint (our last
reports were lost when the query stopped) or ahead of it (another member processed
ranges meanwhile); they never claim less than was reported, because the coordinator
merges reports by union. A restarted query registers as a new member and may get
different ranges. For every granted slot it starts from the *union* of the checkpoint
and the handed-over position: nothing below that was left unprocessed (each part is
done either in our sink or by another member), and nothing above it is skipped. Slots
it does not own keep their checkpointed value in every new offset, so regaining a range
later never forgets what this query already wrote.

**Topics that change.** Every StartFetcher lists the group's partitions: a partition
added to a topic (or a topic created that matches `topic_pattern`) is probed from the
grant that lists it on, so the next micro-batch plans it from its first offset; a
partition that left the group is planned no more.

**Limits.** No admission control (each batch reads up to the high watermark); no
per-slot load reports (the load-aware assignor sees an unmeasured member); while a topic
is in transition after it grew, a micro-batch may run a key's records of two partitions
in two tasks at once (each task reads one partition in offset order): the order rule of
docs/user-guide/topics.md holds for coordinated consumers (executor consumers included),
not across the tasks of one micro-batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from keyshard.consumer_client import Membership, PingReport, TopicsChange
from keyshard.core.model.addresses import parse_host_ports
from keyshard.core.model.positions import PositionUpdate, TopicPartition
from keyshard.core.model.ranges import RangeSet
from keyshard.core.protocol.messages import HighWatermark
from keyshard.spark_jobs.kafka_io import (
    SparkKafka,
    make_consumer,
    probe_high_watermarks,
    start_consumer,
    topic_partitions,
)
from keyshard.spark_jobs.offsets import StreamOffset, next_offset, plan_stream
from keyshard.spark_jobs.planning import (
    SourceError,
    parse_auth_token,
    parse_coordinator_tls,
    parse_int,
    parse_ms,
    parse_topics,
    require,
)
from keyshard.spark_jobs.reading import ReadSettings, SlicePartition, arrow_batches
from keyshard.spark_jobs.stream_state import SourceState

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)
T = TypeVar("T")


class StreamSettings:
    def __init__(self, options: Mapping[str, str], default_parallelism: int) -> None:
        self.group = require(options, "group")
        # `topics`, or `topic_pattern`: every topic whose name matches, those created
        # later included (the coordinator resolves it; grants list the partitions).
        self.topic_pattern = options.get("topic_pattern")
        if self.topic_pattern is not None and "topics" in options:
            raise SourceError("give option 'topics' or 'topic_pattern', not both")
        self.topics = [] if self.topic_pattern is not None else parse_topics(options)
        self.coordinator = require(options, "coordinator")
        try:
            self.coordinators = parse_host_ports(self.coordinator)
        except ValueError as err:
            raise SourceError(f"option 'coordinator': coordinator address {err}") from None
        self.kafka = SparkKafka.from_options(options)
        self.auth_token = parse_auth_token(options)
        self.coordinator_tls = parse_coordinator_tls(options)
        self.capacity = parse_int(options, "capacity", default_parallelism, 1, 100_000)
        self.pieces = parse_int(options, "ranges", self.capacity, 1, 65536)
        self.name = options.get("name", f"spark-{self.group}")
        self.session_timeout_ms = parse_int(options, "session_timeout_ms", 10_000, 1000, 300_000)
        # Seconds, as asyncio takes them.
        self.connect_timeout = parse_ms(options, "connect_timeout_ms", 30_000) / 1000


class MemberRuntime:
    """The member's event loop in a daemon thread: coordinator channel and watermark probe.

    Hooks run on that loop; Spark's calls run on the reader's thread. `lock` guards the
    shared `SourceState`.
    """

    def __init__(self, settings: StreamSettings) -> None:
        self.settings = settings
        self.state = SourceState()
        self.lock = threading.Lock()
        self.high_watermarks: dict[TopicPartition, int] = {}
        self.partitions: list[TopicPartition] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="member")
        self.membership: Membership | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.member_task: asyncio.Future[None] | None = None
        self._changed: asyncio.Event | None = None

    # ---- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()
        try:
            self.call(self._open(), self.settings.connect_timeout + 5)
        except BaseException:
            self.close()
            raise

    async def _open(self) -> None:
        s = self.settings
        self._changed = asyncio.Event()
        consumer = make_consumer(s.kafka, max_partition_fetch_bytes=64 * 1024)
        await start_consumer(consumer, s.kafka, s.connect_timeout)
        self.consumer = consumer
        if s.topics:
            self.partitions = await topic_partitions(s.kafka, s.topics, s.connect_timeout)
        ktps = [KafkaTP(*tp) for tp in self.partitions]
        ends = await asyncio.wait_for(consumer.end_offsets(ktps), s.connect_timeout)
        self.high_watermarks = {(k.topic, k.partition): int(v) for k, v in ends.items()}
        self.membership = Membership(
            group=s.group,
            topics=s.topics,
            topic_pattern=s.topic_pattern,
            coordinators=s.coordinators,
            name=s.name,
            session_timeout_ms=s.session_timeout_ms,
            capacity=s.capacity,
            auth_token=s.auth_token,
            tls=s.coordinator_tls,
        )
        self.member_task = asyncio.ensure_future(self.membership.run(self))
        registered = asyncio.ensure_future(self.membership.registered.wait())
        done, _ = await asyncio.wait(
            {self.member_task, registered},
            timeout=s.connect_timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
        registered.cancel()
        if self.member_task in done:
            self.member_task.result()  # raises the coordinator's refusal
        if not self.membership.registered.is_set():
            # The membership warned at the first failure already (addresses, error); not
            # given the timeout, so a later outage is ridden through, not fatal.
            raise SourceError(
                f"coordinator unreachable: no registration at {s.coordinator!r} within "
                f"{s.connect_timeout:g} s"
            )

    def close(self) -> None:
        """Leave with the committed positions, then stop the loop (best effort, bounded)."""
        if self.loop.is_running():
            with contextlib.suppress(Exception):
                self.call(self._close(), 15)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        if not self.loop.is_running():
            self.loop.close()

    async def _close(self) -> None:
        if self.membership is not None:
            with self.lock:
                positions = self.state.positions()
            await self.membership.leave(positions)
            await self.membership.aclose()
        if self.member_task is not None:
            self.member_task.cancel()
            await asyncio.gather(self.member_task, return_exceptions=True)
        if self.consumer is not None:
            await asyncio.wait_for(self.consumer.stop(), 10)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def check_alive(self) -> None:
        task = self.member_task
        if task is not None and task.done() and not task.cancelled():
            task.result()  # re-raises a fatal refusal (e.g. fenced for a bad token)

    def notify_committed(self) -> None:
        if self._changed is not None:
            self.loop.call_soon_threadsafe(self._changed.set)

    async def probe(self) -> dict[TopicPartition, int]:
        assert self.consumer is not None
        seek = {KafkaTP(*tp): self.high_watermarks.get(tp, 0) for tp in self.partitions}
        stable = self.settings.kafka.settings().isolation_level == "read_committed"
        fresh = await probe_high_watermarks(
            self.consumer, self.partitions, seek, self.settings.connect_timeout, stable=stable
        )
        for tp, offset in fresh.items():
            self.high_watermarks[tp] = max(offset, self.high_watermarks.get(tp, 0))
        return dict(self.high_watermarks)

    # ---- MemberHooks (on the loop) -------------------------------------------------------

    def ping_reply(self) -> PingReport:
        with self.lock:
            positions = self.state.positions()
        marks = [
            HighWatermark(topic=t, partition=p, offset=o)
            for (t, p), o in sorted(self.high_watermarks.items())
        ]
        return PingReport(positions, high_watermarks=marks)

    def start_fetcher(self, slots: RangeSet, positions: PositionUpdate) -> None:
        with self.lock:
            self.state.start(slots, positions)
            # Every grant lists the group's partitions: one added to a topic (or a topic
            # that matches the pattern) is probed, so the next micro-batch plans it.
            self.partitions += sorted(tp for tp in positions if tp not in self.partitions)

    def topics_changed(self, change: TopicsChange) -> None:
        """Partitions that left the group are planned no more. (Transitions need nothing
        here: a micro-batch reads each partition apart, see the module docstring.)"""
        with self.lock:
            gone = set(change.dropped)
            self.partitions = [tp for tp in self.partitions if tp not in gone]
            for tp in gone:
                self.high_watermarks.pop(tp, None)

    def held(self) -> tuple[RangeSet, PositionUpdate]:
        """The ranges this query runs and the positions of its committed batches: what it
        claims after losing the coordinator."""
        with self.lock:
            return self.state.owned, self.state.positions()

    def stop_fetcher(self, slots: RangeSet) -> Awaitable[PositionUpdate]:
        with self.lock:
            self.state.begin_stop(slots)
        return self._drained(slots)

    async def _drained(self, slots: RangeSet) -> PositionUpdate:
        assert self._changed is not None
        while True:
            self._changed.clear()
            with self.lock:
                if self.state.stop_ready(slots):
                    return self.state.finish_stop(slots)
            await self._changed.wait()

    async def session_lost(self) -> None:
        with self.lock:
            self.state.clear()


def leave_on_sigterm() -> None:
    """Spark stops a query by sending SIGTERM to the reader's process. As `SystemExit`, it
    unwinds Spark's runner loop into its `finally: reader.stop()`, so the member leaves
    with exact positions instead of being found lost a session timeout later (which would
    hold its ranges back from a restarted query). Only where nobody chose a handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the Leave
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)


class KeyshardStreamReader(DataSourceStreamReader):
    """Spark's side. Spark builds this reader in several processes (the planner ships
    `read` to executors inside it), so the member starts lazily, on the first offset call,
    and is never pickled."""

    def __init__(self, options: Mapping[str, str], default_parallelism: int) -> None:
        self.settings = StreamSettings(options, default_parallelism)
        self.read_settings = ReadSettings(options)
        self._runtime: MemberRuntime | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "read_settings": self.read_settings, "_runtime": None}

    def runtime(self) -> MemberRuntime:
        if self._runtime is None:
            runtime = MemberRuntime(self.settings)
            runtime.start()
            leave_on_sigterm()
            self._runtime = runtime
        self._runtime.check_alive()
        return self._runtime

    def initialOffset(self) -> dict[str, Any]:
        self.runtime()
        return StreamOffset().to_json()

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        runtime = self.runtime()
        begin = StreamOffset.from_json(start)
        with runtime.lock:
            runtime.state.committed_offset(begin)
        runtime.notify_committed()
        high = runtime.call(runtime.probe(), self.settings.connect_timeout + 5)
        with runtime.lock:
            end = next_offset(begin, runtime.state.active(), high, self.settings.pieces)
            if end == begin:
                return start
            runtime.state.planned_offset(end)
        return end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = StreamOffset.from_json(start), StreamOffset.from_json(end)
        runtime = self.runtime()
        with runtime.lock:
            runtime.state.planned_offset(finish)
        return [SlicePartition(piece) for piece in plan_stream(begin, finish)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SlicePartition):
            return iter(())  # Spark's stand-in partition when nothing was planned
        return arrow_batches(partition.piece, self.read_settings)

    def commit(self, end: dict[str, Any]) -> None:
        runtime = self.runtime()
        with runtime.lock:
            runtime.state.committed_offset(StreamOffset.from_json(end))
        runtime.notify_committed()

    def stop(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None
