"""`keyshard worker module:function`: a handler run as a coordinated consumer.

What uvicorn is to `module:app`, this is to a record handler: an application team writes
one function (async, or a plain one that then runs in a pool of `--max-concurrency`
threads) and gets a production consumer process — flags and KEYSHARD_* variables,
logging configured (plain or JSON lines, on stdout), graceful SIGTERM (drain, Leave with
exact positions) and a second signal to abort, `/healthz` `/readyz` `/metrics` with
`--metrics-listen`, and warnings instead of a silent wait when something is unreachable.

Exit status: 0 after a graceful stop; 1 with one line on stderr when the coordinator or
Kafka refuses the worker for good (unknown topic, wrong token, bad credentials, nothing
reachable within --connect-timeout-ms); 2 with one line for bad flags or a bad
MODULE:FUNCTION (one that fails to import included: its error, file and line); 130 when
a second signal aborted the drain. A deprecated flag (`RENAMED_FLAGS`) still works, with
one line on stderr naming its replacement.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from keyshard.cli.flag_values import env_variable
from keyshard.cli.secret_flags import take_secret
from keyshard.consumer_client import (
    ClientTls,
    ConsumerAborted,
    ConsumerError,
    CoordinatedConsumer,
    RetryPolicy,
)
from keyshard.core.kafka.settings import (
    KafkaConfigError,
    KafkaSettings,
    from_environment,
    load_properties,
)
from keyshard.core.model import durations
from keyshard.core.security.log_safety import PrintableMessages
from keyshard.core.security.tls import TlsConfigError

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_ABORTED = 130
#: Flags in seconds renamed to milliseconds, still taken for one release: old -> new.
RENAMED_FLAGS = {"--connect-timeout-s": "--connect-timeout-ms"}


class WorkerUsageError(ValueError):
    """A flag or the MODULE:FUNCTION cannot work: said in one line, exit status 2."""


def run_worker_command(args: argparse.Namespace) -> int:
    try:
        handler = load_handler(args.target)
        for line in take_renamed_flags(args):
            print(f"keyshard worker: warning: {line}", file=sys.stderr)
        take_secret(args, "auth_token", "--auth-token", command="worker")
        consumer = build_consumer(args, os.environ)
        configure_logging(args.log_format, args.log_level)
    except (WorkerUsageError, KafkaConfigError, TlsConfigError, ValueError) as err:
        print(f"keyshard worker: {err}", file=sys.stderr)
        return EXIT_USAGE
    _own_signals()
    log = logging.getLogger("keyshard.worker")
    reads = consumer.topic_pattern or ",".join(consumer.topics)
    log.info("worker %s: group %s, topics %s, coordinator %s", consumer.name, consumer.group,
             reads, args.coordinator)  # fmt: skip
    try:
        if inspect.iscoroutinefunction(handler):
            asyncio.run(_run_async(consumer, handler))
        else:
            consumer.run_sync(handler)
    except ConsumerAborted as err:
        print(f"keyshard worker: {err}", file=sys.stderr)
        return EXIT_ABORTED
    except ConsumerError as err:
        print(f"keyshard worker: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as err:  # e.g. --metrics-listen on a busy port
        print(f"keyshard worker: cannot start: {err}", file=sys.stderr)
        return EXIT_REFUSED
    log.info("worker %s stopped", consumer.name)
    return 0


def _own_signals() -> None:
    """The worker owns its process: SIGTERM and SIGINT are the consumer's (a graceful
    close, then an abort), whatever the launcher set (a shell starts a background job
    with SIGINT ignored) or the handler's module installed when it was imported."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


async def _run_async(consumer: CoordinatedConsumer, handler: Callable[..., Any]) -> None:
    async with consumer:
        await consumer.run(handler)


def load_handler(target: str) -> Callable[..., Any]:
    """`package.module:function` (attributes may be dotted: `module:obj.method`); the
    current directory is importable, as with uvicorn."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise WorkerUsageError(f"{target!r} is not MODULE:FUNCTION (e.g. myapp.handlers:handle)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as err:  # not only ImportError: the module's own code runs here
        raise WorkerUsageError(
            f"cannot import {module_name}: {import_failure(err, module_name)}"
        ) from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise WorkerUsageError(f"{target!r}: {module_name} has no attribute {attr}")
        found = getattr(found, part)
    if not callable(found):
        raise WorkerUsageError(f"{target!r}: {attr} is not a function")
    return found  # type: ignore[no-any-return]


def import_failure(err: Exception, module_name: str) -> str:
    """What went wrong importing the handler's module, in one line: the error and where it
    happened (file and line), and for a package that is not found at all, where Python
    looked for it."""
    if isinstance(err, SyntaxError):  # its own file and line: the module never ran
        where = f" ({_shown(err.filename)}, line {err.lineno})" if err.filename else ""
        return f"{type(err).__name__}: {err.msg}{where}"
    if isinstance(err, ModuleNotFoundError) and err.name == module_name.split(".")[0]:
        path = os.environ.get("PYTHONPATH") or "not set"
        return (
            f"{type(err).__name__}: {err} (looked in the working directory {os.getcwd()} "
            f"and PYTHONPATH ({path}): run from the folder that holds {err.name}, or add "
            "that folder to PYTHONPATH)"
        )
    # Where it was raised, below the import machinery (the first frame is the caller's).
    machinery = os.path.dirname(importlib.__file__)
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)[1:]
        if not f.filename.startswith(("<", machinery))
    ]
    where = f" ({_shown(frames[-1].filename)}, line {frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {' '.join(str(err).split())}{where}"  # one line


def _shown(path: str) -> str:
    """A file under the working directory by its relative path, others in full."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def take_renamed_flags(args: argparse.Namespace) -> list[str]:
    """Each deprecated flag given (on the command line or by its variable) becomes its new
    flag, in milliseconds; returns the warnings to print, a line each. A setting given
    under both names is a `WorkerUsageError`."""
    try:
        return durations.take_renamed_flags(
            args, RENAMED_FLAGS, lambda flag: f"{flag} ({env_variable(flag)})"
        )
    except ValueError as err:
        raise WorkerUsageError(str(err)) from None


def build_consumer(args: argparse.Namespace, environ: Mapping[str, str]) -> CoordinatedConsumer:
    """The consumer the flags describe (deprecated flags already taken by
    `take_renamed_flags`); a missing or contradictory one raises a ValueError naming the
    flag (and its variable)."""
    if not args.group:
        raise WorkerUsageError("--group (KEYSHARD_GROUP) is required")
    topics = [t.strip() for t in (args.topics or "").split(",") if t.strip()]
    pattern = args.topic_pattern or None
    if topics and pattern:
        raise WorkerUsageError(
            "--topics (KEYSHARD_TOPICS) and --topic-pattern (KEYSHARD_TOPIC_PATTERN): give one"
        )
    if not topics and not pattern:
        raise WorkerUsageError(
            "--topics (KEYSHARD_TOPICS) is required: comma-separated topics (or "
            "--topic-pattern, KEYSHARD_TOPIC_PATTERN: a regular expression)"
        )
    if args.log_format not in ("plain", "json"):
        raise WorkerUsageError(f"--log-format {args.log_format!r}: plain or json")
    from_file = load_properties(args.kafka_config) if args.kafka_config else {}
    kafka = KafkaSettings.parse({**from_file, **from_environment(environ)})
    bootstrap = args.bootstrap_servers or kafka.bootstrap_servers
    if not bootstrap:
        raise WorkerUsageError(
            "no Kafka: give --bootstrap-servers (KEYSHARD_BOOTSTRAP_SERVERS) or "
            "bootstrap.servers in --kafka-config"
        )
    metrics = ":".join(map(str, args.metrics_listen)) if args.metrics_listen else None
    return CoordinatedConsumer(
        group=args.group,
        topics=topics,
        topic_pattern=pattern,
        coordinator=args.coordinator,
        bootstrap_servers=bootstrap,
        kafka_config=kafka,
        name=args.name or socket.gethostname(),
        max_concurrency=int(args.max_concurrency),
        max_buffer_bytes=int(args.max_buffer_bytes),
        session_timeout_ms=int(args.session_timeout_ms),
        fetch_failure_timeout_ms=args.fetch_failure_timeout_ms,
        capacity=int(args.capacity),
        auth_token=args.auth_token,
        coordinator_tls=_tls(args),
        dead_letter_topic=args.dead_letter_topic,
        retry=RetryPolicy(
            initial_backoff_ms=int(args.retry_initial_backoff_ms),
            max_backoff_ms=int(args.retry_max_backoff_ms),
            max_attempts=int(args.retry_max_attempts),
        ),
        drain_timeout_ms=int(args.drain_timeout_ms),
        connect_timeout_ms=args.connect_timeout_ms,
        metrics_listen=metrics,
    )


def _tls(args: argparse.Namespace) -> ClientTls | None:
    ca, cert, key = (
        args.coordinator_tls_ca_file, args.coordinator_tls_cert_file,
        args.coordinator_tls_key_file,
    )  # fmt: skip
    if ca is None and cert is None and key is None:
        return None
    if ca is None:
        raise WorkerUsageError("--coordinator-tls-cert-file needs --coordinator-tls-ca-file")
    return ClientTls(ca_file=ca, cert_file=cert, key_file=key)


# ---- logging --------------------------------------------------------------------------


class JsonLines(logging.Formatter):
    """One JSON object per line, for log collectors that parse fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(log_format: str, level: str) -> None:
    """Log lines on stdout (stderr is kept for the one line of a fatal refusal)."""
    handler = logging.StreamHandler(sys.stdout)
    if log_format == "json":
        formatter: logging.Formatter = JsonLines()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    handler.addFilter(PrintableMessages())  # a record's text stays on its line
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO), handlers=[handler], force=True
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
