"""Replaying a grant from held records instead of rewinding the partition.

`ReplayWindow` keeps what the fetcher returned; a grant whose positions lie below the
fetch cursor examines the held records on its own cursor while the partition's cursor
stays where it is. The property: with replays, stops in the middle of one, and acks in
any order, a hand-over still gives the next owner exactly the unacknowledged records.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyshard.consumer_client._datapath.budget import BufferBudget
from keyshard.consumer_client._datapath.progress import ConsumerProgress, Grant
from keyshard.consumer_client._datapath.window import ReplayWindow, ReplayWindows
from keyshard.core.model.positions import Position
from keyshard.core.model.ranges import RangeSet, SlotRange
from tests.consumer_client import parts
from tests.consumer_client.test_progress import (
    TP,
    admit,
    expected_admitted,
    feed,
    fresh_take_over,
    scenarios,
    slots_of,
    start_map,
)


@dataclass
class Rec:
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def chunk(*offsets: int) -> list[Rec]:
    return [Rec(o) for o in offsets]


def offsets(records: list[Rec]) -> list[int]:
    return [r.offset for r in records]


# ---- the window ----------------------------------------------------------------------


def test_window_returns_held_records_between_two_offsets_across_chunks() -> None:
    window = ReplayWindow(start=10, limit=100)
    window.append(chunk(10, 11, 12), 0)
    window.append(chunk(14, 15), 0)  # 13 is a transaction marker: no record
    window.append(chunk(16, 17, 18), 0)
    assert offsets(window.between(11, 17)) == [11, 12, 14, 15, 16]
    assert offsets(window.between(0, 100)) == [10, 11, 12, 14, 15, 16, 17, 18]
    assert window.between(19, 30) == []
    assert window.start == 10  # every record from offset 10 on is held, 9 is not


def test_window_drops_whole_chunks_beyond_its_limit_and_moves_its_start() -> None:
    window = ReplayWindow(start=0, limit=4)
    window.append(chunk(0, 1, 2), 0)
    window.append(chunk(3, 4, 5), 0)
    assert window.start == 0 and window.count == 6  # dropping [0..2] would leave < 4
    window.append(chunk(6, 7), 0)
    assert window.start == 3 and window.count == 5
    assert offsets(window.between(0, 8)) == [3, 4, 5, 6, 7]
    window.append(chunk(9), 0)  # offset 8 does not exist
    assert window.start == 3
    window.append(chunk(10, 11, 12, 13), 0)  # the newest chunk alone holds the limit
    assert window.start == 10 and offsets(window.between(0, 100)) == [10, 11, 12, 13]


def test_window_reset_forgets_what_no_longer_joins_up() -> None:
    window = ReplayWindow(start=0, limit=10)
    window.append(chunk(0, 1, 2), 0)
    window.reset(1)
    assert window.count == 0 and window.start == 1 and window.between(0, 10) == []


def test_a_window_of_zero_holds_nothing() -> None:
    window = ReplayWindow(start=0, limit=0)
    window.append(chunk(0, 1), 0)
    assert window.start == 2 and window.between(0, 10) == []


def test_windows_give_way_to_the_budget_oldest_chunks_of_the_fullest_first() -> None:
    """The windows hold what waiting and in-flight records leave of the memory budget:
    when those grow, the fullest window drops its oldest chunks (its start moves up, so
    what it still holds is contiguous), and nothing more than needed."""
    budget = BufferBudget(1000)
    windows = ReplayWindows(budget, limit=10_000)
    a, b = ("t", 0), ("t", 1)
    windows.seek(a, 0)
    windows.seek(b, 0)
    windows.append(windows[a], chunk(0, 1), 300)
    windows.append(windows[a], chunk(2, 3), 300)
    windows.append(windows[b], chunk(0), 200)
    assert budget.window == 800 and windows[a].start == 0
    budget.waiting = 400  # room for 600 in the windows
    windows.fit()
    assert budget.window == 500 and windows[a].start == 2 and windows[b].start == 0
    assert offsets(windows[a].between(0, 10)) == [2, 3]
    budget.in_flight = 600  # nothing left for them
    windows.fit()
    assert budget.window == 0 and windows[a].start == 4 and windows[b].start == 1
    windows.seek(a, 0)
    windows.pop(b)
    assert budget.window == 0


# ---- grants that replay --------------------------------------------------------------


def replay(p: ConsumerProgress, grant: Grant, log: list[int], upto: int) -> list[int]:
    """Examine held records [replay_cursor, upto) as the consumer's dispatch does."""
    admitted = []
    for o in range(grant.replay_cursor, min(upto, grant.replay_upto, len(log))):
        if grant.admit_replayed(o, log[o]):
            p.partitions[TP].pending[o] = log[o]
            admitted.append(o)
    return admitted


def test_a_grant_below_the_cursor_replays_instead_of_seeking() -> None:
    p = ConsumerProgress()
    log = [o % 8 for o in range(40)]
    g1, g2 = RangeSet.from_pairs([(0, 3)]), RangeSet.from_pairs([(4, 7)])
    p.add_grant(g1, {TP: [(SlotRange(0, 3), Position(10))]})
    first = feed(p, log, 10, 30)
    generation = p.partitions[TP].generation
    seeks = p.add_grant(g2, {TP: [(SlotRange(4, 7), Position(5))]}, {TP: 5})
    assert seeks == {}
    ((tp, grant),) = p.take_replays()
    assert tp == TP and (grant.replay_cursor, grant.replay_upto) == (5, 30)
    assert p.take_replays() == []
    part = p.partitions[TP]
    assert (part.cursor, part.generation) == (30, generation)  # the fetcher did not move
    assert replay(p, grant, log, 30) == [o for o in range(5, 30) if log[o] >= 4]
    grant.finish_replay()
    assert feed(p, log, 30) == list(range(30, 40))
    assert first == [o for o in range(10, 30) if log[o] < 4]


def test_a_grant_below_what_is_held_still_rewinds() -> None:
    p = ConsumerProgress()
    log = [o % 8 for o in range(40)]
    p.add_grant(RangeSet.from_pairs([(0, 3)]), {TP: [(SlotRange(0, 3), Position(10))]})
    feed(p, log, 10, 30)
    seeks = p.add_grant(
        RangeSet.from_pairs([(4, 7)]), {TP: [(SlotRange(4, 7), Position(5))]}, {TP: 6}
    )
    assert seeks == {TP: 5} and p.take_replays() == []


def test_positions_during_a_replay_leave_the_unexamined_part_undone() -> None:
    p = ConsumerProgress()
    log = [4] * 30
    p.add_grant(RangeSet.from_pairs([(0, 3)]), {TP: [(SlotRange(0, 3), Position(0))]})
    feed(p, log, 0, 30)
    g2 = RangeSet.from_pairs([(4, 4)])
    p.add_grant(g2, {TP: [(SlotRange(4, 4), Position(10))]}, {TP: 0})
    ((_, grant),) = p.take_replays()
    assert replay(p, grant, log, 15) == [10, 11, 12, 13, 14]
    for o in (10, 11, 13):
        p.ack(TP, o)
    # examined: [10, 15) minus pending 12, 14; not yet: [15, 30); past the replay: none yet
    assert p.positions(g2)[TP] == [(SlotRange(4, 4), Position(12, ((13, 14),)))]


def test_a_finished_replay_covers_offsets_that_hold_no_record() -> None:
    """Offsets 6 and 8 are transaction markers: the replay never sees them, but once it
    is finished its range is done up to the fetch cursor, so its position moves on."""
    p = ConsumerProgress()
    p.add_grant(RangeSet.from_pairs([(0, 3)]), {TP: [(SlotRange(0, 3), Position(0))]})
    for o in (0, 1, 2, 3, 4, 5, 7, 9):
        admit(p, TP, o, 0)
        p.ack(TP, o)
    g2 = RangeSet.from_pairs([(4, 4)])
    p.add_grant(g2, {TP: [(SlotRange(4, 4), Position(5))]}, {TP: 0})
    ((_, grant),) = p.take_replays()
    for o in (5, 7):
        assert grant.admit_replayed(o, 4)
        p.partitions[TP].pending[o] = 4
        p.ack(TP, o)
    grant.finish_replay()
    assert p.positions(g2)[TP] == [(SlotRange(4, 4), Position(10))]


@settings(max_examples=200, deadline=None)
@given(
    scenarios(),
    scenarios(),
    st.randoms(use_true_random=False),
    st.integers(0, 60),
    st.integers(0, 60),
    st.booleans(),
)
def test_replayed_grants_hand_over_exactly(
    sc1: tuple[list[int], RangeSet, dict[int, Position]],
    sc2: tuple[list[int], RangeSet, dict[int, Position]],
    rng: random.Random,
    fetched: int,
    cut: int,
    stop_midway: bool,
) -> None:
    """Grant 1, read and ack some; grant 2 replays (when below the cursor), maybe part of
    it is stopped midway, the replay finishes, reading goes on; then every range is
    handed over: exactly the unacknowledged records remain, none was dispatched twice."""
    log, g1, start = sc1
    _, g2_raw, start2 = sc2
    g2 = g2_raw - g1
    start.update({s: start2[s] for s in slots_of(g2)})
    a = ConsumerProgress()
    acked: set[int] = set()
    seen: list[int] = []

    def took(got: list[int]) -> None:
        seen.extend(got)
        for o in rng.sample(got, rng.randint(0, len(got))):
            a.ack(TP, o)
            acked.add(o)

    took(feed(a, log, a.add_grant(g1, start_map(g1, start))[TP], min(fetched, len(log))))
    owned = g1
    if g2:
        cursor = a.partitions[TP].cursor
        seeks = a.add_grant(g2, start_map(g2, start), {TP: 0})
        assert seeks == {}, "everything is held: nothing to seek"
        replays = a.take_replays()
        below = min(start[s].next_offset for s in slots_of(g2)) < cursor
        assert len(replays) == int(below)
        for _, grant in replays:
            took(replay(a, grant, log, cut))
            if stop_midway:
                stop = RangeSet.from_pairs(
                    (s, s) for s in rng.sample(slots_of(g2), rng.randint(1, len(g2)))
                )
                a.begin_stop(stop)
                final = a.finish_stop(stop)
                assert fresh_take_over(stop, final, log) == expected_admitted(
                    log, stop, start, acked
                )
                g2 = g2 - stop
            took(replay(a, grant, log, len(log)))
            grant.finish_replay()
        owned = g1 | g2
    took(feed(a, log, a.partitions[TP].cursor))
    assert sorted(seen) == sorted(set(seen)), "a record was dispatched twice"
    final = a.finish_stop(owned)
    assert fresh_take_over(owned, final, log) == expected_admitted(log, owned, start, acked)


@pytest.mark.parametrize("window", [-1, -100])
def test_a_negative_replay_window_is_refused(window: int) -> None:
    from keyshard.consumer_client import CoordinatedConsumer

    with pytest.raises(ValueError, match="replay_window"):
        CoordinatedConsumer(
            group="g",
            topics=["t"],
            coordinator="127.0.0.1:1",
            bootstrap_servers="127.0.0.1:1",
            replay_window=window,
        )


def test_a_replay_is_dispatched_before_records_already_queued() -> None:
    """Fetched records waiting in the backlog all lie at or above the cursor: the replay
    (below it) must go first, or a key of the granted range would run out of order."""
    from keyshard.consumer_client._datapath.chunk import Chunk

    consumer = parts.build()
    consumer.hooks.start_fetcher(
        RangeSet.from_pairs([(0, 3)]), {TP: [(SlotRange(0, 3), Position(0))]}
    )
    window = consumer.fetcher.windows[TP]  # opened by the grant's seek
    window.append(chunk(*range(0, 40)), 0)
    for o in range(30):
        admit(consumer.progress, TP, o, o % 8)
    queued = Chunk(TP, 0, parts.SESSION, chunk(*range(30, 40)))
    consumer.fetcher.backlog.append(queued)
    consumer.hooks.start_fetcher(
        RangeSet.from_pairs([(4, 7)]), {TP: [(SlotRange(4, 7), Position(5))]}
    )
    first, second = consumer.fetcher.backlog
    assert first.replay is not None and offsets(first.records) == list(range(5, 30))
    assert second is queued
    assert consumer.stats.replayed == 25 and consumer.stats.rewinds == 0


def test_a_partition_owned_whole_holds_no_records() -> None:
    """Nobody can hand a consumer part of a partition it owns whole, and held records cost
    GC time on every fetch: the window only starts holding once part of it is elsewhere."""
    from aiokafka import TopicPartition

    consumer = parts.build()

    def fetched(*offsets: int) -> None:
        batch: dict[TopicPartition, list[Any]] = {TopicPartition(*TP): chunk(*offsets)}
        consumer.fetcher.queue_fetched(batch, {TP: 0}, parts.SESSION)

    consumer.hooks.start_fetcher(RangeSet.full(), {TP: [(SlotRange(0, 65535), Position(0))]})
    window = consumer.fetcher.windows[TP]  # opened by the grant's seek
    fetched(*range(10))
    assert window.count == 0 and window.start == 10
    asyncio.run(consumer.hooks.stop_fetcher(RangeSet.from_pairs([(0, 99)])))  # type: ignore[arg-type]
    assert not consumer.progress.partitions[TP].owns_everything
    fetched(*range(10, 20))
    assert window.count == 10 and offsets(window.between(0, 100)) == list(range(10, 20))
