"""The driver of the C fast path of the consumer's per-record loop.

`_datapath._fastpath.run` (C) handles the common case of a chunk's records - exact
`bytes` keys, grants decided by their table, idle keys, handlers that finish, suspend or
fail at their first step - and stops at any record it does not handle *before* touching
it; `dispatch_chunk` then has the Python loop (the reference implementation,
`_datapath.dispatch.Dispatcher.dispatch_records`, passed in as `slow`) do that one
record and calls C again from the next one. Without the extension (no compiler at
install time) or with `KEYSHARD_PURE_PYTHON=1` in the environment, `NATIVE` is None and
the consumer uses only the Python loop.

What C reads and writes, and nothing else: each record's `offset`, `key` and `headers`
(aiokafka's `ConsumerRecord`), and the partition progress's `cursor` (written before
every handler call) and `grants` (compared by identity after it), typed as
`NativeProgress` in _fastpath.pyi; the lanes' busy keys (membership only), the load
buffer and the partition's demand buffer (incremented in place) with its `demand_upto`.
"""

from __future__ import annotations

import importlib
import logging
import os
from array import array
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from keyshard.consumer_client._datapath import budget
from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.consumer_client._datapath.lanes import KeyLanes, Resume, Suspended, replay_failure
from keyshard.consumer_client._datapath.progress import Grant, PartitionProgress
from keyshard.consumer_client._datapath.stats import ConsumerStats

log = logging.getLogger(__name__)

PURE_PYTHON_ENV = "KEYSHARD_PURE_PYTHON"


def _load_native() -> ModuleType | None:
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        log.debug("%s is set: the consumer uses its Python loop", PURE_PYTHON_ENV)
        return None
    try:
        return importlib.import_module("keyshard.consumer_client._datapath._fastpath")
    except ImportError as err:
        log.debug("no C fast path (%s): the consumer uses its Python loop", err)
        return None


NATIVE = _load_native()

#: The memory budget's `take` (how many fetched records fit), in C when it is built.
take: Callable[[Sequence[Any], int], tuple[int, int, int]] = (
    NATIVE.take if NATIVE is not None else budget.take
)


def grant_table(grants: list[Grant]) -> array[int]:
    """The grants as C's GrantRow quads (start, end, floor, frozen), in `grant_for` order.

    floor = max(skip_below, start_done_below): at or above it `PartitionProgress.accept`
    admits without looking at the start map; below it C leaves the record to Python.
    """
    rows = array("q")
    for grant in grants:
        floor = max(grant.skip_below, grant.start_done_below)
        frozen = int(grant.frozen_upto is not None)
        for r in grant.slots.ranges:
            rows.extend((r.start, r.end, floor, frozen))
    return rows


def dispatch_chunk(
    native: ModuleType,
    chunk: Chunk,
    progress: PartitionProgress,
    lanes: KeyLanes,
    header: str,
    load: array[int],
    stats: ConsumerStats,
    slow: Callable[[Chunk, PartitionProgress, int], Suspended | None],
) -> Suspended | None:
    """`slow(chunk, progress, len(records))`, the same records admitted in the same order
    with the same outcomes, mostly in C.

    `slow(chunk, progress, end)` is the Python loop from `chunk.next` to `end`.
    """
    run, records, tp, session = native.run, chunk.records, chunk.tp, chunk.session
    handler, busy = lanes.handler, lanes.busy_keys
    i, end = chunk.next, len(records)
    grants: list[Grant] | None = None
    table = array("q")
    admitted = processed = 0
    try:
        while i < end:
            if not lanes.can_start_inline():  # stays so for the rest of this dispatch
                chunk.next = i
                return slow(chunk, progress, end)
            if progress.grants is not grants:
                grants = progress.grants
                table = grant_table(grants)
            out = run(
                records, i, progress, grants, progress.cursor, table, header, busy, handler,
                load, progress.demand, progress.demand_upto,
            )  # fmt: skip
            status, i = out.status, out.at
            admitted += out.admitted
            processed += out.processed
            if status == native.DONE:
                break
            if status == native.PYTHON:
                chunk.next = i
                suspended = slow(chunk, progress, i + 1)
                if suspended is not None:
                    return suspended
            elif status != native.CHANGED:  # the handler ran and did not complete
                rest: Any
                if status == native.SUSPENDED:
                    rest = Resume(out.coroutine, out.yielded)
                elif status == native.RAISED:
                    rest = replay_failure(out.error)
                else:  # AWAITABLE
                    rest = out.awaitable
                record = records[i]
                offset = record.offset
                done = lanes.begin(tp, offset, out.slot, out.key, record, session, rest)
                progress.pending[offset] = out.slot
                if done is not False:
                    chunk.next = i + 1
                    return done
            i += 1
        return None
    finally:
        stats.admitted += admitted
        stats.processed += processed
