"""`CoordinatedConsumer`: the lightweight consumer of docs/protocol.md, over aiokafka.

This class is the public API and the supervisor. Three activities run under it (`run`):
the *connector* (`_membership.connector`: find the coordinator, register, answer
Ping/StopFetcher/StartFetcher, notice a silent or lost coordinator), the *fetcher*
(`_datapath.fetcher`: one aiokafka consumer with manual assignment, its records filtered
by owned slots in `_datapath.dispatch`), and the *lanes* (`_datapath.lanes`: the user's
handler, per key). What the connector's requests do to the fetcher and the lanes is
`_datapath.hooks`, kept off the user's class. The data path is built whole once Kafka is
reached (`_datapath.assembly`); the membership, which outlives it, when the consumer is
made. The lost-connection procedure is docs/protocol.md's (§6.1, state LOST): stop every
fetcher, drop every queue, find the coordinator again, register again. Beside them a
watch (`_datapath.stand_aside`) hands the ranges back while Kafka cannot be read (§7.6).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import AbstractTokenProvider

from keyshard.consumer_client._datapath.assembly import DataPath, DataPathSettings
from keyshard.consumer_client._datapath.dead_letters import DeadLetters
from keyshard.consumer_client._datapath.hooks import ConsumerHooks
from keyshard.consumer_client._datapath.lanes import DEFAULT_RETRY, RetryPolicy
from keyshard.consumer_client._datapath.progress import ConsumerProgress
from keyshard.consumer_client._datapath.stand_aside import StandAside
from keyshard.consumer_client._datapath.stats import ConsumerStats
from keyshard.consumer_client._errors import ConsumerError
from keyshard.consumer_client._exactly_once.transactions import (
    ExactlyOnceHandler,
    TransactionalHooks,
    TransactionalWriter,
)
from keyshard.consumer_client._exactly_once.txn_log import DEFAULT_TOPIC as TXN_LOG_TOPIC
from keyshard.consumer_client._exactly_once.txn_log import TxnLog
from keyshard.consumer_client._membership.connector import Membership
from keyshard.consumer_client._membership.unreachable import Unreachable
from keyshard.consumer_client._operations.endpoints import ConsumerEndpoints
from keyshard.consumer_client._operations.metrics import (
    ConsumerMetrics,
    ConsumerSnapshot,
    DeadLetter,
)
from keyshard.consumer_client._operations.signals import (
    ConsumerAborted,
    GracefulSignals,
    signals_to_handle,
)
from keyshard.core.kafka.connect import KafkaUnreachable, start_client
from keyshard.core.kafka.fetch_sizes import (
    DEFAULT_MAX_BUFFER_BYTES,
    MIN_BUFFER_BYTES,
    fetch_sizes,
)
from keyshard.core.kafka.no_topic_creation import never_create_topics
from keyshard.core.kafka.settings import KafkaSettings
from keyshard.core.model.addresses import parse_host_ports
from keyshard.core.model.durations import renamed_seconds
from keyshard.core.model.hashing import ORDERING_KEY_HEADER
from keyshard.core.protocol.messages import MAX_CONSUMER_NAME, check_one_line
from keyshard.core.security.tls import ClientTls

log = logging.getLogger(__name__)

AsyncHandler = Callable[[Any], Awaitable[None]]
_T = TypeVar("_T")
CLIENT_STOP_TIMEOUT_S = 10.0
KAFKA_START_TIMEOUT_S = 30.0
#: Exactly-once: how often a member commits its transaction. Lower: outputs visible
#: sooner; higher: fewer commits per record (bench/README.md, exactly-once).
DEFAULT_TRANSACTION_INTERVAL_MS = 100
_TXID_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,100}")

#: Between attempts to start the Kafka client while Kafka cannot be reached.
KAFKA_RETRY_S = 1.0

__all__ = ["ConsumerAborted", "ConsumerError", "ConsumerStats", "CoordinatedConsumer"]


class CoordinatedConsumer:
    """A member of a keyshard group: consumes its share of the group's key-hash ranges,
    each key by one handler at a time, in offset order.

    Every duration is in milliseconds, as in Kafka's settings. All arguments are keyword
    arguments.

    Args:
        group (str): the group's name. Members of one group share its topics' keys; the
            group's low-watermark positions are also committed to Kafka under this id, so
            lag shows in the usual tools.
        topics (list[str]): the topics to consume; at least one.
        topic_pattern (str): instead of `topics`: a regular expression (Python's `re`); the
            group consumes every topic whose whole name matches it, topics created later
            included (internal ones, starting with ``__``, never). Default: None.
        coordinator (str): ``HOST:PORT`` of the coordinator's consumer port (7171 by
            default), or several, comma-separated (the replicas of a coordinator set: any
            one names the replica that serves the group). Not the admin (HTTP) port.
        bootstrap_servers (str): Kafka's ``host:port`` list. Default: ``bootstrap.servers``
            of `kafka_config`.
        kafka_config (Mapping[str, str] | KafkaSettings): Kafka client settings in Kafka's
            own names (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``,
            ``isolation.level``, ...), checked when the consumer is made. Default: none
            (plaintext, ``read_committed``).
        kafka_token_provider (AbstractTokenProvider): aiokafka's token provider for
            ``sasl.mechanism=OAUTHBEARER``. Default: None.
        name (str): this member's name in the coordinator's views and in log lines.
            Default: ``"consumer"``.
        max_concurrency (int): records handled at once, each of a different key (per-key
            lanes); also the thread pool of `run_sync`. Default: 64.
        session_timeout_ms (int): the lease. A member that hears nothing from a
            coordinator for this long stops processing; a coordinator gives a silent
            member's ranges to others only after it (plus a margin), so no key ever has
            two owners. Shorter: a crashed member's keys move sooner; longer: pauses
            (GC, a slow network) are survived. 1000..300000. Default: 10000.
        fetch_failure_timeout_ms (int): when no partition this member fetches has been
            read from Kafka for this long (Kafka unreachable from this process alone), it
            hands its ranges back with exact positions and registers again once Kafka
            answers; /readyz says 503 meanwhile. At least 1000. Default: the session
            timeout.
        capacity (int): this member's weight in the assignment (a member of capacity 2
            gets about twice the slots of one of capacity 1). 1..100000. Default: 1.
        auth_token (str): this consumer's credentials, sent at registration: the shared
            ``--auth-token``, a per-principal token of ``--auth-tokens-file``, or a JWT
            (``--jwt-jwks-url``). Default: None (a client certificate, or nothing).
        coordinator_tls (ClientTls): TLS for the coordinator's channel, when it runs TLS
            (``--tls-cert-file``). Default: None (plain TCP).
        dead_letter_topic (str): where a record goes once its handler failed
            `retry.max_attempts` times, so its key moves on. Default: None (retried until
            it succeeds; its key waits meanwhile).
        retry (RetryPolicy): how a failing record is retried. Default: `RetryPolicy()`
            (50 ms doubling up to 5000 ms, 5 attempts).
        ordering_header (str): the record header whose value is the ordering key, when
            present (otherwise the record key). Default: ``"ordering-key"``.
        max_buffer_bytes (int): the memory budget: record bytes (key + value + headers)
            this consumer holds at most, counting records fetched and waiting for their
            turn, records in flight (queued behind their key or running) and the replay
            windows. Fetching pauses while it is used up and resumes as handlers complete;
            the replay windows give way first. A record larger than the whole budget is
            still processed (past the budget), with a WARNING. Kafka's ``fetch.max.bytes`` and
            ``max.partition.fetch.bytes`` follow it (a quarter of it, and a sixteenth up
            to 1 MiB) unless `kafka_config` sets them. The process needs about this much
            memory plus ~100 MiB (docs/operations/kubernetes.md). At least 65536.
            Default: 67108864 (64 MiB).
        max_pending (int): records dispatched and not yet acknowledged, at most; fetching
            pauses at this many. A second bound beside `max_buffer_bytes`, on the count:
            it bounds the per-record bookkeeping (which small records make weigh more
            than their bytes) and the work a crash repeats. Default:
            ``max(1000, 16 * max_concurrency)``.
        drain_timeout_ms (int): how long `close()` waits for handlers in flight before it
            leaves the group anyway (the next owners then process those records again).
            Default: 30000.
        fetch_max_wait_ms (int): Kafka's ``fetch.max.wait.ms``: how long a fetch waits
            for records. Some brokers (Tansu) hold a fetch for about half of it even when
            records are waiting, so it bounds delivery latency there. Default: 100.
        replay_window (int): records held per partition so that a range granted a little
            behind the fetch position is replayed from memory rather than fetched again
            (broker egress), within what `max_buffer_bytes` leaves. 0 turns it off.
            Default: 10000.
        handle_signals (bool): SIGTERM and SIGINT close gracefully (drain, then leave with
            exact positions), a second one aborts. Taken only in the main thread, and each
            only when the app has no handler of its own for it (an ignored signal is not
            one); a signal left alone is said in one INFO log line. Default: True.
        connect_timeout_ms (int): how long the coordinator or Kafka may stay unreachable
            before `run()` raises `ConsumerError`. Default: None (retry forever, warning
            at once and then every 30 s, as a pod waiting for its coordinator should).
        metrics_listen (str): ``HOST:PORT`` to serve ``/healthz``, ``/readyz`` and
            ``/metrics`` (Prometheus) on while `run()` runs. Default: None (not served).
        transactional_id_prefix (str): exactly-once read-process-write: the prefix of
            this member's Kafka transactional ids (1..100 of ``A-Z a-z 0-9 . _ -``);
            run with `run_exactly_once`. Default: None.
        transaction_interval_ms (int): exactly-once: how often the transaction commits.
            Lower: outputs visible sooner; higher: fewer commits per record. 1..30000.
            Default: 100.
        transaction_log_topic (str): exactly-once: the topic recording which
            transactional id held which slots. Default: ``"__keyshard_transactions"``.

    Deprecated (one release): ``drain_timeout_s`` and ``connect_timeout_s``, the same in
    seconds; passing one warns (`DeprecationWarning`), passing it with its new name is a
    `TypeError`.
    """

    @renamed_seconds(drain_timeout_s="drain_timeout_ms", connect_timeout_s="connect_timeout_ms")
    def __init__(
        self,
        *,
        group: str,
        topics: list[str] | None = None,
        topic_pattern: str | None = None,
        coordinator: str,
        bootstrap_servers: str | None = None,
        kafka_config: Mapping[str, str] | KafkaSettings | None = None,
        kafka_token_provider: AbstractTokenProvider | None = None,
        name: str = "consumer",
        max_concurrency: int = 64,
        session_timeout_ms: int = 10_000,
        fetch_failure_timeout_ms: int | None = None,
        capacity: int = 1,
        auth_token: str | None = None,
        coordinator_tls: ClientTls | None = None,
        dead_letter_topic: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        ordering_header: str = ORDERING_KEY_HEADER,
        max_pending: int | None = None,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
        drain_timeout_ms: int = 30_000,
        fetch_max_wait_ms: int = 100,
        replay_window: int = 10_000,
        handle_signals: bool = True,
        connect_timeout_ms: int | None = None,
        metrics_listen: str | None = None,
        transactional_id_prefix: str | None = None,
        transaction_interval_ms: int = DEFAULT_TRANSACTION_INTERVAL_MS,
        transaction_log_topic: str = TXN_LOG_TOPIC,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if not 1000 <= session_timeout_ms <= 300_000:
            raise ValueError(f"session_timeout_ms={session_timeout_ms} is outside 1000..300000")
        if fetch_failure_timeout_ms is not None and fetch_failure_timeout_ms < 1000:
            raise ValueError(f"fetch_failure_timeout_ms={fetch_failure_timeout_ms} is below 1000")
        if not 1 <= capacity <= 100_000:
            raise ValueError(f"capacity={capacity} is outside 1..100000")
        if not 1 <= len(name) <= MAX_CONSUMER_NAME:
            raise ValueError(f"name must be 1..{MAX_CONSUMER_NAME} characters, got {len(name)}")
        check_one_line(name)  # a ValueError naming the character
        if max_buffer_bytes < MIN_BUFFER_BYTES:
            raise ValueError(f"max_buffer_bytes={max_buffer_bytes} is below {MIN_BUFFER_BYTES}")
        if replay_window < 0:
            raise ValueError(f"replay_window={replay_window} must be >= 0 (0 turns it off)")
        if drain_timeout_ms < 0:
            raise ValueError(f"drain_timeout_ms={drain_timeout_ms} must be >= 0")
        if transactional_id_prefix is not None and not _TXID_PREFIX.fullmatch(
            transactional_id_prefix
        ):
            raise ValueError(
                f"transactional_id_prefix={transactional_id_prefix!r} must be 1..100 of "
                "A-Z a-z 0-9 . _ -"
            )
        if not 1 <= transaction_interval_ms <= 30_000:
            raise ValueError(
                f"transaction_interval_ms={transaction_interval_ms} is outside 1..30000"
            )
        try:
            coordinators = parse_host_ports(coordinator)
        except ValueError as err:
            raise ValueError(f"coordinator address {err}") from None
        # Kafka's own setting names (security.protocol, sasl.*, ssl.*, ...), checked now:
        # a bad file or a contradiction is a KafkaConfigError (a ValueError) here, not a
        # failed fetch later.
        self.kafka = (
            kafka_config
            if isinstance(kafka_config, KafkaSettings)
            else KafkaSettings.parse(kafka_config, token_provider=kafka_token_provider)
        )
        self.group = group
        self.topics = list(topics or [])
        self.topic_pattern = topic_pattern
        self.coordinators = coordinators
        self.bootstrap_servers = self.kafka.with_bootstrap(bootstrap_servers)
        self.name = name
        self.max_concurrency = max_concurrency
        self.session_timeout_ms = session_timeout_ms
        self.fetch_failure_timeout_ms = fetch_failure_timeout_ms or session_timeout_ms
        self.capacity = capacity
        self.auth_token = auth_token
        self.dead_letter_topic = dead_letter_topic
        self.retry = retry
        self.ordering_header = ordering_header
        self.max_pending = max_pending or max(1000, 16 * max_concurrency)
        self.max_buffer_bytes = max_buffer_bytes
        self.drain_timeout_ms = drain_timeout_ms
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.replay_window = replay_window
        self.handle_signals = handle_signals
        self.connect_timeout_ms = connect_timeout_ms
        self.transactional_id_prefix = transactional_id_prefix
        self.transaction_interval_ms = transaction_interval_ms
        self.transaction_log_topic = transaction_log_topic
        self.progress = ConsumerProgress()
        self.stats = ConsumerStats()
        self._settings = DataPathSettings(
            name=name,
            max_concurrency=max_concurrency,
            max_pending=self.max_pending,
            max_buffer_bytes=max_buffer_bytes,
            replay_window=replay_window,
            ordering_header=ordering_header,
            retry=retry,
            read_committed=self.kafka.isolation_level == "read_committed",
        )
        # Made now: a missing or bad TLS file is a TlsConfigError here, not when running.
        self._membership = Membership(
            group=group,
            topics=self.topics,
            coordinators=self.coordinators,
            name=name,
            session_timeout_ms=session_timeout_ms,
            capacity=capacity,
            auth_token=auth_token,
            tls=coordinator_tls,
            connect_timeout_ms=connect_timeout_ms,
            topic_pattern=topic_pattern,
        )
        # What `run` is made of once Kafka is reached (None before, and when it did not).
        self._running: _Running | None = None
        self._kafka_unreachable = Unreachable(log, "Kafka", connect_timeout_ms=connect_timeout_ms)
        self.metrics: ConsumerMetrics | None = None
        self.endpoints: ConsumerEndpoints | None = None
        if metrics_listen is not None:
            self.metrics = ConsumerMetrics()
            self.metrics.prime(self.topics)
            self.endpoints = ConsumerEndpoints(
                self.metrics, self.snapshot, session_timeout_ms, metrics_listen
            )
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- public API -----------------------------------------------------------------

    async def __aenter__(self) -> CoordinatedConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, handler: AsyncHandler) -> None:
        """Consume until `close()` (or `request_stop()`, or SIGTERM/SIGINT); a normal
        return acknowledges. A second signal during the graceful close raises
        `ConsumerAborted`."""
        if self.transactional_id_prefix is not None:
            raise ValueError(
                "this consumer has a transactional_id_prefix: run it with run_exactly_once"
            )
        await self._serve(handler, None)

    async def run_exactly_once(self, handler: ExactlyOnceHandler) -> None:
        """Exactly-once read-process-write: `await handler(record, outputs)`, where every
        `outputs.send(topic, value, key=...)` is committed in one Kafka transaction with
        the position of `record`, or not at all (docs/protocol.md §13). Needs
        `transactional_id_prefix` and a broker with transactions (Apache Kafka). Signals
        as for `run`."""
        if self.transactional_id_prefix is None:
            raise ValueError("run_exactly_once needs transactional_id_prefix=...")
        writer = TransactionalWriter(
            progress=self.progress,
            txn_log=TxnLog(
                bootstrap=self.bootstrap_servers,
                kafka=self.kafka,
                topic=self.transaction_log_topic,
                group=self.group,
                prefix=self.transactional_id_prefix,
            ),
            bootstrap=self.bootstrap_servers,
            kafka=self.kafka,
            name=self.name,
            interval_ms=self.transaction_interval_ms,
            max_batch_bytes=self.max_buffer_bytes // 4,
        )
        await self._serve(writer.wrap(handler), writer)

    def run_sync(self, fn: Callable[[Any], None]) -> None:
        """Blocking variant for plain functions, run in a pool of `max_concurrency` threads."""
        pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix=self.name)

        async def call(record: Any) -> None:
            await asyncio.get_running_loop().run_in_executor(pool, fn, record)

        try:
            asyncio.run(self.run(call))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def request_stop(self) -> None:
        """Thread-safe: ask a running consumer to close gracefully."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_close)

    async def close(self) -> None:
        """Graceful: stop dispatching, let in-flight records finish, report exact positions
        in a Leave so the next owners start where this one stopped (no duplicates)."""
        if self._closing:
            await self._stopped.wait()
            return
        self._closing = True
        self._membership.member.begin_closing()
        running = self._running
        try:
            if running is not None:
                running.path.fetcher.closing = True
                self.progress.begin_stop(self.progress.owned)
                running.path.lanes.drop()
                await running.path.lanes.wait_idle(timeout=self.drain_timeout_ms / 1000)
                if running.writer is not None:
                    # Commit what is done and claim nothing more: the Leave reports
                    # committed positions only. A failed writer leaves no report (the
                    # coordinator keeps the committed positions it had).
                    try:
                        await running.writer.commit(releasing=running.writer.owned(), force=True)
                    except ConsumerError:
                        return
            await self._membership.leave(self.progress.positions())
        finally:
            self._stopped.set()

    def snapshot(self) -> ConsumerSnapshot:
        """What this consumer holds now (the endpoints take one a second, on the loop)."""
        running = self._running
        lanes = running.path.lanes if running is not None else None
        budget = running.path.fetcher.budget if running is not None else None
        return ConsumerSnapshot(
            taken=time.monotonic(),
            # A member riding through a coordinator failover keeps its member id (and
            # its ranges) while its lease lasts: still a member, as readiness should say.
            registered=self.member_id is not None,
            closing=self._closing,
            heard_ago=self._membership.heard_ago(),
            in_flight=len(lanes.in_flight()) if lanes is not None else 0,
            busy_lanes=len(lanes.busy_keys) if lanes is not None else 0,
            owned_slots=self.progress.owned.size,
            lag=running.path.fetcher.fetch_lag() if running is not None else {},
            unreadable_for=running.aside.unreadable_for() if running is not None else None,
            reads=self.stats.as_dict(),
            buffered=(
                {
                    "waiting": budget.waiting,
                    "in_flight": budget.in_flight,
                    "replay_window": budget.window,
                }
                if budget is not None
                else {}
            ),
            max_buffer_bytes=self.max_buffer_bytes,
            budget_pauses=budget.pauses if budget is not None else 0,
        )

    @property
    def owned_slots(self) -> list[tuple[int, int]]:
        return self.progress.owned.to_pairs()

    async def wait_registered(self, timeout: float) -> None:
        await asyncio.wait_for(self._membership.registered.wait(), timeout)

    @property
    def member_id(self) -> str | None:
        return self._membership.member.member_id

    @property
    def epoch(self) -> int:
        return self._membership.member.epoch

    # ---- supervision ----------------------------------------------------------------

    async def _serve(self, handler: AsyncHandler, writer: TransactionalWriter | None) -> None:
        """Signals and endpoints around `_run`."""
        loop = self._loop = asyncio.get_running_loop()
        aborted: asyncio.Future[None] = loop.create_future()
        signals = None
        choice = signals_to_handle(self.handle_signals)
        if (left := choice.explain()) is not None:
            log.info("%s: %s", self.name, left)
        if choice.take:
            signals = GracefulSignals(
                loop, self.name, close=self.request_stop, abort=lambda: _abort(aborted)
            )
            signals.install(choice.take)
        try:
            if self.endpoints is not None:
                await self.endpoints.start()
            await self._run(handler, writer, aborted)
        finally:
            if signals is not None:
                signals.remove()
            aborted.cancel()
            close_task = self._close_task
            if close_task is not None and not close_task.done():
                close_task.cancel()  # aborted mid-drain
                with contextlib.suppress(asyncio.CancelledError):
                    await close_task
            if self.endpoints is not None:
                await self.endpoints.stop()

    async def _run(
        self,
        handler: AsyncHandler,
        writer: TransactionalWriter | None,
        aborted: asyncio.Future[None],
    ) -> None:
        """Reach Kafka, build the data path on it, then let the connector, the fetcher and
        the writer run until one fails, a close completes or a second signal aborts."""
        dead_letters = None
        dead_letter: DeadLetter | None = None
        if self.dead_letter_topic:
            dead_letters = DeadLetters(
                self.bootstrap_servers, self.dead_letter_topic, self.kafka.client_options()
            )
            dead_letter = dead_letters.send
        if self.metrics is not None:
            handler = self.metrics.wrap(handler)
            if dead_letter is not None:
                dead_letter = self.metrics.wrap_dead_letter(dead_letter)
        try:
            kafka = await self._until_stopped(self._start_kafka(dead_letters, writer), aborted)
        except BaseException:  # refused (credentials, no transactions) or aborted
            await self._stop_clients(None, dead_letters, writer)
            raise
        if kafka is None or self._closing:  # stopped before (or as) Kafka was reached
            if kafka is not None:
                await _stop_quietly(kafka)
            await self._stop_clients(None, dead_letters, writer)
            return
        path = DataPath.build(
            handler, kafka, self.progress, self.stats, self._settings,
            session=self._session, dead_letter=dead_letter,
        )  # fmt: skip
        hooks = (
            ConsumerHooks(self.progress, path.fetcher, path.dispatcher)
            if writer is None
            else TransactionalHooks(writer, self.progress, path.fetcher, path.dispatcher)
        )
        aside = StandAside(
            path.fetcher, hooks, self._membership, timeout_s=self.fetch_failure_timeout_ms / 1000
        )
        running = self._running = _Running(path, writer, aside)
        connector = asyncio.create_task(self._membership.run(hooks), name=f"{self.name}-connector")
        watch = asyncio.create_task(aside.run(), name=f"{self.name}-stand-aside")
        path.fetcher.start()
        assert path.fetcher.failed is not None
        fetch_failed = path.fetcher.failed
        stopped: asyncio.Future[Any] = asyncio.create_task(self._stopped.wait())
        waits = {connector, fetch_failed, stopped, watch}
        if writer is not None:
            waits.add(writer.failed)
        try:
            done, _ = await asyncio.wait(waits | {aborted}, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                if finished is not stopped and finished.exception() is not None:
                    raise finished.exception()  # type: ignore[misc]
        finally:
            fetch_failed.cancel()
            tasks = [connector, watch, stopped, *path.fetcher.tasks()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._stop_clients(running, dead_letters, writer)

    async def _until_stopped(self, step: Awaitable[_T], aborted: asyncio.Future[None]) -> _T | None:
        """Run `step` unless a close or an abort comes first (a SIGTERM while Kafka is
        still being retried must not wait for Kafka): its result, or None when it was cut
        short."""
        running = asyncio.ensure_future(step)
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self._stopped.wait())
        waiters: set[asyncio.Future[Any]] = {running, stopped, aborted}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (running, stopped):
                if not task.done():
                    task.cancel()
            await asyncio.gather(running, stopped, return_exceptions=True)
        if aborted.done():
            aborted.result()  # raises ConsumerAborted
        if running.cancelled():
            return None
        return running.result()  # raises what the step raised

    async def _start_kafka(
        self, dead_letters: DeadLetters | None, writer: TransactionalWriter | None
    ) -> AIOKafkaConsumer:
        """The started Kafka consumer (and dead-letter and transactional producers),
        retried while Kafka cannot be reached (warned about at once, then every 30 s)
        until `connect_timeout_ms`; a lasting problem (bad credentials, TLS) is a
        `ConsumerError` at once."""
        while True:
            kafka = never_create_topics(
                AIOKafkaConsumer(
                    bootstrap_servers=self.bootstrap_servers,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    fetch_max_wait_ms=self.fetch_max_wait_ms,
                    **{**fetch_sizes(self.max_buffer_bytes), **self.kafka.consumer_options()},
                )
            )
            try:
                await start_client(
                    kafka, self.bootstrap_servers, self.kafka, "consumer", KAFKA_START_TIMEOUT_S
                )
                if dead_letters is not None:
                    await dead_letters.start()
                if writer is not None:
                    await writer.start()
            except KafkaUnreachable as err:
                # The consumer may have started before a later client failed: stop it.
                await _stop_quietly(kafka)
                if err.lasting:
                    raise ConsumerError(str(err)) from None
                # The diagnosis says "consumer: cannot reach Kafka at X: why": keep the why.
                detail = str(err).removeprefix("consumer: ")
                detail = detail.removeprefix(f"cannot reach Kafka at {self.bootstrap_servers}: ")
                self._kafka_unreachable.failed(self.bootstrap_servers, detail)
                await asyncio.sleep(KAFKA_RETRY_S)
                continue
            except BaseException:
                await _stop_quietly(kafka)
                raise
            self._kafka_unreachable.succeeded()
            return kafka

    def _begin_close(self) -> None:
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self.close())

    def _session(self) -> int:
        return self._membership.member.session

    async def _stop_clients(
        self,
        running: _Running | None,
        dead_letters: DeadLetters | None,
        writer: TransactionalWriter | None,
    ) -> None:
        if writer is not None:  # first: commits cut short from here on are no failure
            await writer.stop()
        for task in list(self._membership.tasks):
            task.cancel()
        if running is not None:
            await running.path.lanes.abort()
            await _stop_quietly(running.path.fetcher.kafka)
        if dead_letters is not None:
            await dead_letters.stop()
        if self._membership.channel is not None:
            await self._membership.channel.aclose()


@dataclass(frozen=True, slots=True)
class _Running:
    """What one `run` is made of, built once Kafka is reached."""

    path: DataPath
    writer: TransactionalWriter | None
    aside: StandAside


async def _stop_quietly(kafka: AIOKafkaConsumer) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(kafka.stop(), CLIENT_STOP_TIMEOUT_S)


def _abort(aborted: asyncio.Future[None]) -> None:
    if not aborted.done():
        aborted.set_exception(ConsumerAborted("aborted by a second signal during the drain"))
