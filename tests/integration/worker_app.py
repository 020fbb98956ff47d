"""Handlers for `keyshard worker` in the integration tests: each run is one JSON line in
$KEYSHARD_TEST_OUT, in the form `keyshard.local.verify` reads (like the demo worker's)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from typing import Any

from keyshard.core.model.hashing import slot_for_record

_out = None


def _write(record: Any, t0: int) -> None:
    global _out
    if _out is None:
        _out = open(os.environ["KEYSHARD_TEST_OUT"], "a", buffering=1)  # noqa: SIM115
    slot, okey = slot_for_record(record.key, record.headers, record.offset)
    line = {
        "p": record.partition, "o": record.offset, "k": (okey or b"").decode(errors="replace"),
        "s": slot, "w": os.environ.get("KEYSHARD_NAME", socket.gethostname()), "m": "",
        "t0": t0, "t1": time.monotonic_ns(),
    }  # fmt: skip
    _out.write(json.dumps(line) + "\n")


async def handle(record: Any) -> None:
    """Async: 20 ms of "work" per record, so a SIGTERM always finds records in flight."""
    t0 = time.monotonic_ns()
    await asyncio.sleep(0.02)
    _write(record, t0)


def handle_sync(record: Any) -> None:
    """A plain function: the worker runs it in its thread pool."""
    t0 = time.monotonic_ns()
    time.sleep(0.005)
    _write(record, t0)


async def handle_stuck(record: Any) -> None:
    """Never finishes: a drain that only a second signal ends."""
    await asyncio.Event().wait()


not_a_function = 42


_fenced_once = False


async def handle_stuck_until_fenced(record: Any) -> None:
    """Completes nothing until its first cancellation (the member fenced, its lanes
    aborted), then works as `handle`: a handler that hung, in a process that recovers."""
    global _fenced_once
    if not _fenced_once:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            _fenced_once = True
            raise
    await handle(record)
