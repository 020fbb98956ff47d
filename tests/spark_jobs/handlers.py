"""Handlers the Spark executor-consumer tests ship to Python workers (must be importable
there, hence a module). Each run is logged in `keyshard.local.verify`'s JSON-lines format,
one file per worker process, so the tests check order and duplicates with `check()`."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from keyshard.core.model.hashing import slot_for_record
from keyshard.spark_jobs.executors import current_member

OUT_ENV = "KEYSHARD_TEST_OUT"
_lock = threading.Lock()
_out: IO[str] | None = None


def _file() -> IO[str]:
    global _out
    if _out is None:
        path = Path(os.environ[OUT_ENV]) / f"{os.getpid()}.jsonl"
        _out = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker
    return _out


def log_record(record: Any) -> None:
    """A plain (sync) handler: runs in the consumer's thread pool."""
    t0 = time.monotonic_ns()
    slot, okey = slot_for_record(record.key, record.headers, record.offset)
    time.sleep(0.001)
    line = {
        "p": record.partition,
        "o": record.offset,
        "k": (okey or b"").decode(errors="replace"),
        "s": slot,
        "w": f"pid-{os.getpid()}",
        "m": current_member(),
        "t0": t0,
        "t1": time.monotonic_ns(),
    }
    with _lock:
        _file().write(json.dumps(line) + "\n")
