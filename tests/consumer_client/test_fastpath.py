"""The C fast path (consumer_client/_datapath/_fastpath.c) against the Python loop it
shortcuts.

The Python loop (`Dispatcher.dispatch_records`) is the reference: for random
chunks - keys of every shape, ordering headers, offsets below the cursor, grants frozen or
with start maps, busy keys, few permits, handlers that complete, suspend, raise, return a
non-coroutine, or change the grants from inside - both give the same handler calls (with
the cursor each call saw), the same suspensions, lanes, cursor, pending records, load and
counters. No broker: records are aiokafka's `ConsumerRecord`s.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import mmh3
import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.consumer_client._datapath import fastpath
from keyshard.consumer_client._datapath.chunk import Chunk
from keyshard.consumer_client._datapath.lanes import KeyLanes, Suspended, WorkItem, _Lane
from keyshard.consumer_client._datapath.progress import Grant, PartitionProgress, bucket_counts
from keyshard.core.model.hashing import ORDERING_KEY_HEADER, slot_for_key
from keyshard.core.model.positions import Position, RangePositionMap
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.consumer_client import parts

TP = ("t", 0)
NATIVE = fastpath.NATIVE
needs_native = pytest.mark.skipif(NATIVE is None, reason="C fast path not built or disabled")
# Handlers that failed at once get a worker task that `abort` cancels before it starts, so
# their first attempt (`replay_failure`) is never awaited; `collect_garbage` frees them here.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'replay_failure' was never awaited")


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    yield
    gc.collect()  # inside this module's warning filter, not during some later test


KEYS = [f"k{i}".encode() for i in range(8)]
KEY_CHOICES: list[Any] = [*KEYS, None, "str-key"]  # None: unkeyed; str: Python converts
HEADERS: list[Any] = [
    None,
    [],
    (("other", b"x"),),
    ((ORDERING_KEY_HEADER, None),),  # a None value does not count
    ((ORDERING_KEY_HEADER, b"h1"),),
    [("other", b"x"), (ORDERING_KEY_HEADER, b"k3")],
    ((ORDERING_KEY_HEADER, bytearray(b"h2")),),  # bytes(value): Python's conversion
]
# What the handler does with a record (its value): see `Scenario.handler`.
KINDS = [b"ok"] * 6 + [b"suspend", b"raise", b"raise-now", b"future", b"stop", b"grant"]
UNKEYED_SLOTS = SlotRange(0, 255)  # where records without a key land (offset % 65536)


class Scenario:
    """One partition's state and chunk, built identically for each run."""

    def __init__(self, draw: Any) -> None:
        self.cursor = draw(st.integers(0, 30))
        n = draw(st.integers(0, 60))
        self.records = [
            (
                draw(st.integers(0, 120)),
                draw(st.sampled_from(KEY_CHOICES)),
                draw(st.sampled_from(HEADERS)),
                draw(st.sampled_from(KINDS)),
            )
            for _ in range(n)
        ]
        self.split = draw(st.integers(0, n))  # two fetches' chunks
        slots = sorted({slot_for_key(k) for k in [*KEYS, b"h1"]})
        owner = {s: draw(st.integers(-1, 2)) for s in slots}  # -1: nobody
        unkeyed_owner = draw(st.integers(-1, 2))
        self.grants = []
        for g in range(3):
            ranges = [SlotRange(s, s) for s in slots if owner[s] == g]
            if unkeyed_owner == g:
                ranges.append(UNKEYED_SLOTS)
            done = draw(st.lists(st.integers(0, 100), max_size=4))
            position = Position.from_done(
                [(0, draw(st.integers(0, 40)))] + [(o, o + 3) for o in done]
            )
            self.grants.append(
                (
                    RangeSet(ranges),
                    position,
                    draw(st.integers(0, 40)),  # skip_below
                    draw(st.sampled_from([None, None, 20])),  # frozen_upto
                )
            )
        self.busy = draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
        self.max_concurrency = draw(st.integers(len(self.busy) + 1, len(self.busy) + 4))

    def build(self, native: ModuleType | None) -> tuple[parts.Parts, list[Any]]:
        calls: list[Any] = []
        built: list[parts.Parts] = []  # the handler needs the parts it runs in
        consumer = parts.build(
            self.handler(lambda: built[0], calls), max_concurrency=self.max_concurrency
        )
        built.append(consumer)
        consumer.dispatcher.native = native
        lanes = consumer.lanes
        progress = PartitionProgress(TP, cursor=self.cursor)
        grants = []
        for slots, position, skip_below, frozen_upto in self.grants:
            if not slots:
                continue
            start = RangePositionMap()
            start.update([(r, position) for r in slots.ranges])
            grants.append(Grant(slots, start, 0, skip_below, frozen_upto))
        progress.set_grants(grants)
        consumer.progress.partitions[TP] = progress
        for key in self.busy:  # a record of this key is running in a worker
            lanes._lanes[key] = _Lane(running=WorkItem(TP, -1, 0, key, None, 0), scheduled=True)
            lanes._limit.free -= 1
            lanes._busy_workers += 1
        return consumer, calls

    def handler(
        self, consumer: Callable[[], parts.Parts], calls: list[Any]
    ) -> Callable[[Any], Any]:
        async def body(record: Any) -> None:
            if record.value == b"raise":
                raise ValueError(f"failed at {record.offset}")
            if record.value == b"suspend":
                await asyncio.sleep(0)

        def handler(record: Any) -> Any:
            progress = consumer().progress.partitions[TP]
            calls.append((record.offset, progress.cursor))
            kind = record.value
            if kind == b"raise-now":
                raise KeyError(record.offset)
            if kind == b"future":
                future = asyncio.get_running_loop().create_future()
                future.set_result(None)
                return future
            if kind == b"stop":  # a handler that stops everything (as awaiting close() does)
                consumer().progress.begin_stop(RangeSet.full())
            if kind == b"grant":  # a new grant further back: the partition rewinds
                consumer().fetcher.grant(
                    RangeSet([SlotRange(60000, 60010)]),
                    {TP: [(SlotRange(60000, 60010), Position(5))]},
                )
            return body(record)

        return handler

    def chunks(self, session: int) -> list[Chunk]:
        recs = [
            ConsumerRecord("t", 0, off, 0, 0, key, kind, None, 8, 8, headers)
            for off, key, headers, kind in self.records
        ]
        halves = [recs[: self.split], recs[self.split :]]
        return [Chunk(TP, 0, session, p) for p in halves]


def item_state(item: WorkItem | None) -> Any:
    if item is None:
        return None
    return (item.tp, item.offset, item.slot, item.lane_key, item.session)


async def run_scenario(scenario: Scenario, native: ModuleType | None) -> dict[str, Any]:
    consumer, calls = scenario.build(native)
    lanes = consumer.lanes
    backlog = scenario.chunks(parts.SESSION)
    suspensions: list[Suspended] = []
    while backlog:  # as `Fetcher.fetch` does: after a suspension a new fetcher goes on
        suspended = consumer.fetcher.dispatch(backlog)
        if suspended is None:
            break
        suspensions.append(suspended)
    progress = consumer.progress.partitions[TP]
    state = {
        "calls": calls,
        "suspended": [(s.key, item_state(s.item), s.lane.running is s.item) for s in suspensions],
        "cursor": progress.cursor,
        "generation": progress.generation,
        "pending": list(progress.pending.items()),
        "grants": [(g.slots, g.frozen_upto, g.skip_below) for g in progress.grants],
        "load": [(b, n) for b, n in enumerate(consumer.dispatcher.load) if n],
        "demand": [(b, n) for b, n in enumerate(progress.demand) if n],
        "demand_window": (progress.demand_from, progress.demand_upto),
        "stats": consumer.stats.as_dict(),
        "lanes": {
            repr(k): (item_state(lane.running), [item_state(i) for i in lane.queue])
            for k, lane in lanes._lanes.items()
        },
        "ready": [repr(k) for k, _ in lanes._ready],
        "busy_workers": lanes._busy_workers,
        "free": lanes._limit.free,
        "workers": len(lanes._workers),
        "kafka": consumer.fetcher.kafka.calls,
    }
    for s in suspensions:
        s.rest._coro.close()  # type: ignore[attr-defined]
    await lanes.abort()
    return state


@needs_native
@settings(max_examples=400, deadline=None)
@given(st.data())
def test_fast_path_equals_python_loop(data: st.DataObject) -> None:
    scenario = Scenario(data.draw)

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return await run_scenario(scenario, None), await run_scenario(scenario, NATIVE)

    python, native = asyncio.run(both())
    assert native == python


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_murmur3_equals_mmh3(data: bytes) -> None:
    assert NATIVE is not None
    assert NATIVE.hash(data) == mmh3.hash(data, 0, signed=False)


def test_extension_is_built() -> None:
    """CI must exercise the C path: a missing compiler would silently fall back."""
    if os.environ.get("KEYSHARD_ALLOW_NO_FASTPATH"):
        pytest.skip("KEYSHARD_ALLOW_NO_FASTPATH is set")
    import keyshard.consumer_client._datapath._fastpath as native

    assert native.hash(b"") == 0
    if not os.environ.get(fastpath.PURE_PYTHON_ENV):
        assert fastpath.NATIVE is native


@needs_native
def test_the_extension_calls_itself_by_its_import_name() -> None:
    """Its module and its Outcome type, in reprs, tracebacks and pickles."""
    assert NATIVE is not None
    name = "keyshard.consumer_client._datapath._fastpath"
    assert NATIVE.__name__ == name
    assert (NATIVE.Outcome.__module__, NATIVE.Outcome.__qualname__) == (name, "Outcome")


# ---- bad input: the same error as the Python loop -------------------------------------


class Odd:
    """A record without the attributes aiokafka's records have."""

    offset = 1
    headers = None


def plain_consumer(native: ModuleType | None, handler: Any) -> parts.Parts:
    """A consumer owning every slot of TP from offset 0, no broker (`dispatch` only)."""
    consumer = parts.build(handler, max_concurrency=4)
    consumer.dispatcher.native = native
    consumer.progress.partitions[TP] = PartitionProgress(
        TP, grants=[Grant(RangeSet.full(), RangePositionMap(), 0)]
    )
    return consumer


async def noop(_: Any) -> None:
    return None


@needs_native
@pytest.mark.parametrize(
    "record",
    [
        Odd(),  # no .key
        ConsumerRecord("t", 0, None, 0, 0, b"k0", b"ok", None, 1, 1, None),  # offset None
        ConsumerRecord("t", 0, 1, 0, 0, b"k0", b"ok", None, 1, 1, 5),  # headers not a list
        ConsumerRecord("t", 0, 1, 0, 0, b"k0", b"ok", None, 1, 1, [("h",)]),  # not pairs
        ConsumerRecord("t", 0, 1, 0, 0, 42, b"ok", None, 1, 1, None),  # key not bytes
    ],
)
async def test_bad_records_fail_like_the_python_loop(record: Any) -> None:
    async def outcome(native: ModuleType | None) -> Any:
        consumer = plain_consumer(native, noop)
        try:
            consumer.fetcher.dispatch([Chunk(TP, 0, parts.SESSION, [record])])
        except Exception as err:
            return type(err), str(err)
        finally:
            await consumer.lanes.abort()
        return None

    python = await outcome(None)
    assert python is not None
    assert await outcome(NATIVE) == python


@needs_native
async def test_handler_not_callable_is_a_failed_first_attempt_in_both() -> None:
    """Not an error of the loop: like any handler failure it is replayed in a worker."""
    states = []
    for native in (None, NATIVE):
        consumer = plain_consumer(native, "not callable")
        lanes = consumer.lanes
        record = ConsumerRecord("t", 0, 3, 0, 0, b"k0", b"v", None, 1, 1, [])
        assert consumer.fetcher.dispatch([Chunk(TP, 0, parts.SESSION, [record])]) is None
        running = lanes._lanes[b"k0"].running
        states.append((item_state(running), dict(consumer.progress.partitions[TP].pending)))
        await lanes.abort()
    slot = slot_for_key(b"k0")
    assert states[0] == states[1] == ((TP, 3, slot, b"k0", 0), {3: slot})


# ---- reference counts -----------------------------------------------------------------


class Failure(Exception):
    pass


@needs_native
async def test_no_references_leak() -> None:
    """Every record, key, coroutine, yielded value and exception the C loop touches is
    released: records and keys keep their reference counts, the rest is freed (weakrefs
    die) without the cycle collector, over many chunks and every outcome."""
    assert NATIVE is not None
    keys = [f"leak-{i}".encode() for i in range(8)]  # only this test holds them
    recs = [
        ConsumerRecord("t", 0, i, 0, 0, keys[i % 8], b"v", None, 1, 1, [("o", b"x")])
        for i in range(2000)
    ]
    before = [(sys.getrefcount(r), sys.getrefcount(r.key)) for r in recs]
    made: list[weakref.ref[Any]] = []

    def tracked(obj: Any) -> Any:
        made.append(weakref.ref(obj))
        return obj

    class Yielded:
        def __await__(self) -> Any:
            yield self

    async def body(record: Any) -> None:
        if record.offset % 7 == 3:
            raise tracked(Failure(record.offset))  # no local: a frame -> error cycle
        if record.offset % 11 == 5:
            await tracked(Yielded())

    def handler(record: Any) -> Any:
        return tracked(body(record))

    lanes = KeyLanes(handler, max_concurrency=4, on_done=lambda _: None)
    load = bucket_counts()
    for _round in range(50):
        progress = PartitionProgress(TP, grants=[Grant(RangeSet.full(), RangePositionMap(), 0)])
        i = 0
        while i < len(recs):
            lanes._lanes.clear()  # nothing busy: every record goes through the C loop
            grants = progress.grants
            table = fastpath.grant_table(grants)
            out = NATIVE.run(
                recs, i, progress, grants, progress.cursor, table, "h", lanes._lanes, handler,
                load, progress.demand, progress.demand_upto,
            )  # fmt: skip
            status, i = out[0], out[1] + 1
            if status == NATIVE.SUSPENDED:
                out[6].close()
            del out
        assert progress.cursor == len(recs)
    assert sum(load) == 50 * sum(1 for r in recs if r.offset % 7 != 3 and r.offset % 11 != 5)
    assert [(sys.getrefcount(r), sys.getrefcount(r.key)) for r in recs] == before
    assert made and all(ref() is None for ref in made)


# ---- what the rest of the consumer sees -----------------------------------------------


@needs_native
async def test_ping_reply_reports_the_loads_counted_in_c() -> None:
    consumer = plain_consumer(NATIVE, noop)
    recs = [ConsumerRecord("t", 0, i, 0, 0, KEYS[i % 3], b"v", None, 1, 1, ()) for i in range(30)]
    assert consumer.fetcher.dispatch([Chunk(TP, 0, parts.SESSION, recs)]) is None
    by_bucket = consumer.hooks.ping_reply().load
    expected: dict[int, int] = {}
    for key in KEYS[:3]:
        bucket = slot_for_key(key) >> 4
        expected[bucket] = expected.get(bucket, 0) + 10
    assert by_bucket == expected
    stats = consumer.stats
    assert (stats.fetched, stats.admitted, stats.processed) == (0, 30, 30)
    assert not any(consumer.dispatcher.load)  # a fresh buffer after the reply, counted in C
    more = [ConsumerRecord("t", 0, 30 + i, 0, 0, KEYS[0], b"v", None, 1, 1, ()) for i in range(4)]
    assert consumer.fetcher.dispatch([Chunk(TP, 0, parts.SESSION, more)]) is None
    load = consumer.dispatcher.load
    assert sum(load) == load[slot_for_key(KEYS[0]) >> 4] == 4


@needs_native
async def test_a_handler_suspended_in_c_is_finished_by_the_task_that_started_it() -> None:
    """As in `Fetcher._run`: the task whose `dispatch` ran the first step adopts the rest,
    so `current_task()` and `asyncio.timeout` see one task across the handler's awaits."""
    seen: list[tuple[int, asyncio.Task[Any] | None]] = []

    async def handler(record: Any) -> None:
        seen.append((record.offset, asyncio.current_task()))
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
        seen.append((record.offset, asyncio.current_task()))

    consumer = plain_consumer(NATIVE, handler)
    lanes = consumer.lanes
    recs = [ConsumerRecord("t", 0, i, 0, 0, KEYS[i], b"v", None, 1, 1, ()) for i in range(2)]
    backlog = [Chunk(TP, 0, parts.SESSION, recs)]

    tasks: list[asyncio.Task[None]] = []

    async def fetcher() -> None:
        suspended = consumer.fetcher.dispatch(backlog)
        if suspended is not None:
            tasks.append(asyncio.create_task(fetcher()))  # the rest, as `fetch` does
            await lanes.adopt(suspended)

    first = asyncio.create_task(fetcher())
    tasks.append(first)
    while not all(t.done() for t in tasks):
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert len(tasks) == 3  # each record suspended in its own fetcher task
    by_offset: dict[int, set[Any]] = {}
    for offset, task in seen:
        by_offset.setdefault(offset, set()).add(task)
    assert sorted(by_offset) == [0, 1]
    assert by_offset[0] == {first}
    assert len(by_offset[1]) == 1 and first not in by_offset[1]
    assert consumer.stats.processed == 2 and not consumer.progress.partitions[TP].pending


@needs_native
@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({1: -1}, ValueError, "start must be >= 0"),
        ({5: b"123"}, ValueError, "bad table, load or demand buffer size"),
        ({9: bucket_counts()[:10]}, ValueError, "bad table, load or demand buffer size"),
        ({10: bucket_counts()[:10]}, ValueError, "bad table, load or demand buffer size"),
        ({9: bytes(8 * 4096)}, BufferError, "not writable"),
        ({10: bytes(8 * 4096)}, BufferError, "not writable"),
        ({11: "0"}, TypeError, "integer"),
        ({0: ()}, TypeError, "records must be a list"),
        ({6: b"h"}, TypeError, "header a str"),
    ],
)
def test_run_refuses_bad_arguments(change: dict[int, Any], error: type, message: str) -> None:
    assert NATIVE is not None
    args: list[Any] = [
        [],
        0,
        None,
        None,
        0,
        b"",
        "h",
        {},
        noop,
        bucket_counts(),
        bucket_counts(),
        0,
    ]
    for index, value in change.items():
        args[index] = value
    with pytest.raises(error, match=message):
        NATIVE.run(*args)
    with pytest.raises(TypeError, match="exactly 12 arguments"):
        NATIVE.run(*args[:11])
